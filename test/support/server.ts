import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import type { Config } from '../../src/config.js';
import type * as ConfigModule from '../../src/config.js';
import type * as LoggerModule from '../../src/logger.js';
import type * as ServerModule from '../../src/server.js';
import type { Server } from '../../src/server.js';
import { loadSource, nodeEntry } from './build.js';
import { storeEnv } from './store.js';

// The server as this run compiled it (test/support/build.ts), loaded as Node loads it, with the
// runner thread it starts; under `npm run bench`, the sources through tsx.
const { startServer } = await loadSource<typeof ServerModule>('src/server.ts');
const { loadConfig } = await loadSource<typeof ConfigModule>('src/config.ts');
const { makeLogger } = await loadSource<typeof LoggerModule>('src/logger.ts');

export function tempDir(prefix = 'regen-test-'): { dir: string; cleanup(): void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/** A real server in this process on a free loopback port, with its own data folder. */
export async function startTestServer(env: Record<string, string> = {}, dataDir?: string): Promise<Server & { config: Config; cleanup(): Promise<void> }> {
  const tmp = dataDir ? null : tempDir();
  const data = dataDir ?? tmp!.dir;
  const config = loadConfig({ REGEN_LOG_LEVEL: 'silent', REGEN_PROBE_INTERVAL_MS: '200', ...(await storeEnv(data)), ...env }, { data, port: '0' });
  const server = await startServer(config, { logger: makeLogger(config.logLevel) });
  return {
    ...server,
    config,
    async cleanup() {
      await server.close(2000);
      tmp?.cleanup();
    },
  };
}

/** `node ...REGEN, ...args` runs `regen`: this run's compiled tree in the suite, bin/regen.js under `npm run bench`. */
export const REGEN = nodeEntry('src/cli/main.ts');
/** How long `regen serve` may take to listen: a loaded 2-core machine has taken over 30 s to load it. */
const SERVER_START_MS = 90_000;

export interface ServerProcess {
  url: string;
  proc: ChildProcess;
  /** Everything the process wrote, stdout and stderr. */
  output(): string;
  kill(signal?: NodeJS.Signals): Promise<number | null>;
}

/** `regen serve` as its own process, for crash and signal tests. Resolves once it listens. `regen`: how `node` runs it. */
export async function spawnServer(dataDir: string, env: Record<string, string> = {}, regen: string[] = REGEN): Promise<ServerProcess> {
  const proc = spawn(process.execPath, [...regen, 'serve', '--port', '0', '--data', dataDir], {
    env: { ...process.env, REGEN_LOG_LEVEL: 'info', REGEN_PROBE_INTERVAL_MS: '200', ...(await storeEnv(dataDir)), ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  proc.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  const lines = createInterface({ input: proc.stdout! });
  const url = await new Promise<string>((resolve, reject) => {
    // A server that never said it listens is stopped here: nobody else holds it.
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error(`server did not start:\n${out}`));
    }, SERVER_START_MS);
    lines.on('line', (line) => {
      out += line + '\n';
      try {
        const msg = JSON.parse(line) as { msg?: string; url?: string };
        if (msg.msg === 'regen listening' && msg.url) {
          clearTimeout(timer);
          resolve(msg.url);
        }
      } catch {
        /* not JSON */
      }
    });
    // 'close', not 'exit': the last lines it wrote may still be in its pipes when it exits.
    proc.once('close', (code) => {
      clearTimeout(timer);
      reject(new Error(`server exited with ${code}:\n${out}`));
    });
  });
  return {
    url,
    proc,
    output: () => out,
    async kill(signal: NodeJS.Signals = 'SIGKILL') {
      if (proc.exitCode !== null || proc.signalCode !== null) return proc.exitCode;
      const exited = once(proc, 'exit');
      proc.kill(signal);
      const [code] = (await exited) as [number | null];
      return code;
    },
  };
}

/** fetch + JSON with the status kept, for assertions. */
export async function call<T = any>(
  base: string,
  path: string,
  init: RequestInit & { json?: unknown } = {},
): Promise<{ status: number; body: T; headers: Headers }> {
  const { json, ...rest } = init;
  const res = await fetch(base + path, {
    ...rest,
    ...(json !== undefined ? { body: JSON.stringify(json), headers: { 'content-type': 'application/json', ...(rest.headers ?? {}) } } : {}),
  });
  const text = await res.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: res.status, body: body as T, headers: res.headers };
}

/** Polls until `check` returns a value other than undefined, or fails after `ms`. */
export async function waitFor<T>(what: string, check: () => Promise<T | undefined> | T | undefined, ms = 60_000, every = 100): Promise<T> {
  const deadline = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${(last as Error).message}` : ''}`);
    await new Promise((r) => setTimeout(r, every));
  }
}
