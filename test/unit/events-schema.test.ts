import { expect, it } from 'vitest';
import { ShardUploadedEvent } from '../../src/routes/runs/events.js';

it('a shard_uploaded event of an empty shard (no file, key null) fits its published schema', () => {
  const event = { run_id: 'run_a', shard: 3, key: null, lines: 0, errors: 0, at: '2026-01-01T00:00:00.000Z' };
  expect(ShardUploadedEvent.safeParse(event).success).toBe(true);
});
