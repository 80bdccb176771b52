import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { and, eq, isNotNull, like, not } from 'drizzle-orm';
import type { Db, Secrets } from './types.js';

// Endpoint api_keys and webhook secrets are stored sealed with AES-256-GCM under REGEN_SECRET_KEY,
// so that a copy of the database (a backup, a dump, the file read by mistake) does not hand them
// out. The key stays in the environment, never in the store.

/** Marks a sealed value and the scheme that sealed it; another scheme would take the next version. */
const SEALED_PREFIX = 'regen-sealed:v1:';
export const SECRET_KEY_BYTES = 32;
// GCM's standard 96-bit nonce (NIST SP 800-38D) and its full 128-bit tag.
const IV_BYTES = 12;
const TAG_BYTES = 16;

export class SecretKeyError extends Error {}

/** Seals and opens the stored secrets; without a key it stores them as given (README "Secrets at rest"). */
export class SecretBox implements Secrets {
  private lockedOut: ((err: SecretKeyError) => void) | null = null;

  constructor(private readonly key: Buffer | null) {
    if (key && key.length !== SECRET_KEY_BYTES) throw new SecretKeyError(`the secret key must be ${SECRET_KEY_BYTES} bytes`);
  }

  get sealing(): boolean {
    return this.key !== null;
  }

  seal<T extends string | null | undefined>(plain: T): T {
    if (!this.key || plain == null || isSealed(plain)) return plain;
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv('aes-256-gcm', this.key, iv);
    const body = Buffer.concat([cipher.update(plain, 'utf8'), cipher.final()]);
    return (SEALED_PREFIX + Buffer.concat([iv, cipher.getAuthTag(), body]).toString('base64')) as T;
  }

  open<T extends string | null>(stored: T): T {
    if (stored === null || !isSealed(stored)) return stored;
    if (!this.key) throw this.refuse('a stored secret is sealed, and REGEN_SECRET_KEY is not set');
    const raw = Buffer.from(stored.slice(SEALED_PREFIX.length), 'base64');
    const decipher = createDecipheriv('aes-256-gcm', this.key, raw.subarray(0, IV_BYTES));
    decipher.setAuthTag(raw.subarray(IV_BYTES, IV_BYTES + TAG_BYTES));
    try {
      return Buffer.concat([decipher.update(raw.subarray(IV_BYTES + TAG_BYTES)), decipher.final()]).toString('utf8') as T;
    } catch {
      throw this.refuse('REGEN_SECRET_KEY does not open the stored secrets (it is not the key they were sealed with)');
    }
  }

  /**
   * Called once, with the error, when a secret first fails to open. A process that passed the check
   * at start meets one when another replica, restarted with a key, sealed the secrets since: it
   * cannot send to the endpoints or sign a delivery, and must leave the fleet to the replicas that
   * have the key rather than fail every step that reads one.
   */
  whenLockedOut(listener: (err: SecretKeyError) => void): void {
    this.lockedOut = listener;
  }

  private refuse(message: string): SecretKeyError {
    const err = new SecretKeyError(message);
    const listener = this.lockedOut;
    this.lockedOut = null;
    listener?.(err);
    return err;
  }
}

const isSealed = (value: string) => value.startsWith(SEALED_PREFIX);

/** PostgreSQL: the advisory lock replicas starting together check and seal the stored secrets under, one at a time. */
const SEAL_LOCK_KEY = 7_240_416;

/**
 * On start: with a key, checks that it opens every sealed secret and seals the ones stored in plain
 * text before it was set; without one, refuses a store whose secrets are sealed. Either way a wrong
 * setting stops the process with one line instead of failing each probe and delivery. Replicas
 * started together with different keys take turns (one transaction each, under a lock): the first
 * seals, and the next finds secrets its key does not open and stops, instead of sealing the rest
 * under its own key and leaving a store no key opens whole.
 */
export async function checkStoredSecrets(db: Db): Promise<void> {
  const { endpoints, runs } = db.t;
  const sqlite = db.dialect === 'sqlite';
  const sealedSome = await db.tx(async (tx) => {
    if (!sqlite) await tx.exec('select pg_advisory_xact_lock(?)', [SEAL_LOCK_KEY]);
    const sealedKeys = await tx.q
      .select({ v: endpoints.apiKey })
      .from(endpoints)
      .where(like(endpoints.apiKey, `${SEALED_PREFIX}%`));
    const sealedHooks = await tx.q
      .select({ v: runs.webhookSecret })
      .from(runs)
      .where(like(runs.webhookSecret, `${SEALED_PREFIX}%`));
    for (const { v } of [...sealedKeys, ...sealedHooks]) db.secrets.open(v);
    if (!db.secrets.sealing) return false;
    const plainKeys = await tx.q
      .select({ id: endpoints.id, v: endpoints.apiKey })
      .from(endpoints)
      .where(and(isNotNull(endpoints.apiKey), not(like(endpoints.apiKey, `${SEALED_PREFIX}%`))));
    const plainHooks = await tx.q
      .select({ id: runs.id, v: runs.webhookSecret })
      .from(runs)
      .where(and(isNotNull(runs.webhookSecret), not(like(runs.webhookSecret, `${SEALED_PREFIX}%`))));
    if (plainKeys.length + plainHooks.length === 0) return false;
    // SQLite keeps a rewritten value's old bytes in the page's free space and in the WAL: they are
    // zeroed as they are freed, and the WAL is emptied below, so the plain values leave the disk too.
    if (sqlite) await tx.exec('pragma secure_delete = on');
    try {
      // Only the value read is replaced: an operator's new key, written meanwhile, wins.
      for (const { id, v } of plainKeys) {
        await tx.q
          .update(endpoints)
          .set({ apiKey: db.secrets.seal(v) })
          .where(and(eq(endpoints.id, id), eq(endpoints.apiKey, v!)));
      }
      for (const { id, v } of plainHooks) {
        await tx.q
          .update(runs)
          .set({ webhookSecret: db.secrets.seal(v) })
          .where(and(eq(runs.id, id), eq(runs.webhookSecret, v!)));
      }
    } finally {
      if (sqlite) await tx.exec('pragma secure_delete = off');
    }
    return true;
  });
  // After the commit: a checkpoint cannot empty the WAL while a transaction is open.
  if (sealedSome && sqlite) await db.write((w) => w.exec('pragma wal_checkpoint(truncate)'));
}
