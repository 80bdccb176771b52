import type { BetterSQLite3Database } from 'drizzle-orm/better-sqlite3';
import type * as schema from './schema.js';

/**
 * The query builder every statement function is written against. It is typed for SQLite's tables;
 * on PostgreSQL the same builder calls run on pg-core tables of the same names and properties
 * (schema-pg.ts), so only what both dialects share is used: `await` a query (never SQLite's
 * `.get()`, `.all()` or `.run()`), `.returning()` to learn what a write changed.
 */
export type Query = BetterSQLite3Database<typeof schema>;
export type Tables = typeof schema;
export type Dialect = 'sqlite' | 'pg';

/** A raw statement's answer: its rows (named by column) and how many rows it changed. */
export interface ExecResult<R = Record<string, unknown>> {
  rows: R[];
  changes: number;
}

/**
 * A connection to the store, or a transaction of one: every statement function takes either, so
 * one can run inside another's transaction.
 *
 * Reads run where they are called. Writes run in `tx` (several statements, all or nothing) or in
 * `write` (one statement): on SQLite both take the one writer connection in turn, so a transaction
 * awaiting its next statement never has another caller's write land inside it; on PostgreSQL a
 * transaction holds a pooled connection of its own and `write` takes any.
 */
/** A named hold (Db.hold). */
export interface Hold {
  release(): Promise<void>;
  /**
   * True once the hold's connection was ended by the server (a restart, a failover): the hold went
   * with it, and another process may take it. Work done under it should stop.
   */
  readonly lost: boolean;
}

export interface Db {
  readonly dialect: Dialect;
  readonly t: Tables;
  readonly q: Query;
  /** True inside `tx`: `tx` and `write` then run in this transaction. */
  readonly inTx: boolean;
  tx<T>(fn: (tx: Db) => Promise<T>): Promise<T>;
  write<T>(fn: (w: Db) => Promise<T>): Promise<T>;
  /** A raw statement with `?` placeholders; the SQL is the same on both dialects unless the caller branches on `dialect`. */
  exec<R = Record<string, unknown>>(text: string, params?: readonly unknown[]): Promise<ExecResult<R>>;
  /**
   * Takes a named hold for work only one process may do at a time (a run's validation), or null
   * when another process holds it. PostgreSQL: a session advisory lock on a connection of its own,
   * let go by `release` or when the process dies. SQLite has one process: the hold is always free.
   */
  hold(name: string): Promise<Hold | null>;
  ping(): Promise<void>;
  close(): Promise<void>;
  /** False once closed: work still under way (a validation) stops instead of reporting a fault. */
  readonly open: boolean;
  /** Seals the secrets written (`secrets.ts`) and opens them again on read. */
  readonly secrets: Secrets;
}

/** What `secrets.ts` SecretBox does: seal a secret to store it, open it when read back. */
export interface Secrets {
  /** False without a key: secrets are then stored as given. */
  readonly sealing: boolean;
  seal<T extends string | null | undefined>(plain: T): T;
  open<T extends string | null>(stored: T): T;
  /** `listener` is told, once, when a stored secret first fails to open. */
  whenLockedOut(listener: (err: Error) => void): void;
}

/** A transaction of a Db: the same interface. */
export type DbOrTx = Db;
