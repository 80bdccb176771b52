import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

// The simulator runs as this module was loaded: from the TypeScript sources through tsx, or compiled
// (the tests' build, test/support/build.ts) as JavaScript, which starts in a third of the time.
const compiled = import.meta.url.endsWith('.js');
const MAIN = fileURLToPath(new URL(compiled ? './main.js' : './main.ts', import.meta.url));
const NODE_ARGS = compiled ? [MAIN] : ['--import', 'tsx', MAIN];

/** A hung or paused simulator fails a control request (stats, config) after this long instead of never. */
const CONTROL_TIMEOUT_MS = 10_000;

export interface SimProcess {
  url: string;
  port: number;
  proc: ChildProcess;
  /** SIGTERM, then SIGKILL if it has not exited within a second. */
  stop(): Promise<void>;
  /** Changes the simulator's knobs while it runs (POST /sim/config). */
  configure(patch: Record<string, number | string>): Promise<void>;
  stats(): Promise<Record<string, number>>;
  /** The final stats a drain (SIGTERM) printed before the process exited; null until then. */
  drained(): Record<string, number> | null;
}

/** Starts `regen sim` as its own process and resolves once it prints its listening line. */
export async function spawnSimulator(flags: Record<string, string | number> = {}): Promise<SimProcess> {
  const args = Object.entries({ port: 0, ...flags }).flatMap(([k, v]) => [`--${k}`, String(v)]);
  const proc = spawn(process.execPath, [...NODE_ARGS, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  proc.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-2000)));
  const lines = createInterface({ input: proc.stdout! });
  let drained: Record<string, number> | null = null;
  lines.on('line', (line) => {
    try {
      const msg = JSON.parse(line) as { event?: string; stats?: Record<string, number> };
      if (msg.event === 'drained' && msg.stats) drained = msg.stats;
    } catch {
      /* not an event line */
    }
  });
  const listening = await new Promise<{ url: string; port: number }>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`simulator did not start: ${stderr}`)), 30_000);
    lines.on('line', (line) => {
      try {
        const msg = JSON.parse(line) as { event?: string; url: string; port: number };
        if (msg.event === 'listening') {
          clearTimeout(timer);
          resolve(msg);
        }
      } catch {
        /* not the listening line */
      }
    });
    proc.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`simulator exited with code ${code}: ${stderr}`));
    });
  });
  return {
    ...listening,
    proc,
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      const exited = once(proc, 'exit');
      proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), 1000);
      await exited;
      clearTimeout(timer);
    },
    async configure(patch) {
      const res = await control(listening.url, '/sim/config', { method: 'POST', body: JSON.stringify(patch), headers: { 'content-type': 'application/json' } });
      if (!res.ok) throw new Error(`sim config rejected: ${await res.text()}`);
    },
    drained: () => drained,
    async stats() {
      return (await (await control(listening.url, '/sim/stats')).json()) as Record<string, number>;
    },
  };
}

/** A control request to the simulator at `url`, failing with what it asked of whom after CONTROL_TIMEOUT_MS. */
async function control(url: string, path: string, init: RequestInit = {}): Promise<Response> {
  try {
    return await fetch(`${url}${path}`, { ...init, signal: AbortSignal.timeout(CONTROL_TIMEOUT_MS) });
  } catch (err) {
    if ((err as Error).name === 'TimeoutError')
      throw new Error(`the simulator at ${url} did not answer ${path} within ${CONTROL_TIMEOUT_MS} ms`, { cause: err });
    throw err;
  }
}
