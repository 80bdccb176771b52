import { mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, expect, it } from 'vitest';
import { FileStore } from '../../src/storage/file-store.js';
import { TEMP_FOLDER } from '../../src/storage/location.js';
import { tempDir } from '../support/server.js';

// A local store writes nothing outside its own folder, and a probe leaves the disk as it found it.

const tmp = tempDir('regen-filestore-');
afterAll(() => tmp.cleanup());

const storeAt = (dir: string) => new FileStore(`${pathToFileURL(dir).href}/`, dir);

it('writes through a temp folder inside its own folder, never beside it', async () => {
  const parent = join(tmp.dir, 'beside');
  const dir = join(parent, 'out');
  mkdirSync(dir, { recursive: true });
  await storeAt(dir).put('shard-00000.jsonl', '{}\n');
  expect(readdirSync(parent)).toEqual(['out']);
  expect(readdirSync(dir).sort()).toEqual([TEMP_FOLDER, 'shard-00000.jsonl']);
});

it('a probe of a folder that does not exist yet removes the folders it made', async () => {
  const parent = join(tmp.dir, 'probe');
  mkdirSync(parent);
  await storeAt(join(parent, 'runs', 'run_x')).check();
  expect(readdirSync(parent)).toEqual([]);
  // A folder that was there stays, with what it held (and the temp folder: another write may be using it).
  const kept = join(parent, 'kept');
  mkdirSync(kept);
  writeFileSync(join(kept, 'a.txt'), 'a');
  await storeAt(kept).check();
  expect(readdirSync(kept).filter((f) => f !== TEMP_FOLDER)).toEqual(['a.txt']);
});

it('a probe through a file in the way fails', async () => {
  writeFileSync(join(tmp.dir, 'blocked'), 'a file');
  await expect(storeAt(join(tmp.dir, 'blocked', 'out')).check()).rejects.toThrow();
});
