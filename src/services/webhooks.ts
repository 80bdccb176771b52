// The webhook deliverer: a small loop on the API thread that sends the outbox's due events, so
// dispatch (on the runner thread) never waits on a receiver. Events are written by whatever
// changed state, in that change's transaction (db/webhooks.ts); this only reads and sends them.
import type { Deps } from '../deps.js';
import { claimDelivery, dueDeliveries, recordAttempt, runWebhookSecret, type DeliveryResult } from '../db/webhooks.js';
import type { WebhookDeliveryRow } from '../db/schema.js';
import { signatureHeaders } from '../domain/webhooks.js';
import { backoffMs, webhookBackoff } from '../domain/backoff.js';

/** How often the outbox is read: an event goes out within this of its commit. */
const POLL_MS = 500;
/** Events out at once: a burst of runs ending together goes out in parallel, no receiver gets a flood. */
const MAX_IN_FLIGHT = 8;
/**
 * How long past its timeout an attempt that never reported keeps its lease: then its process is
 * taken for dead and the event is sent again (by this process after a restart, or another).
 */
const LEASE_MARGIN_MS = 2000;
/** The Standard Webhooks answer for "stop sending": the event is given up at once. */
const GONE = 410;

export class WebhookDeliverer {
  private timer: NodeJS.Timeout | undefined;
  /** The last read filled every free slot: more may be due, so a finished attempt reads again at once. */
  private backlog = false;
  private readonly inFlight = new Set<Promise<void>>();
  private readonly stopping = new AbortController();
  /** The outbox read under way, if any: reads never overlap, a tick during one asks for another after it. */
  private reading: Promise<void> | null = null;
  private readAgain = false;

  constructor(private readonly deps: Pick<Deps, 'db' | 'config' | 'logger' | 'clock' | 'metrics'>) {}

  start(): void {
    this.schedule(0);
  }

  /** Stops reading the outbox and cuts the attempts out short; they are due again at once on the next start. */
  async stop(): Promise<void> {
    this.stopping.abort();
    clearTimeout(this.timer);
    await this.reading;
    await Promise.allSettled([...this.inFlight]);
  }

  private schedule(ms: number): void {
    if (this.stopping.signal.aborted) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.tick(), ms).unref();
  }

  private tick(): void {
    if (this.reading !== null) {
      this.readAgain = true;
      return;
    }
    this.reading = this.read().finally(() => {
      this.reading = null;
      const again = this.readAgain;
      this.readAgain = false;
      this.schedule(again ? 0 : POLL_MS);
    });
  }

  private async read(): Promise<void> {
    const { db, config, logger, clock } = this.deps;
    try {
      const free = MAX_IN_FLIGHT - this.inFlight.size;
      const now = clock();
      const due = free > 0 ? await dueDeliveries(db, now, free) : [];
      this.backlog = free === 0 || due.length === free;
      for (const row of due) {
        if (this.stopping.signal.aborted) return;
        if (!(await claimDelivery(db, row, now + config.webhookTimeoutMs + LEASE_MARGIN_MS))) continue;
        const attempt = this.attempt(row).finally(() => {
          this.inFlight.delete(attempt);
          if (this.backlog) this.schedule(0);
        });
        this.inFlight.add(attempt);
      }
    } catch (err) {
      // A busy database or the like: the outbox keeps the events, the next tick tries again.
      logger.warn({ err: { message: (err as Error).message } }, 'webhook outbox read failed');
    }
  }

  private async attempt(row: WebhookDeliveryRow): Promise<void> {
    const { db, config, logger, clock } = this.deps;
    // A run's own webhook keeps its URL and secret; the server's default is read as it is now, URL
    // and secret together, so an operator who rotates both never has events signed with the new
    // secret sent to the old URL.
    let own: string | null;
    try {
      own = row.runId ? await runWebhookSecret(db, row.runId) : null;
    } catch (err) {
      // Not sent: the lease runs out and the event is tried again.
      logger.warn({ event_id: row.id, err: { message: (err as Error).message } }, 'webhook secret read failed');
      return;
    }
    const target = own
      ? { url: row.url, secret: own }
      : config.webhookUrl && config.webhookSecret
        ? { url: config.webhookUrl, secret: config.webhookSecret }
        : null;
    const result: DeliveryResult = target
      ? await this.send(row, target.url, target.secret)
      : { kind: 'failed', error: 'nowhere to send it: no webhook of its run, and REGEN_WEBHOOK_URL and REGEN_WEBHOOK_SECRET are not set' };
    try {
      await recordAttempt(db, row, result, clock());
    } catch (err) {
      // Not recorded: the lease runs out and the event is sent again, as after a crash.
      logger.warn({ event_id: row.id, err: { message: (err as Error).message } }, 'webhook attempt not recorded');
      return;
    }
    this.deps.metrics.webhookAttempted(result.kind);
    // The URL is not logged: receivers' URLs often carry a token of their own.
    const fields = { event_id: row.id, type: row.type, run_id: row.runId ?? undefined, attempts: row.attempts + 1 };
    if (result.kind === 'delivered') logger.info(fields, 'webhook delivered');
    else if (result.kind === 'failed') logger.warn({ ...fields, error: result.error }, 'webhook given up');
    else logger.info({ ...fields, error: result.error, retry_in_ms: result.at - clock() }, 'webhook attempt failed');
  }

  private async send(row: WebhookDeliveryRow, url: string, secret: string): Promise<DeliveryResult> {
    const { config, clock } = this.deps;
    const attempts = row.attempts + 1;
    const headers = { 'content-type': 'application/json', ...signatureHeaders(secret, row.id, Math.floor(clock() / 1000), row.body) };
    let error: string;
    try {
      // A redirect is not followed: it could lead past the URL rules the webhook was checked against.
      const res = await fetch(url, {
        method: 'POST',
        headers,
        body: row.body,
        redirect: 'manual',
        signal: AbortSignal.any([this.stopping.signal, AbortSignal.timeout(config.webhookTimeoutMs)]),
      });
      await res.body?.cancel();
      if (res.ok) return { kind: 'delivered' };
      if (res.status === GONE) return { kind: 'failed', error: `HTTP ${GONE}: the receiver wants no more events` };
      error = `HTTP ${res.status}`;
    } catch (err) {
      if (this.stopping.signal.aborted) return { kind: 'retry', at: clock(), error: 'regen stopped during the attempt' };
      error = describe(err as Error, config.webhookTimeoutMs);
    }
    if (attempts >= config.webhookMaxAttempts) return { kind: 'failed', error: `${error} (attempt ${attempts} of ${config.webhookMaxAttempts})` };
    return { kind: 'retry', at: clock() + backoffMs(attempts, webhookBackoff(config.webhookRetryMs)), error };
  }
}

/** fetch's own errors name their cause (ECONNREFUSED, a timeout) only underneath. */
function describe(err: Error, timeoutMs: number): string {
  if (err.name === 'TimeoutError') return `no answer within ${timeoutMs} ms`;
  const cause = (err as { cause?: { code?: string; message?: string } }).cause;
  return cause?.code ?? cause?.message ?? err.message;
}
