import { createReadStream, createWriteStream } from 'node:fs';
import { mkdir, open, readFile, rename, rm, stat, unlink, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { pipeline } from 'node:stream/promises';
import type { Readable } from 'node:stream';
import { assertKey, byteCounter, type ObjectStore } from './store.js';

/** A local folder as an object store. Writes go to a temp file and are renamed into place, so a
 * reader never sees half an object and a crash leaves at most a stray temp file. */
export class FileStore implements ObjectStore {
  constructor(
    readonly uri: string,
    private readonly dir: string,
  ) {}

  private path(key: string): string {
    assertKey(key);
    return join(this.dir, key);
  }

  private async atomically(key: string, write: (tmp: string) => Promise<void>): Promise<void> {
    const dest = this.path(key);
    await mkdir(dirname(dest), { recursive: true });
    const tmp = `${dest}.${randomBytes(6).toString('hex')}.tmp`;
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
    await this.atomically('.regen-check', (tmp) => writeFile(tmp, 'ok'));
  }
}
