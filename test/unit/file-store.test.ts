import { mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { PassThrough, Readable } from 'node:stream';
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

it('of racing takes of one new folder, none fails: a probe never writes where another take is removing', async () => {
  // Creates of one prefix arrive tens of milliseconds apart. When the probe went through the temp
  // folder, the take that finished first removed that folder while another was about to write in
  // it (ENOENT), and the folder's maker, failing so, removed the folder under the rest: 139 of
  // 2,000 such takes failed. Each round here is 20 takes over 30 ms.
  const failures: string[] = [];
  for (let round = 0; round < 30; round++) {
    const dir = join(tmp.dir, 'raced', `round-${round}`, 'out');
    const takes = await Promise.allSettled(
      Array.from({ length: 20 }, async () => {
        await new Promise((r) => setTimeout(r, Math.random() * 30));
        return storeAt(dir).take();
      }),
    );
    for (const t of takes) if (t.status === 'rejected') failures.push(String(t.reason));
    // The probes left nothing behind.
    expect(readdirSync(dir).filter((f) => f !== TEMP_FOLDER)).toEqual([]);
  }
  expect(failures).toEqual([]);
});

it('a body that fails, before its first byte or after some, leaves no temp file', async () => {
  // A write stream opening its file itself was still opening it when a failed body rejected the
  // pipeline, so the removal could come first and the open make the file after it: one such temp
  // file outlived a cut upload in a loaded CI run. Each round fails 20 bodies side by side, and
  // looks a moment later, when a file made late would be there.
  const dir = join(tmp.dir, 'failed');
  const store = storeAt(dir);
  for (let round = 0; round < 15; round++) {
    const puts = Array.from({ length: 20 }, (_, i) => {
      if (i % 2 === 0) {
        const body = new PassThrough();
        body.destroy(new Error('cut before the first byte'));
        return store.putStream(`f-${round}-${i}.jsonl`, body);
      }
      // Its line is read before it fails.
      let sent = false;
      const body = new Readable({
        read() {
          if (sent) return this.destroy(new Error('cut after a line'));
          sent = true;
          this.push('{"a":1}\n');
        },
      });
      return store.putStream(`f-${round}-${i}.jsonl`, body);
    });
    const settled = await Promise.allSettled(puts);
    expect(settled.map((s) => (s.status === 'rejected' ? (s.reason as Error).message : 'stored'))).toEqual(
      Array.from({ length: 20 }, (_, i) => (i % 2 === 0 ? 'cut before the first byte' : 'cut after a line')),
    );
    await new Promise((r) => setTimeout(r, 50));
    expect(readdirSync(join(dir, TEMP_FOLDER))).toEqual([]);
  }
  expect(readdirSync(dir)).toEqual([TEMP_FOLDER]);
});
