import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ingestInFreshServer, MB, type Ingested } from './support/ingest.js';
import { tempDir, type ServerProcess } from './support/server.js';

// The memory bound of ingestion, on both stores: the input is read as a stream, a line at a time,
// and inserted one awaited batch of a fixed size after another, and each store's insert of a batch
// (SQLite's statements, PostgreSQL's one statement of arrays with its returned rows) must hold only
// that batch. How each store holds the samples is ingest.test.ts.

const tmp = tempDir('regen-ingest-memory-');
const servers: ServerProcess[] = [];

afterAll(async () => {
  for (const s of servers) await s.kill('SIGKILL');
  tmp.cleanup();
});

describe('ingestion of large inputs', () => {
  let small: Ingested;

  // The baseline, in a hook of its own: each ingestion has the whole timeout on a loaded machine.
  beforeAll(async () => {
    small = await ingestInFreshServer(tmp.dir, 100_000, servers);
  });

  // 150 MB uploaded and 500K lines validated: about 20 s on a quiet machine, minutes on a loaded one.
  it('memory stays flat: the peak RSS for a 500K-line file is within 60 MB of the 100K one', { timeout: 400_000 }, async () => {
    expect(small.run.request_counts.total).toBe(100_000);
    // The first server is done; free its share of the machine before measuring the next.
    await small.server.kill('SIGKILL');
    const big = await ingestInFreshServer(tmp.dir, 500_000, servers);
    expect(big.run.request_counts.total).toBe(500_000);
    expect(big.run.shards.total).toBe(500);
    const growth = big.peak - small.peak;
    // Logged so a regression shows its size, not only that it failed.
    console.info(
      `ingest peak RSS: 100K lines (${(small.bytes / MB).toFixed(0)} MB) → ${(small.peak / MB).toFixed(0)} MB; ` +
        `500K lines (${(big.bytes / MB).toFixed(0)} MB) → ${(big.peak / MB).toFixed(0)} MB`,
    );
    // The file grows by ~110 MB; reading it whole would grow the peak by more than that. The bound
    // leaves room for the garbage collector's timing, which moves the peak by up to ±35 MB between
    // two runs of the same input (seen on Node 24; less on 20).
    expect(big.bytes - small.bytes).toBeGreaterThan(100 * MB);
    expect(growth).toBeLessThan(60 * MB);
  });
});
