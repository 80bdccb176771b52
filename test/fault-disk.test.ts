import { execFileSync } from 'node:child_process';
import { closeSync, openSync, rmSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { faultRig, waitForRun } from './support/fault-rig.js';
import { createRun, makePrompts, uploadFile } from './support/runner-checks.js';

// The disk fills while a run validates: the run waits, says why, and validates once space is back.
// A real full disk: the data folder on a small tmpfs. SQLite only, since only its database lives in
// the data folder; PostgreSQL's disk is the server's own.

const rig = faultRig();
const TMPFS_BYTES = 24 << 20;

function mountTmpfs(dir: string): boolean {
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${TMPFS_BYTES}`, 'tmpfs', dir], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

/** Writes `path` until the disk refuses, then frees `leave` bytes of it. */
function fill(path: string, leave: number): void {
  const fd = openSync(path, 'w');
  const chunk = Buffer.alloc(64 << 10, 1);
  let written = 0;
  try {
    for (;;) written += writeSync(fd, chunk);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOSPC') throw err;
  } finally {
    closeSync(fd);
  }
  execFileSync('truncate', ['-s', String(Math.max(0, written - leave)), path]);
}

describe.skipIf(process.env.REGEN_TEST_STORE === 'pg')('a full disk', () => {
  it('a validation that meets a full disk waits, says so on the run, and completes once space is back', async (ctx) => {
    const data = rig.dir('regen-fulldisk-');
    if (!mountTmpfs(data)) ctx.skip();
    let server: Awaited<ReturnType<typeof rig.serve>> | undefined;
    try {
      server = await rig.serve(data, { REGEN_STORE_RETRY_MS: '100' });
      const SAMPLES = 20_000;
      const fileId = await uploadFile(server.url, makePrompts(SAMPLES, 'full').jsonl);
      const filler = join(data, 'filler');
      // Room for the run's row, not for its 20,000 samples.
      fill(filler, 256 << 10);
      const run = await createRun(server.url, { model: 'm', input: { file_id: fileId } });
      const waiting = await waitForRun(server.url, run.id, 'the reason of a validation that waits for space', (r) =>
        /waits for disk space \((SQLITE_FULL|ENOSPC)\)/.test(r.status_reason ?? ''),
      );
      expect(waiting.status).toBe('validating');
      rmSync(filler);
      const queued = await waitForRun(server.url, run.id, 'the run validated', (r) => r.status !== 'validating', 120_000);
      expect(queued.status).toBe('queued');
      expect(queued.request_counts.total).toBe(SAMPLES);
      expect(queued.status_reason ?? '').not.toMatch(/disk space/);
      expect(server.output()).not.toMatch(/ingest crashed/);
    } finally {
      await server?.kill('SIGKILL');
      execFileSync('umount', ['-l', data], { stdio: 'ignore' });
    }
  });
});
