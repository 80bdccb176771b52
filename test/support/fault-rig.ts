import { afterAll } from 'vitest';
import { spawnSimulator, type SimProcess } from './sim.js';
import { Stores } from '../../src/storage/index.js';
import { HoldingProxy, S3RVER_AWS, startS3, type S3Server } from './faults.js';
import { setEnv } from './env.js';
import { call, spawnServer, tempDir, waitFor, type ServerProcess } from './server.js';
import { checkOutput, makePrompts, registerEndpoint, uploadFile, waitForStatus, type OutputCheck, type Prompts } from './runner-checks.js';

// What the fault tests and their soak variants share: the processes they start and stop, and the
// waits and checks they make on a run before and after each fault.

/** Validated, and nothing left waiting to be sent (the run's total is 0 while it validates). */
export const allSent = (run: any): boolean => run.request_counts.total > 0 && run.request_counts.pending === 0;

/** Samples of a run that reached an end: completed, failed or cancelled. */
export const doneOf = (run: any): number => run.request_counts.completed + run.request_counts.failed + run.request_counts.cancelled;

/** About 2 s a request and 200 at once on each simulator: hundreds of requests in flight at a signal. */
export const SLOW_SIM = { 'max-running': 200, 'ttft-ms': 2000, 'tokens-per-second': 10_000 };

/** A server's environment for writing its output to `bucket` through `endpoint` (s3rver, or a proxy in front of it). */
export const s3ServerEnv = (endpoint: string, bucket: string): Record<string, string> => ({
  ...S3RVER_AWS,
  REGEN_S3_ENDPOINT: endpoint,
  REGEN_S3_FORCE_PATH_STYLE: 'true',
  REGEN_OUTPUT_URI: `s3://${bucket}/regen/`,
});

/** Waits until the run stops moving (completed, failed, paused or cancelled) and returns it. */
export const waitForEnd = (base: string, id: string, ms?: number): Promise<any> => waitForStatus(base, id, ['completed', 'failed', 'paused', 'cancelled'], ms);

/** Polls the run until `ok` holds for it; returns the run as it was then. */
export function waitForRun(base: string, id: string, what: string, ok: (run: any) => boolean, ms?: number, every?: number): Promise<any> {
  return waitFor(
    what,
    async () => {
      const run = (await call(base, `/v1/runs/${id}`)).body;
      return ok(run) ? run : undefined;
    },
    ms,
    every,
  );
}

/** Polls /readyz until it answers `status`; returns that answer. */
export function waitForReadyz(base: string, status: number, ms: number): Promise<{ status: number; body: any }> {
  return waitFor(
    `/readyz ${status}`,
    async () => {
      const res = await call(base, '/readyz');
      return res.status === status ? res : undefined;
    },
    ms,
  );
}

/** The simulators' counters (requests, running, completed, aborted…) summed, from one look at each. */
export async function simTotals(sims: SimProcess[]): Promise<Record<string, number>> {
  const totals: Record<string, number> = {};
  for (const stats of await Promise.all(sims.map((s) => s.stats()))) {
    for (const [k, v] of Object.entries(stats)) totals[k] = (totals[k] ?? 0) + v;
  }
  return totals;
}

/** Registers each simulator as an endpoint and uploads `n` prompts tagged `tag`, ready for a run. */
export async function preparePrompts(
  base: string,
  sims: SimProcess[],
  n: number,
  tag: string,
): Promise<{ prompts: Prompts; fileId: string; endpoints: any[] }> {
  const endpoints: any[] = [];
  for (const s of sims) endpoints.push(await registerEndpoint(base, s.url));
  const prompts = makePrompts(n, tag);
  return { prompts, fileId: await uploadFile(base, prompts.jsonl), endpoints };
}

/** checkOutput on a finished run's output, read from s3rver at `s3Endpoint`, or from local files without it. */
export async function readOutput(run: any, prompts: Prompts, s3Endpoint?: string): Promise<OutputCheck> {
  const stores = new Stores(s3Endpoint ? { endpoint: s3Endpoint, forcePathStyle: true } : { forcePathStyle: false });
  try {
    return await checkOutput(stores.forUri(run.output_uri), prompts.expected);
  } finally {
    stores.close();
  }
}

/**
 * Everything a fault test starts, stopped after its tests whatever happened: simulators, servers
 * (a test restarts its server as it goes), s3rver and a proxy in front of it, temp folders, and
 * process.env put back. Call it at the top of a test file or describe block.
 */
export function faultRig(): FaultRig {
  const rig = new FaultRig();
  afterAll(() => rig.stop());
  return rig;
}

export class FaultRig {
  readonly sims: SimProcess[] = [];
  s3: S3Server | null = null;
  proxy: HoldingProxy | null = null;
  private readonly servers: ServerProcess[] = [];
  private readonly dirs: { cleanup(): void }[] = [];
  private s3dir = '';
  private readonly restoreEnv: (() => void)[] = [];

  /** A temp folder, removed at the end. */
  dir(prefix: string): string {
    const d = tempDir(prefix);
    this.dirs.push(d);
    return d.dir;
  }

  async sim(flags: Record<string, string | number>): Promise<SimProcess> {
    const s = await spawnSimulator(flags);
    this.sims.push(s);
    return s;
  }

  /** `regen serve` on `dataDir` as its own process; SIGKILLed at the end if still running. */
  async serve(dataDir: string, env: Record<string, string> = {}): Promise<ServerProcess> {
    const server = await spawnServer(dataDir, env);
    this.servers.push(server);
    return server;
  }

  /**
   * s3rver with `bucket`; with `port`, back on that port with the objects it had (a store coming
   * back). Sets the AWS variables in this process too, for the test's own S3 clients.
   */
  async startS3(bucket: string, port = 0): Promise<S3Server> {
    this.s3dir ||= this.dir(`regen-s3rver-${bucket}-`);
    this.s3 = await startS3(this.s3dir, bucket, port);
    this.restoreEnv.push(setEnv(S3RVER_AWS));
    return this.s3;
  }

  /** s3rver with `bucket`, and a HoldingProxy in front of it for the server to write through. */
  async startHeldS3(bucket: string): Promise<{ s3: S3Server; proxy: HoldingProxy }> {
    const s3 = await this.startS3(bucket);
    this.proxy = await new HoldingProxy({ host: '127.0.0.1', port: s3.port }).start();
    return { s3, proxy: this.proxy };
  }

  async stop(): Promise<void> {
    for (const s of this.servers) await s.kill('SIGKILL');
    await Promise.all(this.sims.map((s) => s.stop()));
    await this.proxy?.close();
    // An outage test may end with the store already stopped.
    await this.s3?.stop().catch(() => {});
    for (const restore of this.restoreEnv.reverse()) restore();
    for (const d of this.dirs) d.cleanup();
  }
}
