import { createReadStream } from 'node:fs';
import { type FileHandle, mkdir, open, readdir, readFile, rename, rm, rmdir, stat, unlink, writeFile } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { randomBytes } from 'node:crypto';
import { pipeline } from 'node:stream/promises';
import type { Readable } from 'node:stream';
import { realLocation, TEMP_FOLDER } from './location.js';
import { assertKey, byteCounter, FolderChangedError, probeKey, type ObjectStore, type TakenLocation } from './store.js';

/** A folder's identity on this machine, its device and inode: the same however it is reached, and new for a folder put in its place. */
export async function folderIdentity(path: string): Promise<string> {
  const s = await stat(path, { bigint: true });
  return `${s.dev}:${s.ino}`;
}

/**
 * The folders this process made again at a run's path, by path: the remake under way, then the
 * identity it gave. A run's shards upload side by side, each through a store made from the run's
 * row as it was read, so one upload may find the folder another remade a moment before, before the
 * run's row says so. That folder is the run's, not one put in its place.
 */
const remadeHere = new Map<string, Promise<string>>();

/**
 * A local folder as an object store. Writes go to a temp file in the folder's own TEMP_FOLDER and
 * are renamed into place, so a reader of the folder never sees half an object, and a crash leaves
 * at most a stray temp file under a dot name no `shard-*` glob matches, swept on the next start.
 * Inside the folder, not beside it: the rename stays on one file system (the folder may be a mount
 * point), and nothing is written outside the folder the run was allowed.
 */
export class FileStore implements ObjectStore {
  private readonly temp: string;

  /**
   * `folder`: the identity the folder must still have for a write or delete to go ahead (a run's, as
   * it took it); `remade`, told the new identity when a write makes the folder again.
   */
  constructor(
    readonly uri: string,
    private readonly dir: string,
    private folder: string | null = null,
    private readonly remade?: (folder: string) => Promise<void>,
  ) {
    this.temp = join(dir, TEMP_FOLDER);
  }

  /**
   * Whether the folder is still the run's: true when it is, false when no folder stands at its path
   * (removed; a file in its place fails the write as any such write does). Throws FolderChangedError
   * when another folder stands there, or a link to one: the run would write into, or delete from, a
   * folder it never took.
   */
  private async stillOwned(): Promise<boolean> {
    if (this.folder === null) return true;
    let now: { identity: string; isFolder: boolean };
    try {
      const s = await stat(this.dir, { bigint: true });
      now = { identity: `${s.dev}:${s.ino}`, isFolder: s.isDirectory() };
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' || code === 'ENOTDIR') return false;
      throw err;
    }
    if (!now.isFolder) return false;
    if (now.identity !== this.folder) {
      const remade = await remadeHere.get(this.dir)?.catch(() => null);
      if (remade !== now.identity) throw new FolderChangedError();
      this.folder = remade;
    }
    return true;
  }

  /**
   * Before a write: a folder that is gone is made again, only where its path still leads to itself
   * (no link on the way), and its new identity is the one kept from then on.
   */
  private async mustOwn(): Promise<void> {
    if (await this.stillOwned()) return;
    if (realLocation(this.dir) !== resolve(this.dir)) throw new FolderChangedError();
    // Set before the folder exists again, so no other upload of the run can see it unannounced.
    const remaking = mkdir(this.dir, { recursive: true }).then(() => folderIdentity(this.dir));
    remadeHere.set(this.dir, remaking);
    const folder = await remaking;
    await this.remade?.(folder);
    this.folder = folder;
  }

  private path(key: string): string {
    assertKey(key);
    return join(this.dir, key);
  }

  /**
   * Writes through a temp file opened here, before any byte comes: the file exists from the start,
   * so a write that fails always finds it to remove. A write stream opening the file itself may
   * still be opening it when a failed body rejects the pipeline (on Node 20, in 717 of 2,000
   * tries), and make it after the removal: a cut upload's temp file once outlived it so.
   * `write` leaves the handle closed.
   */
  private async atomically(key: string, write: (file: FileHandle) => Promise<void>): Promise<void> {
    const dest = this.path(key);
    await this.mustOwn();
    await mkdir(dirname(dest), { recursive: true });
    await mkdir(this.temp, { recursive: true });
    const tmp = join(this.temp, `${basename(dest)}.${randomBytes(6).toString('hex')}`);
    const file = await open(tmp, 'wx');
    try {
      await write(file);
      const written = await open(tmp, 'r');
      try {
        await written.sync();
      } finally {
        await written.close();
      }
      await rename(tmp, dest);
    } catch (err) {
      // Closed already unless the write failed before its stream took the handle.
      await file.close().catch(() => {});
      await rm(tmp, { force: true });
      throw err;
    }
  }

  async put(key: string, body: Buffer | string): Promise<void> {
    await this.atomically(key, async (file) => {
      try {
        await file.writeFile(body);
      } finally {
        await file.close();
      }
    });
  }

  async putStream(key: string, body: Readable): Promise<{ bytes: number }> {
    // The pipeline below reports the body's errors, but it starts only after the folder exists: a
    // body that fails before then (a client hanging up) must not become an uncaught exception.
    body.on('error', () => {});
    const counter = byteCounter();
    await this.atomically(key, async (file) => {
      const out = file.createWriteStream();
      try {
        await pipeline(body, counter, out);
      } finally {
        // On Node 20 a failed pipeline answers before the stream has closed the handle.
        if (!out.closed) await new Promise<void>((done) => out.once('close', () => done()));
      }
    });
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
    const path = this.path(key);
    // A folder that is gone holds nothing to delete; one put in its place is not the run's.
    if (!(await this.stillOwned())) return;
    await unlink(path).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw err;
    });
  }

  async check(): Promise<void> {
    // The probe leaves the disk as it found it: a validation, or a create refused after its probe,
    // must not leave an empty folder behind.
    const made = await mkdir(this.dir, { recursive: true });
    try {
      await this.probe();
    } finally {
      if (made) await this.removeEmptyUpTo(made);
    }
  }

  async take(): Promise<TakenLocation> {
    const made = await mkdir(this.dir, { recursive: true });
    try {
      await this.probe();
    } catch (err) {
      if (made) await this.removeEmptyUpTo(made);
      throw err;
    }
    // The folder stays, its temp folder does not: a finished folder holds only what the run wrote.
    await rmdir(this.temp).catch(() => {});
    const taken = await folderIdentity(this.dir);
    return {
      confirm: async () => {
        const remade = await mkdir(this.dir, { recursive: true });
        const now = await folderIdentity(this.dir);
        if (!remade && now !== taken) throw new FolderChangedError();
        return now;
      },
      giveBack: async (owned) => {
        if (made) await this.prune(made, owned);
      },
    };
  }

  /** Removes the empty folders of a tree, deepest first, but none a run owns (a folder that holds one is never empty). */
  private async prune(dir: string, owned: (folderUri: string) => Promise<boolean>): Promise<void> {
    const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
    for (const e of entries) if (e.isDirectory()) await this.prune(join(dir, e.name), owned);
    const href = pathToFileURL(dir).href;
    if (await owned(href.endsWith('/') ? href : `${href}/`)) return;
    await rmdir(dir).catch(() => {});
  }

  /**
   * Writes a probe object straight into the folder (a new name, never one that exists) and deletes
   * it. Not through the temp folder: racing creates of one prefix each probe it, and one that has
   * taken the folder removes the temp folder (take) while another may be about to write in it.
   */
  private async probe(): Promise<void> {
    const key = probeKey();
    await this.mustOwn();
    await writeFile(this.path(key), 'ok', { flag: 'wx' });
    await this.delete(key);
  }

  async findKey(start: string): Promise<string | null> {
    const folder = start.slice(0, start.lastIndexOf('/') + 1);
    const name = start.slice(folder.length);
    let names: string[];
    try {
      names = await readdir(join(this.dir, folder));
    } catch {
      return null;
    }
    const hit = names.sort().find((n) => n.startsWith(name) && n !== TEMP_FOLDER);
    return hit === undefined ? null : folder + hit;
  }

  /** Removes the temp folder and the folders from this one up to `top` while they are empty. */
  private async removeEmptyUpTo(top: string): Promise<void> {
    await rmdir(this.temp).catch(() => {});
    // Resolved: without its trailing `/` the folder compares equal to `top`, as mkdir names it.
    for (let d = resolve(this.dir); ; d = dirname(d)) {
      const removed = await rmdir(d).then(
        () => true,
        () => false,
      );
      if (!removed || d === top || dirname(d) === d) return;
    }
  }

  async sweep(before: number, dropEmpty = false): Promise<number> {
    if (!(await this.stillOwned())) return 0;
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
    if (dropEmpty) await rmdir(this.temp).catch(() => {});
    return swept;
  }

  async removeTemp(): Promise<void> {
    // A folder gone or put in another's place holds no temp folder of the run's.
    const owned = await this.stillOwned().catch((err: unknown) => {
      if (err instanceof FolderChangedError) return false;
      throw err;
    });
    if (owned) await rm(this.temp, { recursive: true, force: true });
  }
}
