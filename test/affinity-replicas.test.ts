import { afterAll, expect, it } from 'vitest';
import { CACHE_SIM, cacheShare, makeAgenticConversations, makeConversations, PLAIN, readConversations } from './support/affinity.js';
import { doneOf, faultRig, waitForEnd, waitForRun } from './support/fault-rig.js';
import { describePg } from './support/pg.js';
import { alive, replicaDatabases, replicaDirs, replicaEnv, serveReplicas, startSims, waitForSpread } from './support/replicas.js';
import { createRun, expectCountersMatchRecount, registerEndpoint, uploadFile } from './support/runner-checks.js';
import type { ServerProcess } from './support/server.js';

// Prefix-cache affinity with several live replicas on one PostgreSQL database. Each replica sends
// only to the endpoints it drives, yet a conversation's next turn must reach the endpoint whose
// cache holds its prefix, whichever replica drives it: the share of prompt tokens served from the
// simulators' caches stays within 5% of the ideal with 2 and 3 replicas, for plain conversations
// and agentic ones (each tool-call step a request whose prefix holds the step before it), and a
// kill -9 of one loses no conversation and costs the cache only the conversations it moved.

const CONVERSATIONS = 240;
const SHARD_SIZE = 60;
/** Per endpoint: 4 endpoints × 8, below what the conversations keep due, so each replica has its own work and the others' to be tempted by. */
const CAP = 8;

const rig = faultRig();
const databases = replicaDatabases();
afterAll(async () => {
  await rig.stop();
  await databases.drop();
});

const s3Endpoint = () => `http://127.0.0.1:${rig.s3!.port}`;

await describePg('prefix-cache affinity across replicas', () => {
  let replicas: ServerProcess[] = [];
  let urls: string[] = [];
  let dbUrl = '';
  let env: Record<string, string> = {};

  /** A run of fresh conversations tagged `tag` through `base`, agentic ones when `agentic`; `during` runs while it goes. */
  async function conversationRun(base: string, tag: string, during?: (id: string) => Promise<ServerProcess>, agentic = false) {
    const { conversations, jsonl } = agentic ? makeAgenticConversations(CONVERSATIONS, tag) : makeConversations(CONVERSATIONS, tag);
    const fileId = await uploadFile(base, jsonl);
    const { id } = await createRun(base, {
      model: CACHE_SIM.model,
      input: { file_id: fileId },
      regenerate: 'all_assistant',
      params: PLAIN,
      quality: false,
      shard_size: SHARD_SIZE,
    });
    const follower = during ? await during(id) : replicas[0];
    const done = await waitForEnd(follower.url, id, 240_000);
    expect(done.status, done.status_reason).toBe('completed');
    expect(done.request_counts).toMatchObject({ total: CONVERSATIONS, completed: CONVERSATIONS, failed: 0 });
    await expectCountersMatchRecount(follower.url, done);
    const share = cacheShare(await readConversations(done.output_uri, conversations, s3Endpoint()));
    console.log(`affinity, ${tag}: ${JSON.stringify({ ...share, share: Number(share.share.toFixed(4)) })}`);
    if (agentic) expect(share.afterStep.cached / share.afterStep.ideal).toBeGreaterThanOrEqual(0.99);
    return share;
  }

  it('holds on two live replicas: each turn reaches the endpoint that holds its prefix', async () => {
    const database = await databases.create('affinity-replicas', { migrated: true });
    dbUrl = database.url;
    env = await replicaEnv(rig, database);
    const sims = await startSims(
      rig,
      [1, 2, 3, 4].map((seed) => ({ ...CACHE_SIM, seed })),
    );
    urls = sims.map((s) => s.url);
    replicas = await serveReplicas(rig, replicaDirs(rig, 'regen-affinity', ['a', 'b']), env);
    for (const url of urls) await registerEndpoint(replicas[0].url, url, { max_concurrency: CAP });
    await waitForSpread(dbUrl, urls, replicas, 'two endpoints for each replica');

    const { share } = await conversationRun(replicas[1].url, 'two');
    expect(share).toBeGreaterThanOrEqual(0.95);
  }, 300_000);

  it('holds for tool-call steps on two live replicas: each step reaches the endpoint that holds its prefix', async () => {
    const { share } = await conversationRun(replicas[0].url, 'agentic-two', undefined, true);
    expect(share).toBeGreaterThanOrEqual(0.95);
  }, 300_000);

  it('holds on three live replicas, the third joining mid-run', async () => {
    const { share } = await conversationRun(replicas[1].url, 'three', async (id) => {
      await waitForRun(replicas[0].url, id, 'a quarter done', (r) => doneOf(r) >= CONVERSATIONS / 4, 120_000, 50);
      replicas.push(await rig.serve(rig.dir('regen-affinity-c-'), env));
      await waitForSpread(dbUrl, urls, replicas, 'every replica to drive an endpoint');
      return replicas[0];
    });
    expect(share).toBeGreaterThanOrEqual(0.95);
  }, 300_000);

  it('holds for tool-call steps on three live replicas', async () => {
    expect(replicas.filter(alive)).toHaveLength(3);
    const { share } = await conversationRun(replicas[2].url, 'agentic-three', undefined, true);
    expect(share).toBeGreaterThanOrEqual(0.95);
  }, 300_000);

  it('a replica killed -9 mid-run: every conversation exactly once, and only the conversations it moved lose their cache, once', async () => {
    const got = await conversationRun(replicas[0].url, 'kill', async (id) => {
      await waitForRun(replicas[0].url, id, 'a third done', (r) => doneOf(r) >= CONVERSATIONS / 3, 120_000, 50);
      await replicas[1].kill('SIGKILL');
      const left = replicas.filter(alive);
      await waitForSpread(dbUrl, urls, left, "the dead replica's endpoints driven again");
      return left[0];
    });
    // A conversation of the dead replica's endpoints may move once, if a live one ran out of work
    // before they were driven again; it loses its cache there, and only there.
    expect(got.movedAgain).toBe(0);
    expect(got.cached / (got.ideal - got.movedIdeal)).toBeGreaterThanOrEqual(0.95);
  }, 300_000);

  it('agentic, a replica killed -9 mid-run: the steps of the conversations it did not move keep their cache', async () => {
    const [survivor, victim] = replicas.filter(alive);
    const got = await conversationRun(
      survivor.url,
      'agentic-kill',
      async (id) => {
        await waitForRun(survivor.url, id, 'a third done', (r) => doneOf(r) >= CONVERSATIONS / 3, 120_000, 50);
        await victim.kill('SIGKILL');
        await waitForSpread(dbUrl, urls, [survivor], "the dead replica's endpoints driven again");
        return survivor;
      },
      true,
    );
    expect(got.movedAgain).toBe(0);
    expect(got.cached / (got.ideal - got.movedIdeal)).toBeGreaterThanOrEqual(0.95);
  }, 300_000);
});
