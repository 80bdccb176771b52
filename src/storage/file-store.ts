import { createReadStream, createWriteStream } from 'node:fs';
import { mkdir, open, readdir, readFile, rename, rm, rmdir, stat, unlink, writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { pipeline } from 'node:stream/promises';
import type { Readable } from 'node:stream';
import { TEMP_FOLDER } from './location.js';
import { assertKey, byteCounter, probeKey, type ObjectStore } from './store.js';

/**
 * A local folder as an object store. Writes go to a temp file in the folder's own TEMP_FOLDER and
 * are renamed into place, so a reader of the folder never sees half an object, and a crash leaves
 * at most a stray temp file under a dot name no `shard-*` glob matches, swept on the next start.
 * Inside the folder, not beside it: the rename stays on one file system (the folder may be a mount
 * point), and nothing is written outside the folder the run was allowed.
 */
export class FileStore implements ObjectStore {
  private readonly temp: string;

  constructor(
    readonly uri: string,
    private readonly dir: string,
  ) {
    this.temp = join(dir, TEMP_FOLDER);
  }

  private path(key: string): string {
    assertKey(key);
    return join(this.dir, key);
  }

  private async atomically(key: string, write: (tmp: string) => Promise<void>): Promise<void> {
    const dest = this.path(key);
    await mkdir(dirname(dest), { recursive: true });
    await mkdir(this.temp, { recursive: true });
    const tmp = join(this.temp, `${basename(dest)}.${randomBytes(6).toString('hex')}`);
    try {
      await write(tmp);
      const fh = await open(tmp, 'r');
      await fh.sync();
      await fh.close();
      await rename(tmp, dest);
    } catch (err) {
      await rm(tmp, { force: true });
      throw err;
    }
  }

  async put(key: string, body: Buffer | string): Promise<void> {
    await this.atomically(key, (tmp) => writeFile(tmp, body));
  }

  async putStream(key: string, body: Readable): Promise<{ bytes: number }> {
    // The pipeline below reports the body's errors, but it starts only after the folder exists: a
    // body that fails before then (a client hanging up) must not become an uncaught exception.
    body.on('error', () => {});
    const counter = byteCounter();
    await this.atomically(key, (tmp) => pipeline(body, counter, createWriteStream(tmp)));
    return { bytes: counter.bytes };
  }

  async get(key: string): Promise<Buffer> {
    return readFile(this.path(key));
  }

  async getStream(key: string): Promise<Readable> {
    const p = this.path(key);
    await stat(p);
    return createReadStream(p);
  }

  async head(key: string): Promise<{ bytes: number } | null> {
    try {
      return { bytes: (await stat(this.path(key))).size };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
      throw err;
    }
  }

  async delete(key: string): Promise<void> {
    await unlink(this.path(key)).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw err;
    });
  }

  async check(): Promise<void> {
    // The probe leaves the disk as it found it: a validation, or a create refused after its probe,
    // must not leave an empty folder behind.
    const made = await mkdir(this.dir, { recursive: true });
    const key = probeKey();
    try {
      await this.atomically(key, (tmp) => writeFile(tmp, 'ok'));
      await this.delete(key);
    } finally {
      if (made) await this.removeEmptyUpTo(made);
    }
  }

  /** Removes the temp folder and the folders from this one up to `top` while they are empty. */
  private async removeEmptyUpTo(top: string): Promise<void> {
    await rmdir(this.temp).catch(() => {});
    for (let d = this.dir; ; d = dirname(d)) {
      const removed = await rmdir(d).then(
        () => true,
        () => false,
      );
      if (!removed || d === top || dirname(d) === d) return;
    }
  }

  async sweep(before: number): Promise<number> {
    let names: string[];
    try {
      names = await readdir(this.temp);
    } catch {
      return 0;
    }
    let swept = 0;
    for (const name of names) {
      const p = join(this.temp, name);
      const s = await stat(p).catch(() => null);
      if (!s || s.mtimeMs >= before) continue;
      await rm(p, { force: true, recursive: true });
      swept++;
    }
    return swept;
  }
}
