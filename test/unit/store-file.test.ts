import { mkdirSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { Readable, Writable } from 'node:stream';
import { pathToFileURL } from 'node:url';
import { afterAll, expect, it } from 'vitest';
import type { Deps } from '../../src/deps.js';
import { ApiError } from '../../src/errors.js';
import { makeLogger } from '../../src/logger.js';
import { storeFile } from '../../src/services/files.js';
import { FileStore } from '../../src/storage/file-store.js';
import { TEMP_FOLDER } from '../../src/storage/location.js';
import type { ObjectStore } from '../../src/storage/store.js';
import { tempDir } from '../support/server.js';

// An upload that fails is told apart by whose fault it is: a client hanging up is not a store outage.

const tmp = tempDir('regen-storefile-');
afterAll(() => tmp.cleanup());

function depsWith(store: ObjectStore): { deps: Deps; logs: Record<string, unknown>[] } {
  const logs: Record<string, unknown>[] = [];
  const sink = new Writable({
    write(chunk, _enc, done) {
      logs.push(JSON.parse(chunk.toString()));
      done();
    },
  });
  const deps = { config: { outputUri: store.uri }, stores: { forUri: () => store }, logger: makeLogger('info', sink) } as unknown as Deps;
  return { deps, logs };
}

it('a body cut off by its client is a 400 logged as such, and leaves nothing in the store', async () => {
  const dir = join(tmp.dir, 'cut');
  mkdirSync(dir);
  const store = new FileStore(`${pathToFileURL(dir).href}/`, dir);
  const { deps, logs } = depsWith(store);
  const body = new Readable({ read() {} });
  body.push('{"custom_id": "a"}\n');
  setTimeout(() => body.destroy(new Error('aborted')), 20);
  const err = await storeFile(deps, 'cut.jsonl', 'batch', body).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(ApiError);
  expect((err as ApiError).code).toBe('invalid_request');
  expect(logs.map((l) => l.msg)).toEqual(['upload cut off by the client; nothing kept']);
  expect(readdirSync(join(dir, TEMP_FOLDER))).toEqual([]);
  expect(readdirSync(join(dir, 'files'))).toEqual([]);
});

it('a store that fails a whole body is a 503 logged as the store failing', async () => {
  const store = { uri: 'file:///nowhere/', putStream: async () => Promise.reject(new Error('disk full')) } as unknown as ObjectStore;
  const { deps, logs } = depsWith(store);
  const err = await storeFile(deps, 'whole.jsonl', 'batch', Readable.from(['{"custom_id": "a"}\n'])).catch((e: unknown) => e);
  expect((err as ApiError).code).toBe('storage_unavailable');
  expect(logs.map((l) => [l.level, l.msg])).toEqual([[50, 'file upload to object storage failed']]);
});
