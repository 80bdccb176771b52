import { desc, eq, lt, and, type SQL } from 'drizzle-orm';
import type { Db, DbOrTx } from './client.js';
import { files } from './schema.js';

export function getFile(db: Db, id: string) {
  return db.select().from(files).where(eq(files.id, id)).get();
}

export function listFiles(db: Db, opts: { purpose?: string; after?: string; limit: number }) {
  const where: SQL[] = [];
  if (opts.purpose) where.push(eq(files.purpose, opts.purpose));
  if (opts.after) where.push(lt(files.id, opts.after));
  return db
    .select()
    .from(files)
    .where(and(...where))
    .orderBy(desc(files.id))
    .limit(opts.limit + 1)
    .all();
}

export function insertFile(db: DbOrTx, row: typeof files.$inferInsert): void {
  db.insert(files).values(row).run();
}

export function setFilePurpose(db: DbOrTx, id: string, purpose: string): void {
  db.update(files).set({ purpose }).where(eq(files.id, id)).run();
}

export function deleteFile(db: DbOrTx, id: string): void {
  db.delete(files).where(eq(files.id, id)).run();
}
