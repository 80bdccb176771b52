import { cpSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { builtEntry, sourcesOf } from '../bin/sources.js';
import { call, spawnServer, tempDir, type ServerProcess } from './support/server.js';

// Which code `regen` runs (bin/regen.js): the build `npm ci` made in dist/ (scripts/build.js) while
// it is that of the sources as they are, else the TypeScript through tsx. One store (vitest.config.ts,
// storeless): the choice is made before any store opens.

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const dirs: { cleanup(): void }[] = [];
const servers: ServerProcess[] = [];

afterAll(async () => {
  for (const s of servers) await s.kill('SIGKILL');
  for (const d of dirs) d.cleanup();
});

function dir(): string {
  const d = tempDir('regen-entry-');
  dirs.push(d);
  return d.dir;
}

describe('bin/regen.js', () => {
  it('runs the build while its stamp is that of the sources, and the sources after a change, a move, or a build cut short', () => {
    const root = join(dir(), 'project');
    mkdirSync(join(root, 'src', 'cli'), { recursive: true });
    mkdirSync(join(root, 'scripts'));
    const source = join(root, 'src', 'cli', 'main.ts');
    writeFileSync(source, 'one');
    writeFileSync(join(root, 'package-lock.json'), '{}');
    writeFileSync(join(root, 'scripts', 'build.js'), '');
    const entry = join(root, 'dist', 'b1', 'bundle', 'cli', 'main.js');
    expect(builtEntry(root, {}), 'no build').toBeNull();
    mkdirSync(join(root, 'dist'));
    expect(builtEntry(root, {}), 'a build with no stamp (cut short)').toBeNull();
    writeFileSync(join(root, 'dist', 'stamp.json'), JSON.stringify({ ...sourcesOf(root), build: 'b1' }));
    expect(builtEntry(root, {}), 'a stamp whose build is not there').toBeNull();
    mkdirSync(join(entry, '..'), { recursive: true });
    writeFileSync(entry, '');
    expect(builtEntry(root, {})).toBe(entry);
    expect(builtEntry(root, { REGEN_RUN_SOURCES: '1' }), 'asked for the sources').toBeNull();

    writeFileSync(source, 'two');
    expect(builtEntry(root, {}), 'a source changed').toBeNull();
    // Its content decides, not its time: the same text again is the build's again.
    writeFileSync(source, 'one');
    expect(builtEntry(root, {})).toBe(entry);
    const added = join(root, 'src', 'added.ts');
    writeFileSync(added, '');
    expect(builtEntry(root, {}), 'a source added').toBeNull();
    rmSync(added);
    writeFileSync(join(root, 'package-lock.json'), '{"lockfileVersion":3}');
    expect(builtEntry(root, {}), 'the packages bundled changed').toBeNull();
    writeFileSync(join(root, 'package-lock.json'), '{}');
    expect(builtEntry(root, {})).toBe(entry);
    writeFileSync(join(root, 'scripts', 'build.js'), '// another recipe');
    expect(builtEntry(root, {}), 'the recipe changed').toBeNull();
    writeFileSync(join(root, 'scripts', 'build.js'), '');
    expect(builtEntry(root, {})).toBe(entry);

    // The build's modules know their folder by its path: a copy elsewhere runs its sources.
    const moved = join(root, '..', 'moved');
    cpSync(root, moved, { recursive: true });
    expect(builtEntry(moved, {}), 'the folder moved').toBeNull();
  });

  it('serves from the build npm ci made, and from the sources through tsx when asked', async () => {
    const fresh = builtEntry(ROOT, {}) !== null;
    if (!fresh) {
      // npm ci builds it (the `prepare` script): on CI a missing or stale build is a failure.
      if (process.env.CI === 'true') throw new Error('dist/ is missing or not the build of these sources: npm ci (or npm run build) makes it');
      console.warn('\n*** dist/ is missing or older than the sources (npm run build makes it): bin/regen.js runs them through tsx, both ways ***\n');
    }
    for (const [env, compiled] of [
      [{}, fresh],
      [{ REGEN_RUN_SOURCES: '1' }, false],
    ] as const) {
      const data = dir();
      const server = await spawnServer(data, env, [join(ROOT, 'bin', 'regen.js')]);
      servers.push(server);
      const listening = server
        .output()
        .split('\n')
        .map((line) => {
          try {
            return JSON.parse(line) as { msg?: string; compiled?: boolean };
          } catch {
            return {};
          }
        })
        .find((line) => line.msg === 'regen listening');
      expect(listening?.compiled, JSON.stringify(env)).toBe(compiled);
      expect((await call(server.url, '/v1/endpoints')).status).toBe(200);
      expect(await server.kill('SIGTERM')).toBe(0);
    }
  });
});
