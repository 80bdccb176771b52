import type { Readable } from 'node:stream';
import { FileStore } from './file-store.js';
import type { S3Settings } from './s3-store.js';
import { parseStoreUri, type ObjectStore, type TakenLocation } from './store.js';

export * from './store.js';

type S3Module = typeof import('./s3-store.js');
type S3Client = ReturnType<S3Module['makeS3Client']>;

/**
 * An S3 prefix whose client loads on its first use: the AWS SDK is over a third of the server's
 * code, and a server writing to a local folder need never compile it (in the main thread and the
 * runner's, each start).
 */
class LazyS3Store implements ObjectStore {
  #store?: Promise<ObjectStore>;

  constructor(
    readonly uri: string,
    private readonly open: () => Promise<ObjectStore>,
  ) {}

  #opened(): Promise<ObjectStore> {
    this.#store ??= this.open();
    return this.#store;
  }

  async put(key: string, body: Buffer | string): Promise<void> {
    return (await this.#opened()).put(key, body);
  }
  async putStream(key: string, body: Readable): Promise<{ bytes: number }> {
    return (await this.#opened()).putStream(key, body);
  }
  async get(key: string): Promise<Buffer> {
    return (await this.#opened()).get(key);
  }
  async getStream(key: string): Promise<Readable> {
    return (await this.#opened()).getStream(key);
  }
  async head(key: string): Promise<{ bytes: number } | null> {
    return (await this.#opened()).head(key);
  }
  async delete(key: string): Promise<void> {
    return (await this.#opened()).delete(key);
  }
  async check(): Promise<void> {
    return (await this.#opened()).check();
  }
  async take(): Promise<TakenLocation> {
    return (await this.#opened()).take();
  }
  async findKey(start: string): Promise<string | null> {
    return (await this.#opened()).findKey(start);
  }
  async sweep(before: number, dropEmpty?: boolean): Promise<number> {
    return (await this.#opened()).sweep(before, dropEmpty);
  }
  async removeTemp(): Promise<void> {
    return (await this.#opened()).removeTemp();
  }
}

/** Opens stores by URI, sharing one S3 client, so each run can write to its own prefix. */
export class Stores {
  private s3?: Promise<{ module: S3Module; client: S3Client }>;
  private readonly cache = new Map<string, ObjectStore>();

  constructor(private readonly s3Settings: S3Settings) {}

  forUri(uri: string): ObjectStore {
    return this.forOutput(uri, null);
  }

  /**
   * A run's output store: a local folder that is no longer the one the run took (`folder`, its
   * identity) refuses writes; `remade` records the identity of the folder a write made again.
   */
  forOutput(uri: string, folder: string | null, remade?: (folder: string) => Promise<void>): ObjectStore {
    const base = uri.endsWith('/') ? uri : uri + '/';
    const cacheKey = folder === null ? base : `${base}\0${folder}`;
    let store = this.cache.get(cacheKey);
    if (!store) {
      const loc = parseStoreUri(base);
      if (loc.kind === 'file') store = new FileStore(base, loc.dir, folder, remade);
      else {
        store = new LazyS3Store(base, async () => {
          const { module, client } = await this.s3Client();
          return new module.S3Store(base, client, loc.bucket, loc.prefix);
        });
      }
      this.cache.set(cacheKey, store);
    }
    return store;
  }

  private s3Client(): Promise<{ module: S3Module; client: S3Client }> {
    this.s3 ??= import('./s3-store.js').then((module) => ({ module, client: module.makeS3Client(this.s3Settings) }));
    return this.s3;
  }

  close(): void {
    void this.s3?.then(({ client }) => client.destroy()).catch(() => {});
  }
}
