import Database from 'better-sqlite3';
import { sql } from 'drizzle-orm';
import { drizzle, type BetterSQLite3Database } from 'drizzle-orm/better-sqlite3';
import { migrate } from 'drizzle-orm/better-sqlite3/migrator';
import { fileURLToPath } from 'node:url';
import * as schema from './schema.js';

export type Db = BetterSQLite3Database<typeof schema> & { $client: Database.Database };

const migrationsFolder = fileURLToPath(new URL('../../migrations', import.meta.url));

/**
 * Opens the database file, tunes it for one writer with many readers, and applies migrations.
 * `busyTimeoutMs` is how long a write waits for another connection's lock before SQLITE_BUSY;
 * better-sqlite3 waits synchronously, so the whole process stands still for that long.
 */
export function openDb(path: string, opts: { busyTimeoutMs?: number } = {}): Db {
  const sqlite = new Database(path);
  sqlite.pragma('journal_mode = WAL');
  // NORMAL in WAL mode is durable across process crashes (only an OS crash can lose the last commits).
  sqlite.pragma('synchronous = NORMAL');
  sqlite.pragma(`busy_timeout = ${opts.busyTimeoutMs ?? 10_000}`);
  sqlite.pragma('foreign_keys = ON');
  sqlite.pragma('cache_size = -16384');
  const db = drizzle(sqlite, { schema }) as Db;
  migrate(db, { migrationsFolder });
  return db;
}

/** SQLITE_BUSY (or LOCKED): another connection held the write lock past busy_timeout; worth trying again. */
export function isDbBusy(err: unknown): boolean {
  const code = (err as { code?: unknown })?.code;
  return typeof code === 'string' && (code.startsWith('SQLITE_BUSY') || code.startsWith('SQLITE_LOCKED'));
}

export function closeDb(db: Db): void {
  if (db.$client.open) db.$client.close();
}

/** A transaction of a Db: every statement function takes either, so one can run inside another's transaction. */
type Tx = Parameters<Parameters<Db['transaction']>[0]>[0];
export type DbOrTx = Db | Tx;

/** The cheapest statement that proves the database answers. */
export async function pingDb(db: Db): Promise<void> {
  await db.run(sql`select 1`);
}

/**
 * For a transaction that reads before it writes. SQLite's default (deferred) takes a read snapshot
 * first; if the other thread's connection commits before the first write, the upgrade fails at
 * once with SQLITE_BUSY, without waiting out busy_timeout. Immediate takes the write lock up front,
 * so the wait is the busy_timeout's, as for any other write.
 */
export const IMMEDIATE = { behavior: 'immediate' } as const;
