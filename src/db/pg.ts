// The PostgreSQL store (REGEN_DATABASE_URL=postgres://…): the same Db as SQLite's, over a pool.
// Loaded only when that URL is set, so the embedded default never loads the pg driver.
import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate } from 'drizzle-orm/node-postgres/migrator';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import type { Db, ExecResult, Hold, Query, Tables } from './types.js';
import * as schema from './schema-pg.js';
import { SecretBox } from './secrets.js';

const migrationsFolder = fileURLToPath(new URL('../../migrations/pg', import.meta.url));

/** Connections a process opens at most: the API and the runner each take a few at a time. */
const POOL_SIZE = 10;
/** How long a new connection, and any one statement, may take before it fails as a busy database. */
const CONNECT_TIMEOUT_MS = 10_000;
const STATEMENT_TIMEOUT_MS = 60_000;
/**
 * A transaction left open this long between statements is ended by the server: its process is
 * stalled (stopped, swapping, cut off). `regen serve` sets it from its staleness
 * (idleInTransactionMs in runner/lock.ts); this is its value at the default 15 s.
 */
const IDLE_IN_TRANSACTION_MS = 10_000;
/** Any constant: the key of the advisory lock that lets one process at a time apply migrations. */
const MIGRATION_LOCK = 7_240_413;

// 64-bit integers (counts, sums, timestamps in milliseconds) come back as numbers: every one regen
// stores is below 2^53, as SQLite's are through better-sqlite3. Numeric (a sum of bigints) too.
const INT8 = 20;
const NUMERIC = 1700;
const types = {
  getTypeParser: ((oid: number, format?: 'text' | 'binary') => {
    if (oid === INT8 || oid === NUMERIC) return (v: string) => Number(v);
    return pg.types.getTypeParser(oid, format);
  }) as typeof pg.types.getTypeParser,
};

/** `?` placeholders as PostgreSQL's `$1, $2, …`; the statement texts regen writes have no `?` elsewhere. */
const numbered = new Map<string, string>();
function toPg(text: string): string {
  let out = numbered.get(text);
  if (out === undefined) {
    let n = 0;
    out = text.replace(/\?/g, () => `$${++n}`);
    numbered.set(text, out);
  }
  return out;
}

const tables = schema as unknown as Tables;

class PgHandle implements Db {
  readonly dialect = 'pg' as const;
  readonly t = tables;

  constructor(
    private readonly store: PgStore,
    readonly q: Query,
    private readonly client: pg.Pool | pg.PoolClient,
    readonly inTx: boolean,
  ) {}

  get open(): boolean {
    return this.store.open;
  }

  get secrets(): SecretBox {
    return this.store.secrets;
  }

  tx<T>(fn: (tx: Db) => Promise<T>): Promise<T> {
    if (this.inTx) return fn(this);
    return this.store.transaction(fn);
  }

  /** One statement needs no transaction here: the pool runs it on any connection. */
  write<T>(fn: (w: Db) => Promise<T>): Promise<T> {
    return fn(this);
  }

  async exec<R = Record<string, unknown>>(text: string, params: readonly unknown[] = []): Promise<ExecResult<R>> {
    const res = await this.client.query(toPg(text), params as unknown[]);
    return { rows: res.rows as R[], changes: res.rowCount ?? 0 };
  }

  hold(name: string): Promise<Hold | null> {
    return this.store.hold(name);
  }

  async ping(): Promise<void> {
    await this.client.query('select 1');
  }

  close(): Promise<void> {
    return this.store.close();
  }
}

class PgStore {
  readonly root: PgHandle;
  private closed = false;

  constructor(
    private readonly pool: pg.Pool,
    readonly secrets: SecretBox,
  ) {
    this.root = new PgHandle(this, drizzle(pool) as unknown as Query, pool, false);
  }

  get open(): boolean {
    return !this.closed;
  }

  /** A transaction on a connection of its own; read committed, with the rows it must not share locked (FOR UPDATE, SKIP LOCKED). */
  async transaction<T>(fn: (tx: Db) => Promise<T>): Promise<T> {
    const { client, release } = await this.checkout();
    try {
      await client.query('begin');
      try {
        const result = await fn(new PgHandle(this, drizzle(client) as unknown as Query, client, true));
        await client.query('commit');
        return result;
      } catch (err) {
        // A connection that cannot roll back is dropped, not handed to the next caller mid-transaction.
        await client.query('rollback').catch((e: Error) => release.broken(e));
        // The server ended the connection under the transaction (its idle timeout, a restart, a
        // failover): the statement's own error ("not queryable") hides that cause; this names it,
        // so the caller sees a database that may answer again, not a failed step.
        const lost = release.lost();
        if (lost && lost !== err) throw new Error(`the database connection was lost: ${lost.message}`, { cause: lost });
        throw err;
      }
    } finally {
      release();
    }
  }

  /**
   * A connection of the pool for a caller to hold. The server may end it while it is held (an idle
   * transaction past its timeout, a restart): its error is kept, not thrown from an event with no
   * listener (which would end the process), and the connection is dropped when given back.
   */
  private async checkout(): Promise<{ client: pg.PoolClient; release: (() => void) & { broken(err: Error): void; lost(): Error | undefined } }> {
    const client = await this.pool.connect();
    let broken: Error | undefined;
    let lost: Error | undefined;
    const onError = (err: Error) => {
      lost ??= err;
      broken ??= err;
    };
    client.on('error', onError);
    const release = Object.assign(
      () => {
        client.off('error', onError);
        client.release(broken);
      },
      {
        broken: (err: Error) => {
          broken ??= err;
        },
        lost: () => lost,
      },
    );
    return { client, release };
  }

  async hold(name: string): Promise<Hold | null> {
    const { client, release: giveBack } = await this.checkout();
    try {
      const { rows } = await client.query<{ held: boolean }>('select pg_try_advisory_lock(hashtext($1)) as held', [name]);
      if (!rows[0].held) {
        giveBack();
        return null;
      }
    } catch (err) {
      giveBack.broken(err as Error);
      giveBack();
      throw err;
    }
    let released = false;
    return {
      get lost() {
        return giveBack.lost() !== undefined;
      },
      release: async () => {
        if (released) return;
        released = true;
        // A connection that cannot unlock is dropped: its session, and the lock with it, ends.
        await client.query('select pg_advisory_unlock(hashtext($1))', [name]).catch((err: Error) => giveBack.broken(err));
        giveBack();
      },
    };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.pool.end();
  }
}

/** Connects, applies the PostgreSQL migrations (one process at a time) and returns the store. */
export async function openPg(url: string, secrets = new SecretBox(null), idleInTransactionMs = IDLE_IN_TRANSACTION_MS): Promise<Db> {
  const pool = new pg.Pool({
    connectionString: url,
    max: POOL_SIZE,
    types,
    application_name: 'regen',
    // A server that stops answering without closing its connections (a dead host, a failover
    // behind DNS) fails the statement in bounded time, so the API answers 503 and a dispatcher
    // whose heartbeat cannot be written stops, rather than both hanging.
    keepAlive: true,
    connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
    query_timeout: STATEMENT_TIMEOUT_MS,
    statement_timeout: STATEMENT_TIMEOUT_MS,
    idle_in_transaction_session_timeout: idleInTransactionMs,
  });
  // A connection that breaks while idle is dropped by the pool; without a listener its error would end the process.
  pool.on('error', () => {});
  try {
    const client = await pool.connect();
    // Ended by the server meanwhile, the connection fails its next statement; its event must not end the process.
    client.on('error', () => {});
    try {
      await client.query('select pg_advisory_lock($1)', [MIGRATION_LOCK]);
      try {
        await migrate(drizzle(client), { migrationsFolder });
      } finally {
        await client.query('select pg_advisory_unlock($1)', [MIGRATION_LOCK]);
      }
    } finally {
      // Not handed out again with the listener above on it: the pool opens a fresh one when needed.
      client.release(true);
    }
  } catch (err) {
    await pool.end().catch(() => {});
    throw err;
  }
  return new PgStore(pool, secrets).root;
}
