import type { S3Client } from '@aws-sdk/client-s3';
import { FileStore } from './file-store.js';
import { makeS3Client, S3Store, type S3Settings } from './s3-store.js';
import { parseStoreUri, type ObjectStore } from './store.js';

export * from './store.js';

/** Opens stores by URI, sharing one S3 client, so each run can write to its own prefix. */
export class Stores {
  private s3?: S3Client;
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
        this.s3 ??= makeS3Client(this.s3Settings);
        store = new S3Store(base, this.s3, loc.bucket, loc.prefix);
      }
      this.cache.set(cacheKey, store);
    }
    return store;
  }

  close(): void {
    this.s3?.destroy();
  }
}
