// Deletes what has expired (README "Expiry"): uploaded files past their `expires_after`, and run
// outputs past their `output.expires_after` (a batch's `output_expires_after`) counted from the
// run's finish. The objects go first and the row is marked after, so a crash between the two
// leaves the row due and the next sweep deletes again: deleting a missing object is no error.
import type { Deps } from '../deps.js';
import { shardPage } from '../db/batches.js';
import { dueFileExpiries, markFileExpired } from '../db/files.js';
import { dueOutputExpiries, getRunValidatingFile, markOutputExpired } from '../db/runs.js';
import type { RunRow } from '../db/schema.js';
import { CARD_KEY, isOutputFormat, writesCard } from '../domain/output-format.js';
import { MANIFEST_KEY } from '../domain/output-line.js';

/** Expired rows taken a sweep: a backlog is worked through a page a tick. */
const SWEEP_PAGE = 100;
const SHARDS_PER_QUERY = 500;

export class ExpirySweeper {
  private timer: NodeJS.Timeout | undefined;
  private sweeping: Promise<void> | null = null;
  private stopped = false;

  constructor(private readonly deps: Pick<Deps, 'db' | 'config' | 'logger' | 'clock' | 'stores'>) {}

  start(): void {
    this.schedule(0);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.sweeping;
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.sweeping = this.sweep()
        .catch((err: Error) => this.deps.logger.error({ err: { message: err.message } }, 'expiry sweep failed; tried again on the next'))
        .finally(() => {
          this.sweeping = null;
          this.schedule(this.deps.config.expiryIntervalMs);
        });
    }, ms).unref();
  }

  /** One pass: each due file's content and each due run's output deleted, then marked expired. */
  async sweep(): Promise<void> {
    const { db, clock, logger, stores, config } = this.deps;
    const now = clock();
    // One object that cannot be deleted (a store refusing, a replaced output folder) holds up its own
    // row only: it is logged and tried again on the next sweep, and the rows after it go on.
    const each = async <T>(rows: T[], what: (row: T) => Record<string, unknown>, fn: (row: T) => Promise<void>) => {
      for (const row of rows) {
        await fn(row).catch((err: Error) =>
          logger.warn({ ...what(row), err: { message: err.message } }, 'expired output could not be deleted; tried again on the next sweep'),
        );
      }
    };
    await each(
      await dueFileExpiries(db, now, SWEEP_PAGE),
      (file) => ({ file_id: file.id }),
      async (file) => {
        // A run still reading it (or to read it again after a crash) keeps it until it is validated.
        if (await getRunValidatingFile(db, file.id)) return;
        await stores.forUri(config.outputUri).delete(file.objectKey);
        await markFileExpired(db, file.id, clock());
        logger.info({ file_id: file.id }, 'file expired: content deleted');
      },
    );
    await each(
      await dueOutputExpiries(db, now, SWEEP_PAGE),
      (run) => ({ run_id: run.id }),
      async (run) => {
        await this.deleteOutput(run);
        if (await markOutputExpired(db, run.id, clock())) {
          logger.info({ run_id: run.id, batch_id: run.batchId ?? undefined }, 'run output expired: shards, token rows, manifest and card deleted');
        }
      },
    );
  }

  /** Every object the run wrote: its shards, their error files and token rows, the card, the manifest last (what readers look for first). */
  private async deleteOutput(run: RunRow): Promise<void> {
    const store = this.deps.stores.forOutput(run.outputUri, run.outputFolder);
    for (let after = -1; ; ) {
      const page = await shardPage(this.deps.db, run.id, after, SHARDS_PER_QUERY);
      if (page.length === 0) break;
      for (const shard of page) {
        after = shard.idx;
        for (const key of [shard.key, shard.errorsKey, shard.tokensKey]) if (key) await store.delete(key);
      }
    }
    // Only a run that writes a card owns the name: a plain JSONL run's prefix may hold a README.md of someone else's.
    if (writesCard(isOutputFormat(run.outputFormat) ? run.outputFormat : 'jsonl', run.evalShare, run.outputTokens)) await store.delete(CARD_KEY);
    await store.delete(run.manifestKey ?? MANIFEST_KEY);
  }
}
