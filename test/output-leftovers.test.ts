import { existsSync, mkdirSync, readdirSync, renameSync, symlinkSync, unlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { spawnSimulator, type SimProcess } from './support/sim.js';
import { Stores } from '../src/storage/index.js';
import { call, startTestServer, tempDir, waitFor } from './support/server.js';
import { completedRun, createRun, makePrompts, readManifestFiles, registerEndpoint, uploadFile, waitForStatus } from './support/runner-checks.js';

// What a run leaves in its output folder: only what its manifest lists, however it ended, and
// nothing at all in a folder that is no longer the one it took.

const MODEL = 'leftovers-sim';
const TEMP = '.regen-tmp';
/** Long enough for a loaded machine to see the runner notice a run ended; a temp folder never removed fails here. */
const TEMP_REMOVED_MS = 20_000;

const data = tempDir('regen-leftovers-');
let server: Awaited<ReturnType<typeof startTestServer>>;
let sim: SimProcess;
const stores = new Stores({ forcePathStyle: false });

beforeAll(async () => {
  sim = await spawnSimulator({ 'ttft-ms': 5, 'tokens-per-second': 5000, model: MODEL, 'max-running': 32, seed: 3 });
  server = await startTestServer({}, data.dir);
  await registerEndpoint(server.url, sim.url);
});

afterAll(async () => {
  await server?.close(2000);
  await sim?.stop();
  data.cleanup();
});

/** Every entry under a folder, dot names included, relative to it: files as they are, folders ending in `/`. */
function listTree(dir: string): string[] {
  return (readdirSync(dir, { recursive: true, withFileTypes: true }) as any[]).map((e) => {
    const key = relative(dir, join(e.parentPath ?? e.path, e.name));
    return e.isDirectory() ? `${key}/` : key;
  });
}

/** The folder holds the manifest, what it lists and the folders those sit in: nothing else, no temp folder. */
async function expectOnlyTheManifests(run: any): Promise<void> {
  const dir = fileURLToPath(run.output_uri);
  await waitFor(`${run.id}'s temp folder to go`, () => !existsSync(join(dir, TEMP)) || undefined, TEMP_REMOVED_MS);
  const { manifest } = await readManifestFiles(stores.forUri(run.output_uri));
  const keys = ['manifest.json', ...manifest.files.map((f: { key: string }) => f.key)];
  const folders = new Set(keys.filter((k) => k.includes('/')).map((k) => `${k.slice(0, k.lastIndexOf('/'))}/`));
  expect(listTree(dir).sort()).toEqual([...keys, ...folders].sort());
}

describe("a run's output folder", () => {
  it('holds only what the manifest lists once the run completed (split, card, errors aside nothing)', async () => {
    const prompts = makePrompts(60, 'done');
    const run = await completedRun(server.url, {
      model: MODEL,
      input: { file_id: await uploadFile(server.url, prompts.jsonl) },
      shard_size: 20,
      split: { eval: 0.25 },
    });
    await expectOnlyTheManifests(run);
  });

  it('holds only what the manifest lists once the run was cancelled midway', async () => {
    await sim.configure({ tokensPerSecond: 150 });
    try {
      const prompts = makePrompts(400, 'cancel');
      const created = await createRun(server.url, { model: MODEL, input: { file_id: await uploadFile(server.url, prompts.jsonl) }, shard_size: 10 });
      await waitFor(`a shard of ${created.id} written`, async () =>
        (await call(server.url, `/v1/runs/${created.id}`)).body.shards.uploaded > 0 ? true : undefined,
      );
      expect((await call(server.url, `/v1/runs/${created.id}/cancel`, { method: 'POST' })).status).toBe(200);
      const run = await waitForStatus(server.url, created.id, ['cancelled', 'completed', 'failed']);
      expect(run.status).toBe('cancelled');
      await expectOnlyTheManifests(run);
    } finally {
      await sim.configure({ tokensPerSecond: 5000 });
    }
  });

  it('is refused for writes once a link to another folder stands in its place; the run fails saying so, and a retry writes once it is back', async () => {
    const other = await spawnSimulator({ 'ttft-ms': 5, 'tokens-per-second': 5000, model: 'swap-sim', 'max-running': 16, seed: 4 });
    try {
      const swap = join(data.dir, 'swap');
      const moved = join(data.dir, 'swap-moved');
      const elsewhere = join(data.dir, 'elsewhere');
      const prompts = makePrompts(30, 'swap');
      // No endpoint serves the model yet: the run waits, its folder taken and empty.
      const created = await createRun(server.url, {
        model: 'swap-sim',
        input: { file_id: await uploadFile(server.url, prompts.jsonl) },
        shard_size: 10,
        output: { uri: `${pathToFileURL(swap).href}/` },
      });
      renameSync(swap, moved);
      mkdirSync(elsewhere);
      symlinkSync(elsewhere, swap);
      await registerEndpoint(server.url, other.url);
      const failed = await waitForStatus(server.url, created.id, ['failed', 'completed', 'cancelled']);
      expect(failed.status).toBe('failed');
      expect(failed.status_reason).toMatch(/output folder is no longer the one the run took/);
      expect(failed.status_reason).not.toContain(data.dir);
      expect(readdirSync(elsewhere)).toEqual([]);
      expect(readdirSync(moved)).toEqual([]);

      unlinkSync(swap);
      renameSync(moved, swap);
      expect((await call(server.url, `/v1/runs/${created.id}/retry`, { method: 'POST', json: {} })).status).toBe(200);
      const done = await waitForStatus(server.url, created.id, ['completed', 'failed', 'cancelled']);
      expect(done.status, done.status_reason).toBe('completed');
      await expectOnlyTheManifests(done);
      expect(readdirSync(elsewhere)).toEqual([]);
    } finally {
      await other.stop();
    }
  });

  it("has a finished run's stale temp files swept at the next start, and its temp folder with them", async () => {
    const run = await completedRun(server.url, { model: MODEL, input: { requests: [{ prompt: 'a' }, { prompt: 'b' }] } });
    const dir = fileURLToPath(run.output_uri);
    await waitFor(`${run.id}'s temp folder to go`, () => !existsSync(join(dir, TEMP)) || undefined, TEMP_REMOVED_MS);
    // As a crash during a write leaves it: a partial temp file, untouched for two hours.
    mkdirSync(join(dir, TEMP));
    const partial = join(dir, TEMP, 'shard-00000.jsonl.0123456789ab');
    writeFileSync(partial, '{"custom_id":');
    const old = new Date(Date.now() - 2 * 60 * 60 * 1000);
    utimesSync(partial, old, old);
    await server.close(2000);
    server = await startTestServer({}, data.dir);
    expect(existsSync(join(dir, TEMP))).toBe(false);
    await expectOnlyTheManifests(run);
  });
});
