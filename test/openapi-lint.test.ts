import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);
const root = fileURLToPath(new URL('..', import.meta.url));
const CLI = fileURLToPath(new URL('../node_modules/@redocly/cli/bin/cli.js', import.meta.url));

// Redocly's recommended ruleset on the checked-in document: what code generators and linters of
// other team services will meet. Exceptions live in .redocly.lint-ignore.yaml, each with its reason.
describe('openapi.yaml under Redocly lint', () => {
  it('has no error and no warning', async () => {
    const { stdout } = await run(process.execPath, [CLI, 'lint', 'openapi.yaml', '--format=json'], {
      cwd: root,
      env: { ...process.env, REDOCLY_TELEMETRY: 'off', REDOCLY_SUPPRESS_UPDATE_NOTICE: 'true' },
      maxBuffer: 1 << 24,
      timeout: 60_000,
    });
    const report = JSON.parse(stdout) as { totals: { errors: number; warnings: number; ignored: number }; problems: { ruleId: string; message: string }[] };
    expect(report.problems.map((p) => `${p.ruleId}: ${p.message}`)).toEqual([]);
    expect(report.totals).toMatchObject({ errors: 0, warnings: 0 });
    // The ignore file is read: its entries are the only exceptions.
    expect(report.totals.ignored).toBe(6);
  });

  it('gives every operation a stable operationId of its own', async () => {
    const { parse } = await import('yaml');
    const { readFileSync } = await import('node:fs');
    const doc = parse(readFileSync(new URL('../openapi.yaml', import.meta.url), 'utf8')) as { paths: Record<string, Record<string, { operationId?: string }>> };
    const ids = Object.values(doc.paths).flatMap((item) => Object.values(item).map((op) => op.operationId));
    expect(ids.length).toBeGreaterThan(25);
    expect(ids.every((id) => typeof id === 'string' && /^[a-z][a-zA-Z]+$/.test(id))).toBe(true);
    expect(new Set(ids).size).toBe(ids.length);
  });
});
