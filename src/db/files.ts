import { and, desc, eq, lt, type SQL } from 'drizzle-orm';
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

export async function deleteFile(db: DbOrTx, id: string): Promise<void> {
  const { files } = db.t;
  await db.write((w) => w.q.delete(files).where(eq(files.id, id)));
}
