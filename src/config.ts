import { z } from 'zod';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { urlProblem } from './domain/endpoint-url.js';
import { isWebhookSecret, SECRET_MESSAGE } from './domain/webhooks.js';

const int = (min: number, max: number) =>
  z
    .string()
    .regex(/^\d+$/, `expected a whole number from ${min} to ${max}`)
    .transform(Number)
    .pipe(z.number().int().min(min, `expected a whole number from ${min} to ${max}`).max(max, `expected a whole number from ${min} to ${max}`));
const bool = z.enum(['true', 'false', '1', '0', 'yes', 'no']).transform((v) => ['true', '1', 'yes'].includes(v));
const list = z.string().transform((v) =>
  v
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean),
);
const webhookUrl = z.string().superRefine((v, ctx) => {
  const problem = urlProblem(v);
  if (problem) ctx.addIssue({ code: 'custom', message: problem });
});
const webhookSecret = z.string().refine(isWebhookSecret, SECRET_MESSAGE);
// AES-256's key, as `openssl rand -base64 32` prints it (src/db/secrets.ts).
const secretKey = z.string().regex(/^[A-Za-z0-9+/]{43}=$/, 'expected the base64 of 32 random bytes (openssl rand -base64 32)');
const postgresUrl = z.string().refine((v) => /^postgres(ql)?:\/\/\S+$/.test(v), 'expected postgres://user@host:port/database');
const uri = z.string().refine((v) => /^(s3:\/\/[^/]+\/|file:\/\/\/)/.test(v), 'expected s3://bucket/prefix/ or file:///absolute/path/');

// Each setting: its env var, its `regen serve` flag, how to parse it, and its default.
const settings = {
  port: { env: 'REGEN_PORT', flag: 'port', parse: int(0, 65535), default: '8080' },
  host: { env: 'REGEN_HOST', flag: 'host', parse: z.string().min(1), default: '127.0.0.1' },
  dataDir: { env: 'REGEN_DATA', flag: 'data', parse: z.string().min(1), default: './data' },
  // Secret as far as error messages go: the URL may carry a password.
  databaseUrl: { env: 'REGEN_DATABASE_URL', flag: undefined, parse: postgresUrl, default: undefined, secret: true },
  outputUri: { env: 'REGEN_OUTPUT_URI', flag: 'output-uri', parse: uri, default: undefined },
  inputRoots: { env: 'REGEN_INPUT_ROOTS', flag: 'input-roots', parse: list, default: '' },
  apiTokens: { env: 'REGEN_API_TOKENS', flag: undefined, parse: list, default: '' },
  allowPublicBind: { env: 'REGEN_ALLOW_PUBLIC_BIND', flag: undefined, parse: bool, default: 'false' },
  runner: { env: 'REGEN_RUNNER', flag: undefined, parse: bool, default: 'true' },
  runnerThread: { env: 'REGEN_RUNNER_THREAD', flag: undefined, parse: bool, default: 'true' },
  requestTimeoutMs: { env: 'REGEN_REQUEST_TIMEOUT_MS', flag: undefined, parse: int(100, 86_400_000), default: '600000' },
  maxAttempts: { env: 'REGEN_MAX_ATTEMPTS', flag: undefined, parse: int(1, 100), default: '5' },
  maxServerFaults: { env: 'REGEN_MAX_SERVER_FAULTS', flag: undefined, parse: int(1, 1000), default: '20' },
  requestRetryMs: { env: 'REGEN_REQUEST_RETRY_MS', flag: undefined, parse: int(10, 600_000), default: '500' },
  healthTimeoutMs: { env: 'REGEN_HEALTH_TIMEOUT_MS', flag: undefined, parse: int(100, 600_000), default: '25000' },
  unhealthyAfterProbes: { env: 'REGEN_UNHEALTHY_AFTER_PROBES', flag: undefined, parse: int(1, 100), default: '3' },
  adaptiveConcurrency: { env: 'REGEN_ADAPTIVE_CONCURRENCY', flag: undefined, parse: bool, default: 'true' },
  // `off` sends a sample whose prompt is cached on one endpoint wherever a slot is free first (the least-loaded choice).
  affinity: { env: 'REGEN_AFFINITY', flag: undefined, parse: z.enum(['on', 'off']).transform((v) => v === 'on'), default: 'on' },
  loadIntervalMs: { env: 'REGEN_LOAD_INTERVAL_MS', flag: undefined, parse: int(50, 600_000), default: '1000' },
  // Others' traffic comes and goes within a second: at 250 ms people waited for slots regen took in between (`npm run bench share`).
  sharedLoadIntervalMs: { env: 'REGEN_SHARED_LOAD_INTERVAL_MS', flag: undefined, parse: int(50, 600_000), default: '100' },
  shardSize: { env: 'REGEN_SHARD_SIZE', flag: undefined, parse: int(1, 1_000_000), default: '1000' },
  defaultConcurrency: { env: 'REGEN_DEFAULT_CONCURRENCY', flag: undefined, parse: int(1, 100_000), default: '32' },
  probeIntervalMs: { env: 'REGEN_PROBE_INTERVAL_MS', flag: undefined, parse: int(50, 600_000), default: '5000' },
  shutdownGraceMs: { env: 'REGEN_SHUTDOWN_GRACE_MS', flag: undefined, parse: int(0, 3_600_000), default: '30000' },
  maxBodyBytes: { env: 'REGEN_MAX_BODY_BYTES', flag: undefined, parse: int(1024, 1 << 30), default: String(10 << 20) },
  maxLineBytes: { env: 'REGEN_MAX_LINE_BYTES', flag: undefined, parse: int(1024, 1 << 30), default: String(16 << 20) },
  // Far above what healthy answers hold at once (4 KB each, thousands in flight), and low enough that 64 endless answers stay under 1 GiB of RSS.
  answerBufferBytes: { env: 'REGEN_ANSWER_BUFFER_BYTES', flag: undefined, parse: int(1 << 20, 2 ** 40), default: String(256 << 20) },
  storeRetryMs: { env: 'REGEN_STORE_RETRY_MS', flag: undefined, parse: int(10, 600_000), default: '2000' },
  dbBusyTimeoutMs: { env: 'REGEN_DB_BUSY_TIMEOUT_MS', flag: undefined, parse: int(0, 600_000), default: '10000' },
  // How long a replica's heartbeat, or the runner lock's, may be silent before another process takes
  // it for dead; the heartbeats, the send fence and the idle-transaction limit scale with it
  // (src/runner/lock.ts). At least 6 s: the fence, a third of it, then spans two replica beats (1 s each).
  replicaStaleMs: { env: 'REGEN_REPLICA_STALE_MS', flag: undefined, parse: int(6000, 3_600_000), default: '15000' },
  logLevel: {
    env: 'REGEN_LOG_LEVEL',
    flag: 'log-level',
    parse: z.enum(['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent']),
    default: 'info',
  },
  s3Endpoint: { env: 'REGEN_S3_ENDPOINT', flag: undefined, parse: z.url(), default: undefined },
  s3ForcePathStyle: { env: 'REGEN_S3_FORCE_PATH_STYLE', flag: undefined, parse: bool, default: 'false' },
  // Secret as far as error messages go: a receiver's URL often carries a token of its own.
  webhookUrl: { env: 'REGEN_WEBHOOK_URL', flag: undefined, parse: webhookUrl, default: undefined, secret: true },
  webhookSecret: { env: 'REGEN_WEBHOOK_SECRET', flag: undefined, parse: webhookSecret, default: undefined, secret: true },
  // Standard Webhooks recommends a timeout of 15 to 30 s.
  webhookTimeoutMs: { env: 'REGEN_WEBHOOK_TIMEOUT_MS', flag: undefined, parse: int(100, 300_000), default: '15000' },
  webhookRetryMs: { env: 'REGEN_WEBHOOK_RETRY_MS', flag: undefined, parse: int(10, 3_600_000), default: '5000' },
  // How often expired files and run outputs are looked for and deleted (README "Expiry").
  expiryIntervalMs: { env: 'REGEN_EXPIRY_INTERVAL_MS', flag: undefined, parse: int(50, 3_600_000), default: '10000' },
  // Tests only: the shortest `expires_after` taken, below OpenAI's 3,600 s, so expiry can be seen in seconds.
  minExpirySeconds: { env: 'REGEN_MIN_EXPIRY_SECONDS', flag: undefined, parse: int(1, 3600), default: '3600' },
  webhookMaxAttempts: { env: 'REGEN_WEBHOOK_MAX_ATTEMPTS', flag: undefined, parse: int(1, 1000), default: '30' },
  secretKey: { env: 'REGEN_SECRET_KEY', flag: undefined, parse: secretKey, default: undefined, secret: true },
} as const;

type Settings = typeof settings;
type Parsed = { [K in keyof Settings]: z.output<Settings[K]['parse']> | (Settings[K]['default'] extends undefined ? undefined : never) };
export type Config = Parsed & {
  dbPath: string;
  outputUri: string;
  /** What openDb opens: REGEN_DATABASE_URL when set, else the SQLite file in the data folder. */
  store: string;
};

export class ConfigError extends Error {}

/** Reads every REGEN_* setting (a flag wins over its env var); throws one line naming each bad value. */
export function loadConfig(env: NodeJS.ProcessEnv, flags: Record<string, string | undefined> = {}): Config {
  const out: Record<string, unknown> = {};
  const problems: string[] = [];
  for (const [key, s] of Object.entries(settings)) {
    const fromFlag = s.flag ? flags[s.flag] : undefined;
    const raw = fromFlag ?? env[s.env] ?? s.default;
    if (raw === undefined) continue;
    const parsed = (s.parse as z.ZodType).safeParse(raw);
    if (parsed.success) out[key] = parsed.data;
    else {
      const source = fromFlag !== undefined ? `--${s.flag}` : s.env;
      const got = 'secret' in s ? 'the value is not shown' : `got ${JSON.stringify(String(raw).slice(0, 80))}`;
      problems.push(`${source}: ${parsed.error.issues[0]?.message ?? 'invalid value'} (${got})`);
    }
  }
  // Every event is signed: a default URL without its secret could only send unsigned ones.
  if ((out.webhookUrl === undefined) !== (out.webhookSecret === undefined) && !problems.length) {
    problems.push('REGEN_WEBHOOK_URL and REGEN_WEBHOOK_SECRET: set both, or neither');
  }
  if (problems.length) throw new ConfigError(problems.join('\n'));
  const dataDir = resolve(out.dataDir as string);
  const outputUri = (out.outputUri as string | undefined) ?? pathToFileURL(resolve(dataDir, 'objects')).href + '/';
  return {
    ...(out as Parsed),
    dataDir,
    outputUri: outputUri.endsWith('/') ? outputUri : outputUri + '/',
    inputRoots: (out.inputRoots as string[]).map((r) => resolve(r)),
    dbPath: resolve(dataDir, 'regen.db'),
    store: (out.databaseUrl as string | undefined) ?? resolve(dataDir, 'regen.db'),
  };
}
