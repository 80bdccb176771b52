import { and, eq, sql } from 'drizzle-orm';
import { locked, type Db, type Tables } from './client.js';

export type RunnerLockRow = Tables['runnerLock']['$inferSelect'];

/** The one row of the lock; id 1 always. */
const LOCK_ID = 1;
/** PostgreSQL: the advisory lock two processes starting together queue on, so one reads the row the other wrote. */
const TAKE_LOCK_KEY = 7_240_414;

/** Heartbeats are written and judged in the database's own time on PostgreSQL: replicas' clocks may disagree. */
const PG_NOW_MS = sql<number>`(extract(epoch from clock_timestamp()) * 1000)::bigint`;

/** The time a heartbeat is written and judged in: the database's on PostgreSQL, `clock` on SQLite. */
async function lockClock(db: Db, clock: () => number): Promise<number> {
  if (db.dialect !== 'pg') return clock();
  const { rows } = await db.exec<{ now: number }>('select (extract(epoch from clock_timestamp()) * 1000)::bigint as now');
  return Number(rows[0].now);
}

/**
 * Takes the lock for `owner` unless `refuse(held, now)` says the holder is alive: then returns that
 * holder and changes nothing. One transaction, so two processes starting together cannot both win.
 * The time is read once the row is locked: a take that waited on the row must not write a
 * heartbeat as old as its wait.
 */
export async function takeRunnerLock(
  db: Db,
  holder: Pick<RunnerLockRow, 'owner' | 'pid' | 'hostname'>,
  clock: () => number,
  refuse: (held: RunnerLockRow, now: number) => boolean,
): Promise<RunnerLockRow | null> {
  const { runnerLock } = db.t;
  // A look first, locking nothing: every other replica asks every second, and must not hold up
  // the holder's heartbeat while it lives.
  const [seen] = await db.q.select().from(runnerLock).where(eq(runnerLock.id, LOCK_ID)).limit(1);
  if (seen && refuse(seen, await lockClock(db, clock))) return seen;
  return db.tx(async (tx) => {
    if (tx.dialect === 'pg') await tx.exec('select pg_advisory_xact_lock(?)', [TAKE_LOCK_KEY]);
    const [held] = await locked(tx, tx.q.select().from(runnerLock).where(eq(runnerLock.id, LOCK_ID)).limit(1));
    const now = await lockClock(tx, clock);
    if (held && refuse(held, now)) return held;
    const lock = { ...holder, heartbeatAt: now };
    await tx.q
      .insert(runnerLock)
      .values({ id: LOCK_ID, ...lock })
      .onConflictDoUpdate({ target: runnerLock.id, set: lock });
    return null;
  });
}

/** Renews the lock's heartbeat (in the database's time on PostgreSQL, as of the write); false when another owner holds it now. */
export async function beatRunnerLock(db: Db, owner: string, clock: () => number): Promise<boolean> {
  const { runnerLock } = db.t;
  const beaten = await db.write((w) =>
    w.q
      .update(runnerLock)
      .set({ heartbeatAt: w.dialect === 'pg' ? PG_NOW_MS : clock() })
      .where(and(eq(runnerLock.id, LOCK_ID), eq(runnerLock.owner, owner)))
      .returning({ id: runnerLock.id }),
  );
  return beaten.length > 0;
}

export async function releaseRunnerLock(db: Db, owner: string): Promise<void> {
  const { runnerLock } = db.t;
  await db.write((w) => w.q.delete(runnerLock).where(and(eq(runnerLock.id, LOCK_ID), eq(runnerLock.owner, owner))));
}

/** The lock as it is now: who holds it, and their last heartbeat. */
export async function readRunnerLock(db: Db): Promise<RunnerLockRow | undefined> {
  const { runnerLock } = db.t;
  const [row] = await db.q.select().from(runnerLock).where(eq(runnerLock.id, LOCK_ID)).limit(1);
  return row;
}

/** Who holds the lock now. */
export async function runnerLockOwner(db: Db): Promise<string | undefined> {
  const { runnerLock } = db.t;
  const [row] = await db.q.select({ owner: runnerLock.owner }).from(runnerLock).where(eq(runnerLock.id, LOCK_ID)).limit(1);
  return row?.owner;
}
