import { desc, eq, lt, and, type SQL } from 'drizzle-orm';
import type { Db, DbOrTx } from './client.js';
import { files } from './schema.js';

export async function getFile(db: Db, id: string) {
  const [row] = await db.select().from(files).where(eq(files.id, id)).limit(1);
  return row;
}

export async function listFiles(db: Db, opts: { purpose?: string; after?: string; limit: number }) {
  const where: SQL[] = [];
  if (opts.purpose) where.push(eq(files.purpose, opts.purpose));
  if (opts.after) where.push(lt(files.id, opts.after));
  return db
    .select()
    .from(files)
    .where(and(...where))
    .orderBy(desc(files.id))
    .limit(opts.limit + 1);
}

export async function insertFile(db: DbOrTx, row: typeof files.$inferInsert): Promise<void> {
  await db.insert(files).values(row);
}

export async function setFilePurpose(db: DbOrTx, id: string, purpose: string): Promise<void> {
  await db.update(files).set({ purpose }).where(eq(files.id, id));
}

export async function deleteFile(db: DbOrTx, id: string): Promise<void> {
  await db.delete(files).where(eq(files.id, id));
}
