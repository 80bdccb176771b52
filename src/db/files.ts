import { and, asc, desc, eq, isNull, lt, lte, type SQL } from 'drizzle-orm';
import type { Db, DbOrTx, Tables } from './client.js';

export async function getFile(db: Db, id: string) {
  const { files } = db.t;
  const [row] = await db.q.select().from(files).where(eq(files.id, id)).limit(1);
  return row;
}

export async function listFiles(db: Db, opts: { purpose?: string; after?: string; limit: number }) {
  const { files } = db.t;
  const where: SQL[] = [];
  if (opts.purpose) where.push(eq(files.purpose, opts.purpose));
  if (opts.after) where.push(lt(files.id, opts.after));
  return await db.q
    .select()
    .from(files)
    .where(and(...where))
    .orderBy(desc(files.id))
    .limit(opts.limit + 1);
}

export async function insertFile(db: DbOrTx, row: Tables['files']['$inferInsert']): Promise<void> {
  const { files } = db.t;
  await db.write((w) => w.q.insert(files).values(row));
}

export async function setFilePurpose(db: DbOrTx, id: string, purpose: string): Promise<void> {
  const { files } = db.t;
  await db.write((w) => w.q.update(files).set({ purpose }).where(eq(files.id, id)));
}

export async function setFileExpiry(db: DbOrTx, id: string, expiresAt: number): Promise<void> {
  const { files } = db.t;
  await db.write((w) => w.q.update(files).set({ expiresAt }).where(eq(files.id, id)));
}

/** Files whose expiry has passed and whose content is not yet deleted, oldest first. */
export async function dueFileExpiries(db: Db, now: number, limit: number) {
  const { files } = db.t;
  return await db.q
    .select()
    .from(files)
    .where(and(isNull(files.expiredAt), lte(files.expiresAt, now)))
    .orderBy(asc(files.expiresAt))
    .limit(limit);
}

/** Marks a file's content deleted; its row stays. */
export async function markFileExpired(db: DbOrTx, id: string, at: number): Promise<void> {
  const { files } = db.t;
  await db.write((w) =>
    w.q
      .update(files)
      .set({ expiredAt: at })
      .where(and(eq(files.id, id), isNull(files.expiredAt))),
  );
}

export async function deleteFile(db: DbOrTx, id: string): Promise<void> {
  const { files } = db.t;
  await db.write((w) => w.q.delete(files).where(eq(files.id, id)));
}
