import { and, eq } from 'drizzle-orm';
import { type Db, IMMEDIATE } from './client.js';
import { runnerLock } from './schema.js';

export type RunnerLockRow = typeof runnerLock.$inferSelect;

/** The one row of the lock; id 1 always. */
const LOCK_ID = 1;

/**
 * Takes the lock for `owner` unless `refuse(held)` says the holder is alive: then returns that
 * holder and changes nothing. One transaction, so two processes starting together cannot both win.
 */
export function takeRunnerLock(db: Db, lock: Omit<RunnerLockRow, 'id'>, refuse: (held: RunnerLockRow) => boolean): RunnerLockRow | null {
  return db.transaction((tx) => {
    const held = tx.select().from(runnerLock).where(eq(runnerLock.id, LOCK_ID)).get();
    if (held && refuse(held)) return held;
    tx.insert(runnerLock)
      .values({ id: LOCK_ID, ...lock })
      .onConflictDoUpdate({ target: runnerLock.id, set: lock })
      .run();
    return null;
  }, IMMEDIATE);
}

/** Renews the lock's heartbeat; false when another owner holds it now. */
export function beatRunnerLock(db: Db, owner: string, now: number): boolean {
  return (
    db
      .update(runnerLock)
      .set({ heartbeatAt: now })
      .where(and(eq(runnerLock.id, LOCK_ID), eq(runnerLock.owner, owner)))
      .run().changes > 0
  );
}

export function releaseRunnerLock(db: Db, owner: string): void {
  db.delete(runnerLock)
    .where(and(eq(runnerLock.id, LOCK_ID), eq(runnerLock.owner, owner)))
    .run();
}
