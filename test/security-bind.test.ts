import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { afterAll, describe, expect, it } from 'vitest';
import { call, REGEN, spawnServer, tempDir, type ServerProcess } from './support/server.js';

// Where `regen serve` agrees to listen, on one store (vitest.config.ts, storeless): the refusal
// is the configuration's, checked before any store is opened, and the token check that makes a
// public address safe reads no table. The tokens on every route, on both stores, are security.test.ts.

const servers: ServerProcess[] = [];
const dirs: { cleanup(): void }[] = [];

afterAll(async () => {
  for (const s of servers) await s.kill('SIGKILL');
  for (const d of dirs) d.cleanup();
});

function dir(prefix: string): string {
  const d = tempDir(prefix);
  dirs.push(d);
  return d.dir;
}

describe('bearer tokens', () => {
  it('refuses to listen on 0.0.0.0 without tokens, with a clear message, unless REGEN_ALLOW_PUBLIC_BIND=true', async () => {
    const data = dir('regen-bind-');
    const env = { ...process.env };
    delete env.REGEN_API_TOKENS;
    delete env.REGEN_ALLOW_PUBLIC_BIND;
    const proc = spawn(process.execPath, [...REGEN, 'serve', '--port', '0', '--host', '0.0.0.0', '--data', data], {
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let err = '';
    proc.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    const [code] = await once(proc, 'exit');
    expect(code).toBe(2);
    expect(err).toContain('refusing to listen on 0.0.0.0 without REGEN_API_TOKENS');
    expect(err).toContain('REGEN_ALLOW_PUBLIC_BIND=true');
    expect(err).not.toMatch(/\n\s+at /);

    const open = await spawnServer(data, { REGEN_HOST: '0.0.0.0', REGEN_ALLOW_PUBLIC_BIND: 'true' });
    servers.push(open);
    expect((await call(open.url.replace('0.0.0.0', '127.0.0.1'), '/healthz')).status).toBe(200);
    await open.kill('SIGTERM');
    const tokened = await spawnServer(data, { REGEN_HOST: '0.0.0.0', REGEN_API_TOKENS: 'tok-x' });
    servers.push(tokened);
    expect((await call(tokened.url.replace('0.0.0.0', '127.0.0.1'), '/v1/runs')).status).toBe(401);
    await tokened.kill('SIGTERM');
  });
});
