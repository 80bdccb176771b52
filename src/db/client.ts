import Database from 'better-sqlite3';
import { sql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/better-sqlite3';
import { migrate } from 'drizzle-orm/better-sqlite3/migrator';
import { AsyncLocalStorage } from 'node:async_hooks';
import { fileURLToPath } from 'node:url';
import * as schema from './schema.js';
import { SecretBox } from './secrets.js';
import type { Db, ExecResult, Hold, Query } from './types.js';

export type { Db, DbOrTx, Dialect, ExecResult, Hold, Query, Tables } from './types.js';

const migrationsFolder = fileURLToPath(new URL('../../migrations', import.meta.url));

/** Callers take turns: the next one starts when the one before it has finished, however it finished. */
class TurnLock {
  private tail: Promise<void> = Promise.resolve();

  run<T>(fn: () => Promise<T>): Promise<T> {
    const result = this.tail.then(fn);
    this.tail = result.then(
      () => {},
      () => {},
    );
    return result;
  }
}

function tune(sqlite: Database.Database, busyTimeoutMs: number): void {
  // NORMAL in WAL mode is durable across process crashes (only an OS crash can lose the last commits).
  sqlite.pragma('synchronous = NORMAL');
  sqlite.pragma(`busy_timeout = ${busyTimeoutMs}`);
  sqlite.pragma('foreign_keys = ON');
  sqlite.pragma('cache_size = -16384');
  // SQLite's own lower() folds ASCII only, so the runs list's name filter would never match "Étude"
  // or "Ω" typed in another case; JavaScript folds as PostgreSQL's lower() does.
  sqlite.function('lower', { deterministic: true }, (text: unknown) => (typeof text === 'string' ? text.toLowerCase() : text));
}

/** How many statements a connection keeps prepared; a text past them (an IN list of a new length) pushes out the least recently used. */
const PREPARED_KEPT = 512;

/** Only statements that act when they run are kept: a pragma may act when it is prepared (secure_delete does). */
const KEPT_STATEMENT = /^\s*(select|insert|update|delete|with|replace)\b/i;

/**
 * Makes a connection prepare each query's text once: drizzle prepares every query it runs anew, and
 * the runner's loop runs the same reads ten times a second (SQLite's prepare was a quarter of an
 * idle server's runner-thread CPU). A kept statement comes back in the modes a new one has (rows as
 * objects, numbers as numbers): drizzle puts a statement in raw mode each time it wants arrays, and
 * a caller of `sqliteClient(db).prepare` may pluck. Nothing here binds a statement for good
 * (`bind()` cannot be undone). better-sqlite3 runs a statement to the end in one call, so one is
 * never handed out while in use, save during an `iterate()`: a statement busy so is not handed out
 * again, a new one is. SQLite prepares a statement again by itself after a schema change.
 */
function preparedOnce(sqlite: Database.Database): void {
  const prepare = sqlite.prepare.bind(sqlite);
  const kept = new Map<string, Database.Statement>();
  sqlite.prepare = ((text: string) => {
    if (!KEPT_STATEMENT.test(text)) return prepare(text);
    let stmt = kept.get(text);
    if (stmt?.busy) return prepare(text);
    if (stmt) {
      // Moved to the end of the map's order: the first entry is always the least recently used.
      kept.delete(text);
      if (stmt.reader) stmt.raw(false).pluck(false).expand(false);
      stmt.safeIntegers(false);
    } else {
      stmt = prepare(text);
      if (kept.size >= PREPARED_KEPT) kept.delete(kept.keys().next().value as string);
    }
    kept.set(text, stmt);
    return stmt;
  }) as typeof sqlite.prepare;
}

/** A SQLite connection's raw statements (a query's text prepared once: preparedOnce). */
class Statements {
  constructor(private readonly sqlite: Database.Database) {}

  exec<R>(text: string, params: readonly unknown[]): ExecResult<R> {
    const stmt = this.sqlite.prepare(text);
    // A statement that returns rows (a select, or a write with RETURNING) reports them; its changes are their count.
    if (stmt.reader) {
      const rows = stmt.all(...params) as R[];
      return { rows, changes: rows.length };
    }
    return { rows: [], changes: stmt.run(...params).changes };
  }
}

class SqliteHandle implements Db {
  readonly dialect = 'sqlite' as const;
  readonly t = schema;

  constructor(
    private readonly store: SqliteStore,
    readonly q: Query,
    private readonly statements: Statements,
    /** The writer connection's handle: inside tx or write, every statement runs on it. */
    private readonly writing: boolean,
    readonly inTx: boolean,
  ) {}

  get open(): boolean {
    return this.store.open;
  }

  get secrets(): SecretBox {
    return this.store.secrets;
  }

  get sqlite(): Database.Database {
    return this.store.client;
  }

  tx<T>(fn: (tx: Db) => Promise<T>): Promise<T> {
    if (this.inTx) return fn(this);
    return this.store.transaction(fn);
  }

  write<T>(fn: (w: Db) => Promise<T>): Promise<T> {
    if (this.writing) return fn(this);
    return this.store.writeTurn(fn);
  }

  async exec<R = Record<string, unknown>>(text: string, params: readonly unknown[] = []): Promise<ExecResult<R>> {
    return this.statements.exec<R>(text, params);
  }

  async hold(): Promise<Hold> {
    return { release: async () => {}, lost: false };
  }

  async ping(): Promise<void> {
    this.q.run(sql`select 1`);
  }

  close(): Promise<void> {
    return this.store.close();
  }
}

/**
 * SQLite: one file, two connections. Reads go through the reader, which in WAL mode sees what is
 * committed and never waits for a writer. Writes and transactions take the writer connection in
 * turn; the reader is opened read-only, so a write that does not take its turn fails at once
 * instead of waiting on this process's own lock.
 */
class SqliteStore {
  readonly root: SqliteHandle;
  private readonly writer: Database.Database;
  private readonly reader: Database.Database;
  private readonly writerHandle: SqliteHandle;
  private readonly txHandle: SqliteHandle;
  private readonly turns = new TurnLock();
  /**
   * The turn a caller runs in: a write that asks for another turn within its own would wait for
   * itself forever. A token per turn, compared with the turn under way, because callbacks started
   * within a turn (timers, wakes) carry its context on after it has ended.
   */
  private readonly inTurn = new AsyncLocalStorage<symbol>();
  private current: symbol | null = null;

  constructor(
    path: string,
    busyTimeoutMs: number,
    readonly secrets: SecretBox,
  ) {
    this.writer = new Database(path);
    this.writer.pragma('journal_mode = WAL');
    tune(this.writer, busyTimeoutMs);
    const writerQ = drizzle(this.writer, { schema }) as Query;
    migrate(writerQ, { migrationsFolder });
    // After the migrations: their statements run once in a database's life.
    preparedOnce(this.writer);
    this.reader = new Database(path, { readonly: true });
    tune(this.reader, busyTimeoutMs);
    preparedOnce(this.reader);
    const writerStatements = new Statements(this.writer);
    this.root = new SqliteHandle(this, drizzle(this.reader, { schema }) as Query, new Statements(this.reader), false, false);
    this.writerHandle = new SqliteHandle(this, writerQ, writerStatements, true, false);
    this.txHandle = new SqliteHandle(this, writerQ, writerStatements, true, true);
  }

  get open(): boolean {
    return this.writer.open;
  }

  private checkNotInTurn(): void {
    const mine = this.inTurn.getStore();
    if (mine !== undefined && mine === this.current) throw new Error('a write inside a transaction must go through its handle, not the store');
  }

  /** Runs `fn` as the turn under way, marked so that a nested call on the store is caught. */
  private turn<T>(fn: () => Promise<T>): Promise<T> {
    return this.turns.run(async () => {
      const token = Symbol('turn');
      this.current = token;
      try {
        return await this.inTurn.run(token, fn);
      } finally {
        this.current = null;
      }
    });
  }

  writeTurn<T>(fn: (w: Db) => Promise<T>): Promise<T> {
    this.checkNotInTurn();
    return this.turn(() => fn(this.writerHandle));
  }

  transaction<T>(fn: (tx: Db) => Promise<T>): Promise<T> {
    this.checkNotInTurn();
    return this.turn(async () => {
      // Immediate: the write lock is taken up front, so a transaction that reads before it writes
      // cannot fail its upgrade at once with SQLITE_BUSY when another connection wrote meanwhile.
      this.writer.exec('BEGIN IMMEDIATE');
      try {
        const result = await fn(this.txHandle);
        this.writer.exec('COMMIT');
        return result;
      } catch (err) {
        if (this.writer.inTransaction) this.writer.exec('ROLLBACK');
        throw err;
      }
    });
  }

  async close(): Promise<void> {
    // Writes already queued finish first; a transaction is never cut in half by a close.
    await this.turns.run(async () => {});
    if (this.reader.open) this.reader.close();
    if (this.writer.open) this.writer.close();
  }

  /** The writer's raw connection, for what only SQLite has (query plans in tests, the ingest bench). */
  get client(): Database.Database {
    return this.writer;
  }
}

/** A PostgreSQL connection URL (REGEN_DATABASE_URL), as opposed to a SQLite file's path. */
export const isPostgresUrl = (target: string) => /^postgres(ql)?:\/\//.test(target);

/** The store's name as operators read it (the `store` label of regen_replica_info). */
export function storeName(db: Db): 'sqlite' | 'postgresql' {
  return db.dialect === 'pg' ? 'postgresql' : 'sqlite';
}

/**
 * Opens the store: PostgreSQL for a postgres:// URL (src/db/pg.ts), else the SQLite file at that
 * path, tuned for one writer with many readers. Either way its migrations are applied first.
 * `busyTimeoutMs` is how long a SQLite write waits for another connection's lock before
 * SQLITE_BUSY; better-sqlite3 waits synchronously, so the whole thread stands still for that long.
 * `secretKey` (REGEN_SECRET_KEY, base64) seals the secrets stored (`secrets.ts`).
 * `idleInTransactionMs` is how long a PostgreSQL transaction may stay idle before the server ends it.
 */
export async function openDb(target: string, opts: { busyTimeoutMs?: number; secretKey?: string; idleInTransactionMs?: number } = {}): Promise<Db> {
  const secrets = new SecretBox(opts.secretKey ? Buffer.from(opts.secretKey, 'base64') : null);
  if (isPostgresUrl(target)) {
    const { openPg } = await import('./pg.js');
    return openPg(target, secrets, opts.idleInTransactionMs);
  }
  return new SqliteStore(target, opts.busyTimeoutMs ?? 10_000, secrets).root;
}

/** The SQLite connection under a Db (its writer), for what only SQLite has; throws on PostgreSQL. */
export function sqliteClient(db: Db): Database.Database {
  if (!(db instanceof SqliteHandle)) throw new Error('not a SQLite store');
  return db.sqlite;
}

interface DriverError {
  code?: unknown;
  message?: unknown;
  constraint?: unknown;
}

/** The driver's own error: drizzle wraps what a query builder's statement threw in an error whose cause it is. */
function driverError(err: unknown): DriverError | undefined {
  const e = err as (DriverError & { cause?: unknown }) | undefined;
  if (e && e.code === undefined && e.cause && typeof e.cause === 'object') return e.cause as DriverError;
  return e;
}

// PostgreSQL's answers that say "not now" rather than "never": serialization failure, deadlock,
// lock not available, too many connections, the server shutting down or starting (a failover).
// 25P03: a transaction left idle past its timeout (its process stalled), ended by the server.
const PG_RETRYABLE = new Set(['40001', '40P01', '55P03', '53300', '57P01', '57P02', '57P03', '25P03']);
const NET_RETRYABLE = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE']);

/**
 * The database cannot take this now but may soon, so the step is worth trying again: SQLITE_BUSY
 * (or LOCKED: another connection held the write lock past busy_timeout), or on PostgreSQL a
 * conflict, a lost connection or a server going over to its standby.
 */
export function isDbBusy(err: unknown): boolean {
  const e = driverError(err);
  const code = e?.code;
  if (typeof code === 'string') {
    if (code.startsWith('SQLITE_BUSY') || code.startsWith('SQLITE_LOCKED')) return true;
    if (PG_RETRYABLE.has(code) || code.startsWith('08') || NET_RETRYABLE.has(code)) return true;
  }
  // node-postgres reports a connection that went away mid-query, or a statement sent on one that
  // had, without a code.
  return typeof e?.message === 'string' && /^Connection terminated|connection error and is not queryable/.test(e.message);
}

/** Codes of a disk that is full: SQLite's, the file system's, and PostgreSQL's disk_full (53100). */
const DISK_FULL = new Set(['SQLITE_FULL', 'ENOSPC', 'EDQUOT', '53100']);

/** A write refused for want of space, in the database or on a disk: worth trying again once space is freed. Returns the code. */
export function diskFullCode(err: unknown): string | null {
  const code = driverError(err)?.code ?? (err as { code?: unknown })?.code;
  return typeof code === 'string' && DISK_FULL.has(code) ? code : null;
}

/** A write refused by a unique index or constraint on `column` (SQLite names the column, PostgreSQL the constraint). */
export function isUniqueViolation(err: unknown, column: string): boolean {
  const e = driverError(err);
  if (e?.code === 'SQLITE_CONSTRAINT_UNIQUE') return typeof e.message === 'string' && e.message.includes(column);
  return e?.code === '23505' && typeof e.constraint === 'string' && e.constraint.includes(column);
}

export async function closeDb(db: Db): Promise<void> {
  await db.close();
}

/** The cheapest statement that proves the database answers. */
export async function pingDb(db: Db): Promise<void> {
  await db.ping();
}

/** A select that locks the rows it reads on PostgreSQL; a SQLite transaction already holds the whole database. */
export function locked<Q>(db: Db, query: Q): Q {
  return db.dialect === 'pg' ? (query as unknown as { for(strength: 'update'): Q }).for('update') : query;
}

/** Ids per statement: an `in (...)` list binds one value per id, and SQLite caps bound values. */
export const IDS_PER_STATEMENT = 500;
