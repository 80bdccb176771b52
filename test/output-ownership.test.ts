import type { AddressInfo } from 'node:net';
import { createRequire } from 'node:module';
import { existsSync, mkdirSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expectProblem, request, type Raw } from './support/http.js';
import { loadSource } from './support/build.js';
import { resolveInput } from '../src/services/runs/input-source.js';
import { inside } from '../src/storage/location.js';
import { Stores } from '../src/storage/index.js';
import { setEnv } from './support/env.js';
import { startTestServer, tempDir } from './support/server.js';

// s3rver ships no types; it is only started and stopped here.
const S3rver = createRequire(import.meta.url)('s3rver');

// As the server under test has it (its deps are the compiled tree's, test/support/build.ts).
const { setOutputUri } = await loadSource<typeof import('../src/db/runs.js')>('src/db/runs.ts');

// One place, one owner: an output prefix is compared by where it points, not how it is spelled,
// and regen's own store is neither an output nor an input.

let srv: Awaited<ReturnType<typeof startTestServer>>;
let data: string;
let dataUri: string;

beforeAll(async () => {
  srv = await startTestServer({ REGEN_RUNNER: 'false' });
  data = srv.config.dataDir;
  dataUri = pathToFileURL(data).href;
});
afterAll(() => srv?.cleanup());

const create = (body: Record<string, unknown>): Promise<Raw> =>
  request(srv.url, '/v1/runs', { method: 'POST', json: { model: 'm', input: { requests: [{ prompt: 'x' }] }, ...body } });

async function createOk(body: Record<string, unknown>): Promise<any> {
  const res = await create(body);
  expect(res.status, res.text).toBe(201);
  return res.body;
}

function refused(res: Raw, status: number, code: string) {
  expectProblem(res, status, { code, field: 'output.uri', hidden: [data] });
}

describe('output ownership by location', () => {
  it("refuses every other spelling of a run's default prefix, and a prefix inside it or holding it", async () => {
    const a = await createOk({});
    const path = a.output_uri.slice(dataUri.length);
    expect(a.output_uri).toBe(`${dataUri}/objects/runs/${a.id}/`);
    for (const spelling of [
      `${dataUri}/${path.replace('/objects/', '//objects/')}`,
      `${dataUri}${path.replace('/runs/', '/./runs/')}`,
      `${dataUri}${path.replace('/runs/', '/%72uns/')}`,
      `${dataUri}${path}/`,
      `${dataUri}${path.slice(0, -1)}`,
    ]) {
      const res = await create({ output: { uri: spelling } });
      refused(res, 409, 'conflict');
      expect(res.body.detail, spelling).toContain(a.id);
    }
    // Inside it, and holding it (the runs folder holds every run's default prefix).
    refused(await create({ output: { uri: `${a.output_uri}train/` } }), 409, 'conflict');
    refused(await create({ output: { uri: `${dataUri}/objects/runs/` } }), 409, 'conflict');
  });

  it('refuses //, %-encoded and /./ spellings of a chosen prefix, and gives the canonical one back', async () => {
    const first = await createOk({ output: { uri: `${dataUri}/shared//` } });
    expect(first.output_uri).toBe(`${dataUri}/shared/`);
    for (const spelling of [`${dataUri}/shared//`, `${dataUri}//shared/`, `${dataUri}/%73hared/`, `${dataUri}/./shared/`, `${dataUri}/shared/./`]) {
      const res = await create({ output: { uri: spelling } });
      refused(res, 409, 'conflict');
      expect(res.body.detail).toContain(first.id);
    }
    // Siblings are free: train/ and eval/ under one parent that no run owns.
    await createOk({ output: { uri: `${dataUri}/split/train/` } });
    await createOk({ output: { uri: `${dataUri}/split/eval/` } });
    refused(await create({ output: { uri: `${dataUri}/split/` } }), 409, 'conflict');
    refused(await create({ output: { uri: `${dataUri}/split/train/part/` } }), 409, 'conflict');
  });

  it('refuses a symlinked folder that leads to another run’s prefix', async () => {
    const real = join(data, 'real-out');
    mkdirSync(real);
    const owner = await createOk({ output: { uri: `${pathToFileURL(real).href}/` } });
    symlinkSync(real, join(data, 'link-out'));
    const res = await create({ output: { uri: `${dataUri}/link-out/` } });
    refused(res, 409, 'conflict');
    expect(res.body.detail).toContain(owner.id);
    // A link to a parent folder: the prefix below it is the same place too.
    symlinkSync(data, join(data, 'link-data'));
    refused(await create({ output: { uri: `${dataUri}/link-data/real-out/` } }), 409, 'conflict');
  });

  it("refuses regen's own store as an output: the data folder, the objects folder, uploaded files", async () => {
    for (const uri of [`${dataUri}/`, `${dataUri}/objects/`, `${dataUri}/objects/files/`, `${dataUri}/objects/files/x/`]) {
      refused(await create({ output: { uri } }), 422, 'validation_failed');
    }
  });

  it('refuses an s3:// prefix with empty segments rather than rewriting it', async () => {
    const res = await create({ output: { uri: 's3://bucket/a//b/' } });
    refused(res, 422, 'validation_failed');
    expect(res.body.detail).toMatch(/empty segments/);
  });

  it("refuses regen's database and its journal as an input, without reading them", async () => {
    for (const name of ['regen.db', 'regen.db-wal', 'regen.db-shm']) {
      const path = join(data, name);
      // The PostgreSQL project has no regen.db; the name alone is refused all the same.
      writeFileSync(path, '{"messages": "secret-api-key-sk-123"}\n', { flag: 'a' });
      const res = await request(srv.url, '/v1/runs', { method: 'POST', json: { model: 'm', input: { uri: pathToFileURL(path).href } } });
      expectProblem(res, 422, { code: 'validation_failed', field: 'input.uri', hidden: [data] });
      expect(res.text).not.toContain('secret-api-key');
    }
  });

  it('refuses an uploaded file read by its path as an input', async () => {
    const up = await request(srv.url, '/v1/files?filename=a.jsonl', {
      method: 'POST',
      headers: { 'content-type': 'application/jsonl' },
      body: '{"prompt":"x"}\n',
    });
    expect(up.status).toBe(201);
    const res = await request(srv.url, '/v1/runs', {
      method: 'POST',
      json: { model: 'm', input: { uri: `${dataUri}/objects/files/${up.body.id}.jsonl` } },
    });
    expectProblem(res, 422, { code: 'validation_failed', field: 'input.uri', hidden: [data] });
  });

  it('a validation, or a create refused after its probe, leaves no folder behind', async () => {
    const runs = join(data, 'objects', 'runs');
    const listRuns = () => (existsSync(runs) ? readdirSync(runs).sort() : []);
    const before = listRuns();
    const check = await request(srv.url, '/v1/runs/validate', { method: 'POST', json: { model: 'm', input: { requests: [{ prompt: 'x' }] } } });
    expect(check.status, check.text).toBe(200);
    const chosen = await request(srv.url, '/v1/runs/validate', { method: 'POST', json: { model: 'm', output: { uri: `${dataUri}/probed/deep/` } } });
    expect(chosen.status, chosen.text).toBe(200);
    const refusedCreate = await create({ input: { file_id: 'file_missing' }, output: { uri: `${dataUri}/never/` } });
    expect(refusedCreate.status).toBeGreaterThanOrEqual(400);
    expect(refusedCreate.status).toBeLessThan(500);
    expect(listRuns()).toEqual(before);
    expect(existsSync(join(data, 'probed'))).toBe(false);
    expect(existsSync(join(data, 'never'))).toBe(false);
  });

  it("keeps the runs' default folder free: no chosen prefix may touch it, and an old row holding it stops no new run", async () => {
    const tmp = tempDir('regen-reserved-');
    const own = await startTestServer({ REGEN_RUNNER: 'false' }, tmp.dir);
    try {
      const ownUri = pathToFileURL(own.config.dataDir).href;
      const post = (body: Record<string, unknown>) =>
        request(own.url, '/v1/runs', { method: 'POST', json: { model: 'm', input: { requests: [{ prompt: 'x' }] }, ...body } });
      for (const uri of [`${ownUri}/objects/runs/`, `${ownUri}/objects/runs/mine/`, `${ownUri}/objects/`]) {
        expectProblem(await post({ output: { uri } }), 422, { code: 'validation_failed', field: 'output.uri', hidden: [own.config.dataDir] });
      }
      // As a version before the reservation could have stored it: a prefix holding every default one.
      const old = (await post({ output: { uri: `${ownUri}/legacy/` } })).body;
      await setOutputUri(own.deps.db, old.id, `${ownUri}/objects/`);
      const fresh = await post({});
      expect(fresh.status, fresh.text).toBe(201);
    } finally {
      await own.close(0);
      tmp.cleanup();
    }
  });

  it('refuses an uploaded file in an s3:// store read by its URI as an input, before anything is read', () => {
    const config = { ...srv.config, outputUri: 's3://regen-store/deploy/' };
    for (const uri of ['s3://regen-store/deploy/files/file_abc.jsonl', 's3://regen-store/deploy/files/x/y.jsonl']) {
      expect(() => resolveInput(uri, config), uri).toThrow(
        expect.objectContaining({ code: 'validation_failed', extra: expect.objectContaining({ field: 'input.uri' }) }),
      );
    }
    // The same names elsewhere are anyone's objects.
    for (const uri of [
      's3://regen-store/other/files/file_abc.jsonl',
      's3://other-bucket/deploy/files/file_abc.jsonl',
      's3://regen-store/deploy/runs/x.jsonl',
    ]) {
      expect(resolveInput(uri, config).kind, uri).toBe('object');
    }
  });

  it('brings a run stored under another spelling to the canonical form at the next start', async () => {
    const tmp = tempDir('regen-respell-');
    try {
      let own = await startTestServer({ REGEN_RUNNER: 'false' }, tmp.dir);
      const ownUri = pathToFileURL(own.config.dataDir).href;
      const run = (await request(own.url, '/v1/runs', { method: 'POST', json: { model: 'm', input: { requests: [{ prompt: 'x' }] } } })).body;
      // As a version before canonical spellings could have stored it.
      const old = `${ownUri}//objects/./r%75ns/${run.id}/`;
      await setOutputUri(own.deps.db, run.id, old);
      expect((await request(own.url, `/v1/runs/${run.id}`)).body.output_uri).toBe(old);
      await own.close(0);
      own = await startTestServer({ REGEN_RUNNER: 'false' }, tmp.dir);
      try {
        expect((await request(own.url, `/v1/runs/${run.id}`)).body.output_uri).toBe(`${ownUri}/objects/runs/${run.id}/`);
        const res = await request(own.url, '/v1/runs', { method: 'POST', json: { model: 'm', input: { requests: [{ prompt: 'y' }] }, output: { uri: old } } });
        expect(res.status).toBe(409);
      } finally {
        await own.close(0);
      }
    } finally {
      tmp.cleanup();
    }
  });
});

/** Trials of the race: before creates took turns, every one of 20 let several runs in. */
const RACE_TRIALS = 8;

describe('racing creates', () => {
  it('of concurrent creates with nested or equal prefixes, exactly one wins and every other is told the winner', async () => {
    for (let trial = 0; trial < RACE_TRIALS; trial++) {
      const base = join(data, `race-${trial}`);
      const baseUri = pathToFileURL(base).href;
      const uris = [`${baseUri}/`, `${baseUri}/sub/`, `${baseUri}/sub/deeper/`, `${baseUri}/./sub/`];
      const answers = await Promise.all(uris.map((uri) => create({ output: { uri } })));
      const won = answers.filter((r) => r.status === 201);
      expect(won.length, `trial ${trial}: ${answers.map((r) => r.status).join(', ')}`).toBe(1);
      const winner = won[0].body;
      for (const res of answers.filter((r) => r.status !== 201)) {
        refused(res, 409, 'conflict');
        expect(res.body.detail).toContain(winner.id);
      }
      // The winner's folder stays; what the losers' probes made is gone, the folders on the winner's path aside.
      const kept = join(fileURLToPath(winner.output_uri), '.');
      expect(existsSync(kept)).toBe(true);
      for (const entry of readdirSync(base, { recursive: true }) as string[]) expect(inside(kept, join(base, entry)), entry).toBe(true);
    }
  });
});

describe('what a chosen prefix already holds', () => {
  const folder = (name: string, files: Record<string, string>) => {
    const dir = join(data, name);
    for (const [key, body] of Object.entries(files)) {
      mkdirSync(dirname(join(dir, key)), { recursive: true });
      writeFileSync(join(dir, key), body);
    }
    return { dir, uri: `${pathToFileURL(dir).href}/` };
  };
  const line = '{"messages":[{"role":"user","content":"hi"}]}\n';

  it("refuses a prefix holding the run's own input, even with overwrite, and leaves every file as it was", async () => {
    const user = folder('users-data', { 'README.md': '# mine\n', 'manifest.json': '{}\n', 'shard-00000.jsonl': line });
    for (const overwrite of [false, true]) {
      const res = await create({ input: { uri: `${user.uri}shard-00000.jsonl` }, output: { uri: user.uri, overwrite } });
      refused(res, 409, 'conflict');
      expect(res.body.detail).toContain("the run's input (shard-00000.jsonl)");
    }
    // Deeper inside the prefix too: the run owns all of it.
    const deep = folder('users-deep', { 'in/prompts.jsonl': line });
    refused(await create({ input: { uri: `${deep.uri}in/prompts.jsonl` }, output: { uri: deep.uri, overwrite: true } }), 409, 'conflict');
    expect(readFileSync(join(user.dir, 'README.md'), 'utf8')).toBe('# mine\n');
    expect(readdirSync(user.dir).sort()).toEqual(['README.md', 'manifest.json', 'shard-00000.jsonl']);
  });

  it('refuses a prefix holding files of the names the run writes, naming the file, unless the run says overwrite', async () => {
    for (const [name, key] of [
      ['held-shard', 'shard-00007.parquet'],
      ['held-errors', 'shard-00000.errors.jsonl'],
      ['held-manifest', 'manifest.json'],
      ['held-train', 'train/part.jsonl'],
      ['held-eval', 'eval/part.jsonl'],
      ['held-tokens', 'tokens/shard-00000.bin'],
      ['held-export', 'export.jsonl'],
    ]) {
      const held = folder(name, { [key]: 'theirs\n' });
      const res = await create({ output: { uri: held.uri } });
      refused(res, 409, 'conflict');
      expect(res.body.detail, key).toContain(key);
      expect(res.body.detail).toContain('output.overwrite');
      const over = await createOk({ output: { uri: held.uri, overwrite: true } });
      expect(over.output_overwrite).toBe(true);
    }
    // The card's name only where the run writes a card; other files are the user's business.
    const card = folder('held-card', { 'README.md': '# mine\n', 'notes.txt': 'x', '.hidden': 'x' });
    const plain = await createOk({ output: { uri: card.uri } });
    expect(plain.output_overwrite).toBe(false);
    const other = folder('held-card-parquet', { 'README.md': '# mine\n' });
    const res = await create({ output: { uri: other.uri, format: 'parquet' } });
    refused(res, 409, 'conflict');
    expect(res.body.detail).toContain('README.md');
    const split = folder('held-card-split', { 'README.md': '# mine\n' });
    refused(await create({ output: { uri: split.uri }, split: { eval: 0.1 } }), 409, 'conflict');
  });

  it('says the same at validation, without creating anything', async () => {
    const held = folder('held-validate', { 'manifest.json': '{}\n' });
    const res = await request(srv.url, '/v1/runs/validate', { method: 'POST', json: { model: 'm', output: { uri: held.uri } } });
    refused(res, 409, 'conflict');
    expect(res.body.detail).toContain('manifest.json');
  });
});

describe("a run's folder once taken", () => {
  it('is kept from its creation, empty, so no link can be put in its place to hand it to a second run', async () => {
    const taken = join(data, 'taken');
    const run = await createOk({ output: { uri: `${pathToFileURL(taken).href}/` } });
    expect(readdirSync(taken)).toEqual([]);
    // A link made later where the run's folder is would lead the run into another folder.
    const elsewhere = join(data, 'elsewhere');
    mkdirSync(elsewhere);
    expect(() => symlinkSync(elsewhere, taken)).toThrow(/EEXIST/);
    const second = await create({ output: { uri: `${pathToFileURL(elsewhere).href}/` } });
    expect(second.status).toBe(201);
    expect(fileURLToPath(run.output_uri)).not.toBe(fileURLToPath(second.body.output_uri));
  });
});

describe('an s3:// prefix', () => {
  it("is refused when it holds the run's input or files of the names the run writes, unless the run says overwrite", async () => {
    const bucketName = 'regen-own';
    const s3dir = tempDir('regen-s3rver-');
    const s3 = new S3rver({ address: '127.0.0.1', port: 0, silent: true, directory: s3dir.dir, configureBuckets: [{ name: bucketName, configs: [] }] });
    const endpoint = `http://127.0.0.1:${((await s3.run()) as AddressInfo).port}`;
    const restoreEnv = setEnv({ AWS_ACCESS_KEY_ID: 'S3RVER', AWS_SECRET_ACCESS_KEY: 'S3RVER', AWS_REGION: 'us-east-1' });
    const own = await startTestServer({ REGEN_RUNNER: 'false', REGEN_S3_ENDPOINT: endpoint, REGEN_S3_FORCE_PATH_STYLE: 'true' });
    const stores = new Stores({ endpoint, forcePathStyle: true });
    try {
      const bucket = stores.forUri(`s3://${bucketName}/`);
      const line = '{"messages":[{"role":"user","content":"hi"}]}\n';
      for (const key of ['users/shard-00000.jsonl', 'users/notes.txt', 'split/train/part.jsonl', 'deep/x/shard-00000.jsonl', 'clean/notes.txt'])
        await bucket.put(key, line);
      const post = (body: Record<string, unknown>) =>
        request(own.url, '/v1/runs', { method: 'POST', json: { model: 'm', input: { requests: [{ prompt: 'x' }] }, ...body } });
      const uri = (prefix: string) => `s3://${bucketName}/${prefix}`;
      let res = await post({ input: { uri: uri('users/shard-00000.jsonl') }, output: { uri: uri('users/'), overwrite: true } });
      refused(res, 409, 'conflict');
      expect(res.body.detail).toContain("the run's input (shard-00000.jsonl)");
      res = await post({ output: { uri: uri('users/') } });
      refused(res, 409, 'conflict');
      expect(res.body.detail).toContain('shard-00000.jsonl');
      res = await post({ output: { uri: uri('split/') } });
      refused(res, 409, 'conflict');
      expect(res.body.detail).toContain('train/part.jsonl');
      // Only the prefix's own names count: a shard deeper down is not where the run writes.
      for (const prefix of ['users/', 'deep/', 'clean/']) {
        const ok = await post({ output: { uri: uri(prefix), overwrite: prefix === 'users/' } });
        expect(ok.status, ok.text).toBe(201);
      }
    } finally {
      stores.close();
      await own.cleanup();
      restoreEnv();
      await s3.close();
      s3dir.cleanup();
    }
  });
});
