import { mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { TEMP_FOLDER } from '../src/storage/location.js';
import { request } from './support/http.js';
import { startTestServer } from './support/server.js';

// /readyz is unauthenticated and polled often: it writes to the store at most every half minute,
// and reads in between still see a store that is gone.

let srv: Awaited<ReturnType<typeof startTestServer>>;

beforeAll(async () => {
  srv = await startTestServer({ REGEN_RUNNER: 'false' });
});
afterAll(() => srv?.cleanup());

it('a poll right after a write check does not write again, and still sees a store that is gone', async () => {
  const objects = join(srv.config.dataDir, 'objects');
  mkdirSync(objects, { recursive: true });
  expect((await request(srv.url, '/readyz')).status).toBe(200);
  // A file where the temp folder goes: any write to the store would now fail.
  rmSync(join(objects, TEMP_FOLDER), { recursive: true, force: true });
  writeFileSync(join(objects, TEMP_FOLDER), 'in the way');
  expect((await request(srv.url, '/readyz')).status).toBe(200);
  renameSync(objects, `${objects}.away`);
  writeFileSync(objects, 'not a folder');
  const down = await request(srv.url, '/readyz');
  expect(down.status).toBe(503);
  expect(down.body.checks).toMatchObject({ database: 'ok', object_store: 'unavailable' });
  rmSync(objects);
  renameSync(`${objects}.away`, objects);
});
