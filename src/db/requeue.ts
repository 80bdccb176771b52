import { countFlags } from '../domain/flags.js';
import type { Db } from './client.js';
import { IDS_PER_STATEMENT } from './client.js';
import { uncountRequeued } from './runs.js';
import { addToVariantDelta, moveVariantCounters, newVariantDelta, type VariantDelta } from './run-variants.js';
import { dropTurnsFrom, firstFlaggedTurns } from './sample-turns.js';
import { requeueSamples, samplesToRetry, setSampleTurn } from './samples.js';
import { reopenShards } from './shards.js';
import { deleteStagedOutputs } from './staging.js';

/**
 * Puts a run's failed (or flagged) samples back in the queue with a fresh attempt budget, drops
 * their staged text, reopens their shards and moves the run's counters, in one transaction; the
 * shard writer later rewrites each shard whole. With `endpointId`, only the samples that endpoint
 * answered. Returns how many went back.
 */
export async function requeueRunSamples(db: Db, runId: string, only: 'failed' | 'flagged', now: number, endpointId?: string): Promise<number> {
  return db.tx(async (tx) => {
    const picked = await samplesToRetry(tx, runId, only, endpointId);
    if (picked.length === 0) return 0;
    const perShard = new Map<number, number>();
    for (const s of picked) perShard.set(s.shardIdx, (perShard.get(s.shardIdx) ?? 0) + 1);
    const ids = picked.map((s) => s.id);
    for (let i = 0; i < ids.length; i += IDS_PER_STATEMENT) {
      const chunk = ids.slice(i, i + IDS_PER_STATEMENT);
      await requeueSamples(tx, chunk);
      await deleteStagedOutputs(tx, chunk);
    }
    const turns = await rewindConversations(tx, picked, only);
    const reopenedUploaded = await reopenShards(tx, runId, perShard);
    const n = picked.length;
    await uncountRequeued(tx, runId, { only, n, byFlag: countFlags(picked.map((s) => s.flags)), reopenedUploaded, now, turns });
    // Each variant's counters give back what its samples had counted; their usage stays spent.
    const byVariant = new Map<number, VariantDelta>();
    for (const s of picked) {
      if (s.variant === null) continue;
      let d = byVariant.get(s.variant);
      if (!d) byVariant.set(s.variant, (d = newVariantDelta()));
      addToVariantDelta(d, only === 'failed' ? 'failed' : 'completed', s.flags, null);
    }
    for (const [idx, d] of byVariant) {
      const back = { ...d, completed: -d.completed, failed: -d.failed, flagged: -d.flagged, flags: d.flags.map((x) => -x) };
      await moveVariantCounters(tx, runId, idx, back);
    }
    return n;
  });
}

/**
 * Conversations go back to their first failed or flagged turn: the turns before it are kept, it
 * and the ones after are asked again. Returns the turns uncounted: answered ones dropped (and the
 * tool-call steps among them), failed ones.
 */
async function rewindConversations(
  tx: Db,
  picked: readonly { id: number; turn: number | null }[],
  only: 'failed' | 'flagged',
): Promise<{ completed: number; failed: number; toolSteps: number }> {
  const conversations = picked.filter((s): s is { id: number; turn: number } => s.turn !== null);
  const counted = { completed: 0, failed: 0, toolSteps: 0 };
  if (!conversations.length) return counted;
  const flagged =
    only === 'flagged'
      ? await firstFlaggedTurns(
          tx,
          conversations.map((s) => s.id),
        )
      : null;
  for (const s of conversations) {
    const from = flagged ? (flagged.get(s.id) ?? 0) : s.turn;
    const dropped = await dropTurnsFrom(tx, s.id, from);
    counted.completed += dropped.requests;
    counted.toolSteps += dropped.toolSteps;
    if (!flagged) counted.failed++;
    if (from !== s.turn) await setSampleTurn(tx, s.id, from);
  }
  return counted;
}
