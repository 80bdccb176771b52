import { createHash } from 'node:crypto';
import { expect } from 'vitest';
import type { ObjectStore } from '../../src/storage/index.js';
import { call, waitFor } from './server.js';
import { openTestStore } from './store.js';

type Message = { role: string; content: string };

/** What the simulator puts after `Answer `: the first 16 hex of sha256 over the messages as sent. */
export const digestOf = (messages: unknown[]): string => createHash('sha256').update(JSON.stringify(messages)).digest('hex').slice(0, 16);

/**
 * An endpoint whose server died keeps its last error: a request's connection failing
 * (classifyError in src/runner/request.ts), or a health probe refused since, with or without the
 * count of probes in a row (src/runner/endpoints.ts).
 */
export const DEAD_ENDPOINT_ERROR = /^(the connection to the endpoint failed|connection refused( \(\d+ of \d+ probes in a row\))?)$/;

const sha256 = (b: Buffer) => createHash('sha256').update(b).digest('hex');

export interface Prompts {
  /** The input file, one JSON object a line. */
  jsonl: string;
  /** custom_id → the messages the runner must send (a trailing assistant turn already dropped). */
  expected: Map<string, Message[]>;
}

/**
 * `n` prompts in every input format, each one different, a third of them ending in an assistant
 * turn that `regenerate: "last_assistant"` must drop before sending.
 */
export function makePrompts(n: number, tag = 'p'): Prompts {
  const lines: string[] = [];
  const expected = new Map<string, Message[]>();
  for (let i = 0; i < n; i++) {
    const id = `${tag}-${i}`;
    const question = `Question ${i} of ${tag}: how many ways are there to pick ${i % 17} items from ${(i % 31) + 20}?`;
    const sent: Message[] =
      i % 5 === 0
        ? [
            { role: 'system', content: 'Think step by step.' },
            { role: 'user', content: question },
          ]
        : [{ role: 'user', content: question }];
    const withOld = i % 3 === 0 ? [...sent, { role: 'assistant', content: 'OK.' }] : sent;
    switch (i % 4) {
      case 0:
        lines.push(JSON.stringify({ custom_id: id, messages: withOld }));
        break;
      case 1:
        lines.push(JSON.stringify({ custom_id: id, method: 'POST', url: '/v1/chat/completions', body: { messages: withOld } }));
        break;
      case 2:
        lines.push(
          JSON.stringify({
            id,
            conversations: withOld.map((m) => ({ from: { system: 'system', user: 'human', assistant: 'gpt' }[m.role], value: m.content })),
          }),
        );
        break;
      default:
        // A plain prompt is one user turn: nothing to drop.
        lines.push(JSON.stringify({ id, prompt: question }));
        expected.set(id, [{ role: 'user', content: question }]);
        continue;
    }
    expected.set(id, sent);
  }
  return { jsonl: lines.join('\n') + '\n', expected };
}

/** Uploads a JSONL body as a file and returns its id. */
export async function uploadFile(base: string, jsonl: string, filename = 'prompts.jsonl'): Promise<string> {
  const res = await call(base, `/v1/files?filename=${filename}`, { method: 'POST', body: jsonl, headers: { 'content-type': 'application/jsonl' } });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body.id as string;
}

export async function registerEndpoint(base: string, url: string, extra: Record<string, unknown> = {}): Promise<any> {
  const res = await call(base, '/v1/endpoints', { method: 'POST', json: { url, ...extra } });
  expect([200, 201], JSON.stringify(res.body)).toContain(res.status);
  return res.body;
}

export async function createRun(base: string, body: Record<string, unknown>): Promise<any> {
  const res = await call(base, '/v1/runs', { method: 'POST', json: body });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  return res.body;
}

export async function getRun(base: string, id: string): Promise<any> {
  const res = await call(base, `/v1/runs/${id}`);
  expect(res.status).toBe(200);
  return res.body;
}

/** Waits until the run reaches one of `statuses` (or fails the test with where it got stuck). */
export async function waitForStatus(base: string, id: string, statuses: string[], ms = 90_000): Promise<any> {
  let last: any;
  try {
    return await waitFor(
      `run ${id} to become ${statuses.join('|')}`,
      async () => {
        last = (await call(base, `/v1/runs/${id}`)).body;
        return statuses.includes(last.status) ? last : undefined;
      },
      ms,
      200,
    );
  } catch (err) {
    throw new Error(`${(err as Error).message}; last seen: ${JSON.stringify({ status: last?.status, counts: last?.request_counts, shards: last?.shards })}`);
  }
}

/** Creates a run and waits for it to end; the test fails unless it completed. */
export async function completedRun(base: string, body: Record<string, unknown>): Promise<any> {
  const created = await createRun(base, body);
  const done = await waitForStatus(base, created.id, ['completed', 'failed', 'paused', 'cancelled']);
  expect(done.status, JSON.stringify(done.status_reason)).toBe('completed');
  return done;
}

/** A run's manifest and every file it lists, by key, each checked against the size and sha256 the manifest gives. */
export async function readManifestFiles(store: ObjectStore): Promise<{ manifest: any; files: Map<string, Buffer> }> {
  const manifest = JSON.parse((await store.get('manifest.json')).toString('utf8'));
  const files = new Map<string, Buffer>();
  for (const f of manifest.files) {
    const bytes = await store.get(f.key);
    expect(bytes.length, f.key).toBe(f.bytes);
    expect(createHash('sha256').update(bytes).digest('hex'), f.key).toBe(f.sha256);
    files.set(f.key, bytes);
  }
  return { manifest, files };
}

/** Every sample of a run through the API, page by page. */
export async function listAllSamples(base: string, id: string): Promise<any[]> {
  const all: any[] = [];
  let after: string | null = null;
  for (;;) {
    const q: string = after ? `&after=${encodeURIComponent(after)}` : '';
    const res = await call(base, `/v1/runs/${id}/samples?limit=1000${q}`);
    expect(res.status).toBe(200);
    all.push(...res.body.data);
    if (!res.body.has_more) return all;
    after = res.body.last_id;
  }
}

/** The run's counters must equal a recount of its samples by status. */
export async function expectCountersMatchRecount(base: string, run: any): Promise<any[]> {
  const all = await listAllSamples(base, run.id);
  const by = (s: string) => all.filter((x) => x.status === s).length;
  expect(run.request_counts).toEqual({
    total: all.length,
    pending: by('pending'),
    in_progress: by('in_progress'),
    completed: by('completed'),
    failed: by('failed'),
    cancelled: by('cancelled'),
  });
  return all;
}

export interface OutputCheck {
  manifest: any;
  /** custom_id → the parsed output line. */
  lines: Map<string, any>;
  /** custom_id → the parsed error line. */
  errors: Map<string, any>;
}

/**
 * Reads manifest.json and every shard it lists from the run's output store and checks them:
 * sizes, line counts and sha256 as the manifest says, no custom_id twice across all shards, each
 * output line answering its own prompt (the simulator's digest of the messages sent) and carrying
 * those messages, lines in input order.
 */
export async function checkOutput(store: ObjectStore, expected: Map<string, Message[]>): Promise<OutputCheck> {
  const manifest = JSON.parse((await store.get('manifest.json')).toString('utf8'));
  const lines = new Map<string, any>();
  const errors = new Map<string, any>();
  const position = new Map([...expected.keys()].map((id, i) => [id, i]));
  for (const shard of manifest.shards) {
    // A shard with no completed line has no object.
    expect(shard.key).toBe(shard.empty ? null : `shard-${String(shard.index).padStart(5, '0')}.jsonl`);
    if (shard.empty) expect(await store.head(`shard-${String(shard.index).padStart(5, '0')}.jsonl`)).toBeNull();
    const body = shard.key ? await store.get(shard.key) : Buffer.alloc(0);
    expect(body.length, `bytes of ${shard.key}`).toBe(shard.bytes);
    if (shard.key) expect(sha256(body), `sha256 of ${shard.key}`).toBe(shard.sha256);
    const text = body.toString('utf8');
    const parsed =
      text === ''
        ? []
        : text
            .trimEnd()
            .split('\n')
            .map((l) => JSON.parse(l));
    expect(parsed.length, `lines of ${shard.key}`).toBe(shard.lines);
    let prev = -1;
    for (const line of parsed) {
      expect(lines.has(line.custom_id), `${line.custom_id} written twice`).toBe(false);
      const messages = expected.get(line.custom_id);
      expect(messages, `unknown custom_id ${line.custom_id}`).toBeDefined();
      expect(line.messages).toEqual(messages);
      expect(line.content.startsWith(`Answer ${digestOf(messages!)}`), `${line.custom_id} got ${line.content.slice(0, 40)}`).toBe(true);
      const at = position.get(line.custom_id)!;
      expect(at, `${shard.key} out of input order`).toBeGreaterThan(prev);
      prev = at;
      lines.set(line.custom_id, line);
    }
    if (shard.errors_key) {
      const eb = await store.get(shard.errors_key);
      expect(eb.length).toBe(shard.errors_bytes);
      expect(sha256(eb)).toBe(shard.errors_sha256);
      for (const l of eb
        .toString('utf8')
        .trimEnd()
        .split('\n')
        .map((x) => JSON.parse(x))) {
        expect(lines.has(l.custom_id) || errors.has(l.custom_id), `${l.custom_id} written twice`).toBe(false);
        errors.set(l.custom_id, l);
      }
    } else {
      expect(await store.head(`shard-${String(shard.index).padStart(5, '0')}.errors.jsonl`)).toBeNull();
    }
  }
  return { manifest, lines, errors };
}

/**
 * Opens a stopped server's database and checks what must hold after any crash: the run's counters
 * equal its samples by status, each shard's terminal count equals its terminal samples, uploaded
 * shards are counted, completed samples of open shards have their text staged and those of uploaded
 * shards point at their line. Returns the samples by status.
 */
export async function checkDatabase(dataDir: string, runId: string): Promise<Record<string, number>> {
  const db = await openTestStore(dataDir);
  try {
    const byStatus: Record<string, number> = { pending: 0, in_progress: 0, completed: 0, failed: 0, cancelled: 0 };
    const counts = await db.exec<{ status: string; n: number }>(`select status, count(*) as n from samples where run_id = ? group by status`, [runId]);
    for (const r of counts.rows) byStatus[r.status] = Number(r.n);
    const [run] = (
      await db.exec<Record<string, number>>(`select pending, in_progress, completed, failed, cancelled, shards_uploaded from runs where id = ?`, [runId])
    ).rows;
    expect({ ...run, shards_uploaded: undefined }).toEqual({ ...byStatus, shards_uploaded: undefined });
    const { rows: shards } = await db.exec<{
      idx: number;
      status: string;
      terminal_count: number;
      terminal: number;
      lost: number;
      unplaced: number;
      staged: number;
    }>(
      `select sh.idx, sh.status, sh.terminal_count,
         (select count(*) from samples s where s.run_id = sh.run_id and s.shard_idx = sh.idx and s.status in ('completed', 'failed', 'cancelled')) as terminal,
         (select count(*) from samples s where s.run_id = sh.run_id and s.shard_idx = sh.idx and s.status = 'completed'
            and s.output_line is null and not exists (select 1 from staging st where st.sample_id = s.id)) as lost,
         (select count(*) from samples s where s.run_id = sh.run_id and s.shard_idx = sh.idx and s.status = 'completed' and s.output_line is null) as unplaced,
         (select count(*) from staging st where st.run_id = sh.run_id and st.shard_idx = sh.idx) as staged
       from shards sh where sh.run_id = ? order by sh.idx`,
      [runId],
    );
    for (const s of shards) {
      expect(s.terminal_count, `terminal count of shard ${s.idx}`).toBe(s.terminal);
      if (s.status === 'uploaded') expect([s.staged, s.unplaced], `staged and unplaced lines of uploaded shard ${s.idx}`).toEqual([0, 0]);
      // An open shard holds each completion in staging, or in the line an earlier upload of it wrote.
      else expect(s.lost, `completions of shard ${s.idx} found nowhere`).toBe(0);
    }
    expect(run.shards_uploaded).toBe(shards.filter((s) => s.status === 'uploaded').length);
    return byStatus;
  } finally {
    await db.close();
  }
}
