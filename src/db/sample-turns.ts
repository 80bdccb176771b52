import { and, asc, eq, gte, inArray, sql } from 'drizzle-orm';
import type { TurnRecord } from '../domain/conversation.js';
import type { ToolCall } from '../domain/tools.js';
import type { TurnIds } from '../domain/token-rows.js';
import type { DbOrTx } from './client.js';
import { IDS_PER_STATEMENT } from './client.js';
import type { SampleTurnRow } from './schema.js';

// A conversation's answered requests, turns and tool-call steps (`regenerate: "all_assistant"`). The result writer inserts them
// (db/results.ts); the claim reads them back as the next turn's history.

function record(r: SampleTurnRow): TurnRecord {
  return {
    idx: r.idx,
    step: r.step,
    content: r.content,
    reasoningContent: r.reasoningContent,
    toolCalls: r.toolCalls === null ? null : (JSON.parse(r.toolCalls) as ToolCall[]),
    finishReason: r.finishReason,
    usage: { prompt_tokens: r.promptTokens, completion_tokens: r.completionTokens, reasoning_tokens: r.reasoningTokens, cached_tokens: r.cachedTokens },
    endpointId: r.endpointId,
    latencyMs: r.latencyMs,
    attempts: r.attempts,
    flags: r.flags,
    ...(r.tokenIds !== null && { ids: JSON.parse(r.tokenIds) as TurnIds }),
  };
}

// Ids per statement: an `in (...)` list binds one value per id, and SQLite caps bound values.

/** The answered turns of each sample, in order, before the turn each is at. */
export async function turnsBefore(db: DbOrTx, samples: readonly { id: number; turn: number }[]): Promise<Map<number, TurnRecord[]>> {
  const { sampleTurns } = db.t;
  const upTo = new Map(samples.map((s) => [s.id, s.turn]));
  const out = new Map<number, TurnRecord[]>();
  const ids = [...upTo.keys()];
  for (let i = 0; i < ids.length; i += IDS_PER_STATEMENT) {
    const rows = await db.q
      .select()
      .from(sampleTurns)
      .where(inArray(sampleTurns.sampleId, ids.slice(i, i + IDS_PER_STATEMENT)))
      .orderBy(asc(sampleTurns.sampleId), asc(sampleTurns.idx));
    for (const r of rows) {
      if (r.idx >= (upTo.get(r.sampleId) ?? 0)) continue;
      let list = out.get(r.sampleId);
      if (!list) out.set(r.sampleId, (list = []));
      list.push(record(r));
    }
  }
  return out;
}

/** A sample's answered turns, in order. */
export async function listTurns(db: DbOrTx, sampleId: number): Promise<TurnRecord[]> {
  const { sampleTurns } = db.t;
  const rows = await db.q.select().from(sampleTurns).where(eq(sampleTurns.sampleId, sampleId)).orderBy(asc(sampleTurns.idx));
  return rows.map(record);
}

/** The first flagged turn of each sample that has one. */
export async function firstFlaggedTurns(db: DbOrTx, sampleIds: readonly number[]): Promise<Map<number, number>> {
  const out = new Map<number, number>();
  for (let i = 0; i < sampleIds.length; i += IDS_PER_STATEMENT) {
    const { rows } = await db.exec<{ sample_id: number | string; idx: number }>(
      `select sample_id, min(idx) as idx from sample_turns where sample_id in (${sampleIds
        .slice(i, i + IDS_PER_STATEMENT)
        .map(() => '?')
        .join(', ')}) and flags <> 0 group by sample_id`,
      sampleIds.slice(i, i + IDS_PER_STATEMENT),
    );
    for (const r of rows) out.set(Number(r.sample_id), r.idx);
  }
  return out;
}

/** How many requests of each of these samples are answered (those with none are left out). */
export async function answeredTurnCounts(db: DbOrTx, sampleIds: readonly number[]): Promise<Map<number, number>> {
  const out = new Map<number, number>();
  for (let i = 0; i < sampleIds.length; i += IDS_PER_STATEMENT) {
    const ids = sampleIds.slice(i, i + IDS_PER_STATEMENT);
    const { rows } = await db.exec<{ sample_id: number | string; n: number | string }>(
      `select sample_id, count(*) as n from sample_turns where sample_id in (${ids.map(() => '?').join(', ')}) group by sample_id`,
      ids,
    );
    for (const r of rows) out.set(Number(r.sample_id), Number(r.n));
  }
  return out;
}

/** Drops a sample's turns from `from` on: they are to be asked again. Returns how many, and how many of them were tool-call steps. */
export async function dropTurnsFrom(db: DbOrTx, sampleId: number, from: number): Promise<{ requests: number; toolSteps: number }> {
  const { sampleTurns } = db.t;
  const gone = await db.write((w) =>
    w.q
      .delete(sampleTurns)
      .where(and(eq(sampleTurns.sampleId, sampleId), gte(sampleTurns.idx, from)))
      .returning({ step: sql<number>`case when ${sampleTurns.toolCalls} is null then 0 else 1 end` }),
  );
  return { requests: gone.length, toolSteps: gone.filter((r) => Number(r.step) === 1).length };
}
