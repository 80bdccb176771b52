import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { createServer, request, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createRequire } from 'node:module';
import { connect, createServer as createNetServer, type AddressInfo, type Server as NetServer, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';

// s3rver ships no types; it is only started and stopped here.
const S3rver = createRequire(import.meta.url)('s3rver');

/** The credentials s3rver accepts, as the standard AWS variables a server reads. */
export const S3RVER_AWS = { AWS_ACCESS_KEY_ID: 'S3RVER', AWS_SECRET_ACCESS_KEY: 'S3RVER', AWS_REGION: 'us-east-1' };

export interface S3Server {
  url: string;
  port: number;
  /** Closes the listener and every open connection, as a store that goes away would. */
  stop(): Promise<void>;
}

/**
 * s3rver on loopback with `bucket` created; `port` reuses a port (a store coming back), 0 picks one.
 * `anySecret` accepts requests signed with any secret key, so a test can use a secret of its own.
 */
export async function startS3(directory: string, bucket: string, port = 0, opts: { anySecret?: boolean } = {}): Promise<S3Server> {
  const s3 = new S3rver({
    address: '127.0.0.1',
    port,
    silent: true,
    directory,
    configureBuckets: [{ name: bucket, configs: [] }],
    allowMismatchedSignatures: opts.anySecret ?? false,
  });
  const addr = (await s3.run()) as AddressInfo;
  return {
    url: `http://127.0.0.1:${addr.port}`,
    port: addr.port,
    async stop() {
      const http = s3.httpServer as Server;
      const closed = s3.close();
      http.closeAllConnections();
      await closed;
    },
  };
}

export interface Hold {
  /** Resolves when a matching request has arrived and is being held. */
  arrived: Promise<string>;
  /** Lets the held request through. */
  release(): void;
}

/**
 * An HTTP proxy in front of an object store that can hold one matching request (a shard PUT, a
 * manifest read-back) until released, so a test can kill the server at exactly that point. A held
 * request whose client dies is dropped, never forwarded: it died with the process that sent it.
 */
export class HoldingProxy {
  private server!: Server;
  private holds: { match: RegExp; method: string; arrive: (what: string) => void; released: Promise<void>; release: () => void; used: boolean }[] = [];
  url = '';

  constructor(private readonly upstream: { host: string; port: number }) {}

  async start(): Promise<this> {
    this.server = createServer((req, res) => void this.handle(req, res));
    this.server.listen(0, '127.0.0.1');
    await once(this.server, 'listening');
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  hold(method: string, match: RegExp): Hold {
    let arrive!: (what: string) => void;
    let release!: () => void;
    const arrived = new Promise<string>((r) => (arrive = r));
    const released = new Promise<void>((r) => (release = r));
    this.holds.push({ method, match, arrive, released, release, used: false });
    return { arrived, release };
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?')[0];
    const hold = this.holds.find((h) => !h.used && h.method === req.method && h.match.test(path));
    if (hold) {
      hold.used = true;
      hold.arrive(`${req.method} ${path}`);
      const gone = new Promise<boolean>((r) => res.once('close', () => r(true)));
      const dead = await Promise.race([hold.released.then(() => false), gone]);
      if (dead) return;
    }
    const up = request({ ...this.upstream, method: req.method, path: req.url, headers: req.headers }, (upRes) => {
      res.writeHead(upRes.statusCode ?? 502, upRes.headers);
      upRes.pipe(res);
    });
    up.on('error', () => res.destroy());
    res.on('close', () => up.destroy());
    req.pipe(up);
  }

  async close(): Promise<void> {
    for (const h of this.holds) h.release();
    const closed = new Promise((r) => this.server.close(r));
    this.server.closeAllConnections();
    await closed;
  }
}

/** Peak resident memory of a process so far, in MiB (VmHWM). */
export function peakRssMiB(pid: number): number {
  const m = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error('no VmHWM in /proc status');
  return Number(m[1]) / 1024;
}

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

// CommonJS so `require` resolves better-sqlite3 from the project root (the cwd).
const LOCK_SCRIPT = `
const Database = require('better-sqlite3');
const [path, ms, waitForGo] = process.argv.slice(1);
const db = new Database(path);
db.pragma('busy_timeout = 30000');
if (waitForGo === 'wait') {
  // Ready and loaded: the lock is taken the moment the test says so, not after a process start.
  process.stdout.write('ready\\n');
  require('fs').readSync(0, Buffer.alloc(1));
}
db.exec('BEGIN IMMEDIATE');
process.stdout.write('locked\\n');
Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, Number(ms));
db.exec('COMMIT');
db.close();
process.stdout.write('released\\n');
`;

export interface DbLock {
  proc: ChildProcess;
  /** With `onSignal`: resolves once the process is loaded and waits for go(). */
  ready: Promise<void>;
  /** With `onSignal`: takes the lock now. */
  go(): void;
  /** Resolves once the other process holds the write lock. */
  locked: Promise<void>;
  /** Resolves once it has committed and exited. */
  released: Promise<void>;
}

/**
 * Another process takes SQLite's write lock on `dbPath` (BEGIN IMMEDIATE) and keeps it for `ms`;
 * with `onSignal`, it loads and then waits for go() before taking it.
 */
export function holdWriteLock(dbPath: string, ms: number, opts: { onSignal?: boolean } = {}): DbLock {
  const args = ['-e', LOCK_SCRIPT, dbPath, String(ms), opts.onSignal ? 'wait' : 'now'];
  const proc = spawn(process.execPath, args, { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  proc.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  let ready!: () => void;
  const isReady = new Promise<void>((r) => (ready = r));
  const locked = new Promise<void>((resolve, reject) => {
    proc.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('ready\n')) ready();
      if (out.includes('locked\n')) resolve();
    });
    proc.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`lock holder exited ${code}: ${err}`))));
  });
  const released = new Promise<void>((resolve, reject) => {
    proc.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`lock holder exited ${code}: ${err}`))));
  });
  return { proc, ready: isReady, go: () => proc.stdin!.end('g'), locked, released };
}

/** Milliseconds since `t0`, rounded, for the figures a test reports. */
export const since = (t0: number) => Math.round(performance.now() - t0);

/** PostgreSQL's request codes for encryption, sent before the startup message in its place. */
const PG_ENCRYPTION_REQUESTS = new Set([80877103, 80877104]);

/**
 * Counts the round trips in what a PostgreSQL client sends: each simple query ('Q') and each Sync
 * ('S', which ends an extended-protocol exchange: parse, bind, execute) waits for the server's
 * ReadyForQuery. The messages are read by their lengths across chunk boundaries; the first ones
 * (startup, or a request for encryption before it) have no type byte.
 */
function pgRoundTripCounter(counted: () => void): (chunk: Buffer) => void {
  let typed = false;
  let header = Buffer.alloc(0);
  let skip = 0;
  return (chunk) => {
    let i = 0;
    while (i < chunk.length) {
      if (skip > 0) {
        const n = Math.min(skip, chunk.length - i);
        skip -= n;
        i += n;
        continue;
      }
      const need = typed ? 5 : 8;
      const take = Math.min(need - header.length, chunk.length - i);
      header = Buffer.concat([header, chunk.subarray(i, i + take)]);
      i += take;
      if (header.length < need) return;
      if (typed) {
        if (header[0] === 0x51 || header[0] === 0x53) counted();
        skip = header.readInt32BE(1) - 4;
      } else {
        skip = header.readInt32BE(0) - 8;
        typed = !PG_ENCRYPTION_REQUESTS.has(header.readInt32BE(4));
      }
      header = Buffer.alloc(0);
    }
  };
}

/**
 * A TCP proxy in front of a database server that can cut every connection through it and refuse
 * new ones until restored: what a database failover looks like from its clients (connections
 * reset, then refused until the new primary answers at the same address). It counts the round
 * trips its clients make (the bench's figure per sample).
 */
export class CuttingProxy {
  private server!: NetServer;
  private readonly sockets = new Set<Socket>();
  private down = false;
  private trap: { marker: string; sprung: () => void } | null = null;
  port = 0;
  /** Queries and extended-protocol exchanges sent through the proxy so far. */
  roundTrips = 0;

  constructor(private readonly upstream: { host: string; port: number }) {}

  async start(): Promise<this> {
    this.server = createNetServer((client) => {
      if (this.down) return void client.destroy();
      const up = connect(this.upstream);
      for (const s of [client, up]) {
        this.sockets.add(s);
        s.on('close', () => this.sockets.delete(s));
        s.on('error', () => {});
      }
      client.on('close', () => up.destroy());
      up.on('close', () => client.destroy());
      // A transaction on this connection sent the trap's marker; its commit is let through and its answer lost.
      let marked = false;
      let committing = false;
      const count = pgRoundTripCounter(() => this.roundTrips++);
      client.on('data', (chunk: Buffer) => {
        count(chunk);
        if (this.trap && !committing) {
          const text = chunk.toString('latin1');
          if (text.includes(this.trap.marker)) marked = true;
          else if (marked && /\brollback\b/i.test(text)) marked = false;
          else if (marked && /\bcommit\b/i.test(text)) committing = true;
        }
        up.write(chunk);
      });
      up.on('data', (chunk: Buffer) => {
        if (!committing) return void client.write(chunk);
        // The server answered the commit: it is made. The client never hears so.
        const trap = this.trap;
        this.trap = null;
        committing = false;
        this.cut();
        trap?.sprung();
      });
    });
    this.server.listen(0, '127.0.0.1');
    await once(this.server, 'listening');
    this.port = (this.server.address() as AddressInfo).port;
    return this;
  }

  /**
   * The next transaction that sends `marker` (a statement's text) commits on the server, and the
   * connections are cut before its answer reaches the client, as in a failover at the moment of a
   * commit: the client cannot tell whether it was made. New connections are refused until
   * restore(). Resolves once it happened.
   */
  loseCommitOf(marker: string): Promise<void> {
    return new Promise((sprung) => {
      this.trap = { marker, sprung };
    });
  }

  /** Resets every connection through the proxy, and every one opened until restore(). */
  cut(): void {
    this.down = true;
    for (const s of this.sockets) s.destroy();
  }

  restore(): void {
    this.down = false;
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise((r) => this.server.close(r));
  }
}
