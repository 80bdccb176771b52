import {
  DeleteObjectCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
  S3ServiceException,
} from '@aws-sdk/client-s3';
import { Upload } from '@aws-sdk/lib-storage';
import type { Readable } from 'node:stream';
import { assertKey, byteCounter, probeKey, type ObjectStore, type TakenLocation } from './store.js';

export interface S3Settings {
  endpoint?: string;
  forcePathStyle: boolean;
}

/** Credentials and region come from the standard AWS chain only: never from regen's own config. */
export function makeS3Client(s: S3Settings): S3Client {
  return new S3Client({
    endpoint: s.endpoint,
    forcePathStyle: s.forcePathStyle,
    region: process.env.AWS_REGION ?? process.env.AWS_DEFAULT_REGION ?? 'us-east-1',
    // S3-compatible stores (MinIO, Ceph, R2, s3rver) do not all accept the SDK's default checksums.
    requestChecksumCalculation: 'WHEN_REQUIRED',
    responseChecksumValidation: 'WHEN_REQUIRED',
    maxAttempts: 3,
  });
}

export class S3Store implements ObjectStore {
  constructor(
    readonly uri: string,
    private readonly client: S3Client,
    private readonly bucket: string,
    private readonly prefix: string,
  ) {}

  private key(key: string): string {
    assertKey(key);
    return this.prefix + key;
  }

  async put(key: string, body: Buffer | string): Promise<void> {
    await this.client.send(new PutObjectCommand({ Bucket: this.bucket, Key: this.key(key), Body: body }));
  }

  async putStream(key: string, body: Readable): Promise<{ bytes: number }> {
    const counter = byteCounter();
    body.on('error', (err) => counter.destroy(err));
    const upload = new Upload({
      client: this.client,
      params: { Bucket: this.bucket, Key: this.key(key), Body: body.pipe(counter) },
      partSize: 8 * 1024 * 1024,
      queueSize: 2,
    });
    await upload.done();
    return { bytes: counter.bytes };
  }

  async get(key: string): Promise<Buffer> {
    const res = await this.client.send(new GetObjectCommand({ Bucket: this.bucket, Key: this.key(key) }));
    return Buffer.from(await res.Body!.transformToByteArray());
  }

  async getStream(key: string): Promise<Readable> {
    const res = await this.client.send(new GetObjectCommand({ Bucket: this.bucket, Key: this.key(key) }));
    return res.Body as Readable;
  }

  async head(key: string): Promise<{ bytes: number } | null> {
    try {
      const res = await this.client.send(new HeadObjectCommand({ Bucket: this.bucket, Key: this.key(key) }));
      return { bytes: res.ContentLength ?? 0 };
    } catch (err) {
      if (err instanceof S3ServiceException && (err.$metadata.httpStatusCode === 404 || err.name === 'NotFound')) return null;
      throw err;
    }
  }

  async delete(key: string): Promise<void> {
    await this.client.send(new DeleteObjectCommand({ Bucket: this.bucket, Key: this.key(key) }));
  }

  async check(): Promise<void> {
    // A bucket that answers reads may still refuse writes (credentials, policy, a full quota).
    const key = probeKey();
    await this.put(key, 'ok');
    await this.delete(key);
  }

  /** A prefix is no folder: nothing is made that could be given back, and no link can stand in its place. */
  async take(): Promise<TakenLocation> {
    await this.check();
    return { confirm: async () => null, giveBack: async () => {} };
  }

  async findKey(start: string): Promise<string | null> {
    const res = await this.client.send(new ListObjectsV2Command({ Bucket: this.bucket, Prefix: this.prefix + start, MaxKeys: 1 }));
    const key = res.Contents?.[0]?.Key;
    return key === undefined ? null : key.slice(this.prefix.length);
  }

  /** A single PUT is atomic and an unfinished multipart upload is invisible to readers: nothing to sweep. */
  async sweep(): Promise<number> {
    return 0;
  }

  async removeTemp(): Promise<void> {}
}
