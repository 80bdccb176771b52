import { existsSync, readFileSync } from 'node:fs';
import { createServer, type Server as HttpServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDb } from '../src/db/client.js';
import { getEndpoint } from '../src/db/endpoints.js';
import { checkStoredSecrets } from '../src/db/secrets.js';
import { runWebhookSecret } from '../src/db/webhooks.js';
import { call, spawnServer, startTestServer, tempDir, waitFor } from './support/server.js';
import { onPg, storeEnv } from './support/store.js';

// Endpoint api_keys and webhook secrets at rest: sealed under REGEN_SECRET_KEY on both stores, the
// ones stored in plain text before the key was set sealed on start, and a missing or wrong key
// refused at start rather than at each use.

const KEY = Buffer.alloc(32, 7).toString('base64');
const OTHER_KEY = Buffer.alloc(32, 9).toString('base64');
const API_KEY = 'sk-endpoint-plaintext-0123456789';
const NEW_API_KEY = 'sk-endpoint-later-9876543210';
const WEBHOOK_SECRET = `whsec_${Buffer.alloc(32, 3).toString('base64')}`;

const tmp = tempDir('regen-secrets-');
const serveTmp = tempDir('regen-secrets-serve-');
const rolledTmp = tempDir('regen-secrets-rolled-');
let receiver: HttpServer;
let hookUrl: string;

beforeAll(async () => {
  // Answers every event 200: only the stored secret matters here.
  receiver = createServer((_, res) => res.end());
  await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve));
  hookUrl = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`;
});
afterAll(async () => {
  await new Promise((resolve) => receiver?.close(resolve));
  for (const t of [tmp, serveTmp, rolledTmp]) t.cleanup();
});

async function storeTarget(dir = tmp.dir): Promise<string> {
  return (await storeEnv(dir)).REGEN_DATABASE_URL ?? join(dir, 'regen.db');
}

/** What a replica restarted with `key` does to the store on its start: seals the secrets stored in plain text. */
async function sealAsAnotherReplica(dir: string, key: string): Promise<void> {
  const db = await openDb(await storeTarget(dir), { secretKey: key });
  try {
    await checkStoredSecrets(db);
  } finally {
    await db.close();
  }
}

/** The one line `regen serve` ends with when the key does not open the store's secrets (README "Secrets at rest"). */
const NO_KEY_LINE = 'regen: a stored secret is sealed, and REGEN_SECRET_KEY is not set';
/** The lines `regen` itself wrote to stderr, apart from its JSON log. */
const regenLines = (output: string) => output.split('\n').filter((l) => l.startsWith('regen: '));
const WRONG_KEY_LINE = 'regen: REGEN_SECRET_KEY does not open the stored secrets (it is not the key they were sealed with)';

/** Everything the store holds, as text: the SQLite file and its WAL, or every PostgreSQL table's rows. */
async function storedText(): Promise<string> {
  if (!onPg) {
    const files = ['regen.db', 'regen.db-wal'].map((f) => join(tmp.dir, f)).filter(existsSync);
    return files.map((f) => readFileSync(f).toString('latin1')).join('');
  }
  const db = await openDb(await storeTarget());
  try {
    const { rows: tables } = await db.exec<{ name: string }>(`select tablename as name from pg_tables where schemaname = 'public'`);
    let text = '';
    for (const { name } of tables) text += (await db.exec<{ t: string | null }>(`select string_agg(x::text, '') as t from "${name}" x`)).rows[0].t ?? '';
    return text;
  } finally {
    await db.close();
  }
}

describe('secrets at rest', () => {
  const answers: string[] = [];
  let endpointId: string;
  let runId: string;

  it('are sealed on start once REGEN_SECRET_KEY is set, new ones as they are written, and still open with the key', async () => {
    const before = await startTestServer({ REGEN_RUNNER: 'false' }, tmp.dir);
    try {
      const ep = await call(before.url, '/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.1:9', api_key: API_KEY } });
      expect(ep.status, JSON.stringify(ep.body)).toBe(201);
      endpointId = ep.body.id;
      // More rows on the page, so that a rewritten value's old bytes are not swept away by chance.
      for (let i = 0; i < 20; i++) {
        const other = await call(before.url, '/v1/endpoints', { method: 'POST', json: { url: `http://127.0.0.1:${20 + i}`, api_key: `${API_KEY}-${i}` } });
        expect(other.status).toBe(201);
      }
      const run = await call(before.url, '/v1/runs', {
        method: 'POST',
        json: { model: 'm', input: { requests: [{ prompt: 'hi' }] }, webhook: { url: hookUrl, secret: WEBHOOK_SECRET } },
      });
      expect(run.status, JSON.stringify(run.body)).toBe(201);
      runId = run.body.id;
      answers.push(JSON.stringify(ep.body), JSON.stringify(run.body));
    } finally {
      await before.cleanup();
    }
    // Without a key they are kept as given (the README says how to protect the store then).
    expect(await storedText()).toContain(API_KEY);

    const sealed = await startTestServer({ REGEN_RUNNER: 'false', REGEN_SECRET_KEY: KEY }, tmp.dir);
    try {
      const later = await call(sealed.url, '/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.1:10', api_key: NEW_API_KEY } });
      expect(later.status).toBe(201);
      const got = await call(sealed.url, `/v1/endpoints/${endpointId}`);
      expect(got.body.has_api_key).toBe(true);
      answers.push(JSON.stringify(later.body), JSON.stringify(got.body), JSON.stringify((await call(sealed.url, `/v1/runs/${runId}`)).body));
      answers.push(JSON.stringify((await call(sealed.url, '/v1/endpoints')).body));
    } finally {
      await sealed.cleanup();
    }
    const text = await storedText();
    for (const secret of [API_KEY, NEW_API_KEY, WEBHOOK_SECRET]) expect(text.includes(secret), `the store holds ${secret}`).toBe(false);
    expect(text).toContain('regen-sealed:v1:');
    for (const answer of answers) for (const secret of [API_KEY, NEW_API_KEY, WEBHOOK_SECRET]) expect(answer).not.toContain(secret);

    // The runner and the deliverer read them through the same functions, with the key.
    const db = await openDb(await storeTarget(), { secretKey: KEY });
    try {
      expect((await getEndpoint(db, endpointId))?.apiKey).toBe(API_KEY);
      expect(await runWebhookSecret(db, runId)).toBe(WEBHOOK_SECRET);
    } finally {
      await db.close();
    }
  });

  it('a store with sealed secrets does not start without the key, or with another one, and says which variable', async () => {
    await expect(startTestServer({ REGEN_RUNNER: 'false' }, tmp.dir)).rejects.toThrow(/REGEN_SECRET_KEY is not set/);
    await expect(startTestServer({ REGEN_RUNNER: 'false', REGEN_SECRET_KEY: OTHER_KEY }, tmp.dir)).rejects.toThrow(/REGEN_SECRET_KEY does not open/);
  });

  it('a store whose secrets were sealed under two keys (replicas started together) does not start with either', async () => {
    // What two replicas given different keys would leave if each sealed part of the plain secrets.
    const db = await openDb(await storeTarget(), { secretKey: OTHER_KEY });
    try {
      const { changes } = await db.write((w) =>
        w.exec('update endpoints set api_key = ? where url = ?', [db.secrets.seal('sk-sealed-elsewhere'), 'http://127.0.0.1:10']),
      );
      expect(changes).toBe(1);
    } finally {
      await db.close();
    }
    for (const key of [KEY, OTHER_KEY]) {
      await expect(startTestServer({ REGEN_RUNNER: 'false', REGEN_SECRET_KEY: key }, tmp.dir)).rejects.toThrow(/REGEN_SECRET_KEY does not open/);
    }
  });

  // SQLite serialises the two with its immediate transaction; two handles in one process would only wait out its busy timeout.
  it.runIf(onPg)('replicas starting together with different keys: one seals every plain secret, the other stops', async () => {
    const plain = await openDb(await storeTarget());
    try {
      await plain.write(async (w) => {
        await w.exec(`update endpoints set api_key = 'sk-plain-' || id`);
        await w.exec('update runs set webhook_secret = null');
      });
    } finally {
      await plain.close();
    }
    const replicas = await Promise.all([KEY, OTHER_KEY].map(async (secretKey) => openDb(await storeTarget(), { secretKey })));
    try {
      const started = await Promise.allSettled(replicas.map((db) => checkStoredSecrets(db)));
      expect(started.map((s) => s.status).sort()).toEqual(['fulfilled', 'rejected']);
      const failed = started.find((s) => s.status === 'rejected') as PromiseRejectedResult;
      expect(String(failed.reason)).toMatch(/REGEN_SECRET_KEY does not open/);
      // Every secret opens under the key of the one that started.
      const winner = replicas[started.findIndex((s) => s.status === 'fulfilled')];
      const { rows } = await winner.exec<{ id: string; api_key: string }>('select id, api_key from endpoints');
      expect(rows.length).toBeGreaterThan(1);
      for (const { id, api_key } of rows) expect(winner.secrets.open(api_key)).toBe(`sk-plain-${id}`);
    } finally {
      await Promise.all(replicas.map((db) => db.close()));
    }
  });

  it('`regen serve` over sealed secrets without the key, or with another, exits 2 with the one line', async () => {
    const dir = serveTmp.dir;
    const sealing = await startTestServer({ REGEN_RUNNER: 'false', REGEN_SECRET_KEY: KEY }, dir);
    try {
      expect((await call(sealing.url, '/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.1:11', api_key: API_KEY } })).status).toBe(201);
    } finally {
      await sealing.cleanup();
    }
    for (const [env, line] of [
      [{}, NO_KEY_LINE],
      [{ REGEN_SECRET_KEY: OTHER_KEY }, WRONG_KEY_LINE],
    ] as const) {
      const refused = await spawnServer(dir, env).then(
        () => null,
        (err: Error) => err.message,
      );
      expect(refused).toMatch(/^server exited with 2:/);
      expect(regenLines(refused!)).toEqual([line]);
    }
  });

  it('a running server whose store another replica sealed under a key it lacks answers 503, not 500, and exits 2 with the same line', async () => {
    const dir = rolledTmp.dir;
    const running = await spawnServer(dir, { REGEN_RUNNER: 'false' });
    try {
      expect((await call(running.url, '/v1/endpoints', { method: 'POST', json: { url: 'http://127.0.0.1:12', api_key: API_KEY } })).status).toBe(201);
      await sealAsAnotherReplica(dir, KEY);
      const listed = await call(running.url, '/v1/endpoints');
      expect(listed.status, JSON.stringify(listed.body)).toBe(503);
      expect(listed.headers.get('content-type')).toMatch(/problem\+json/);
      expect(listed.body.detail).toMatch(/REGEN_SECRET_KEY/);
      expect(JSON.stringify(listed.body)).not.toContain('regen-sealed');
      const code = await waitFor('the server to exit', () => running.proc.exitCode ?? undefined, 30_000);
      expect(code).toBe(2);
      // Its pipes may still hold the line when the exit is seen.
      await waitFor('the one line', () => (regenLines(running.output()).length ? true : undefined), 10_000);
      expect(regenLines(running.output())).toEqual([NO_KEY_LINE]);
    } finally {
      await running.kill();
    }
  });
});
