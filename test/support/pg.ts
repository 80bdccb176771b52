import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { describe } from 'vitest';
import { pidAlive } from './build.js';

/** The server tests create their databases on, through its maintenance database. */
const ADMIN_URL = process.env.REGEN_TEST_PG_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
// Long enough for a loaded machine to answer, short enough that a missing server costs little.
const CONNECT_TIMEOUT_MS = 3_000;
// PostgreSQL truncates identifiers past 63 bytes (NAMEDATALEN - 1).
const MAX_IDENTIFIER_BYTES = 63;

/** The admin URL as it can be printed: without its password. */
function shownUrl(): string {
  const url = new URL(ADMIN_URL);
  if (url.password) url.password = '***';
  return url.toString();
}

async function withAdmin<T>(fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: ADMIN_URL, connectionTimeoutMillis: CONNECT_TIMEOUT_MS });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/** Why the test server cannot be used, or null when it answers. */
async function pgUnavailableReason(): Promise<string | null> {
  try {
    await withAdmin((client) => client.query('select 1'));
    return null;
  } catch (err) {
    return (err as Error).message || String(err);
  }
}

export async function pgAvailable(): Promise<boolean> {
  return (await pgUnavailableReason()) === null;
}

export interface TestDatabase {
  url: string;
  /** Ends every other connection to the database, then drops it. */
  drop(): Promise<void>;
}

/** Names this test run's databases: set by the suite's global setup, so its teardown finds any left behind. */
const RUN_TAG_ENV = 'REGEN_TEST_RUN';
const runTag = () => process.env[RUN_TAG_ENV] ?? `p${process.pid}`;

/**
 * Gives the databases of this run (every worker and child process after this) a tag of their own,
 * and returns the check for the end of the run: the names of those still on the server, dropped.
 */
export function tagTestRun(): () => Promise<string[]> {
  const tag = `r${randomBytes(3).toString('hex')}`;
  process.env[RUN_TAG_ENV] = tag;
  return async () => {
    if (await pgUnavailableReason()) return [];
    return withAdmin(async (client) => {
      const { rows } = await client.query<{ datname: string }>('select datname from pg_database where datname like $1', [`regen\\_test\\_%\\_${tag}\\_%`]);
      for (const { datname } of rows) await client.query(`drop database if exists ${pg.escapeIdentifier(datname)} with (force)`);
      return rows.map((r) => r.datname);
    });
  };
}

/** Names the migrated database test databases are copied from: set by the suite's global setup when the server answers. */
const TEMPLATE_ENV = 'REGEN_TEST_TEMPLATE';

/**
 * Makes this run's migrated template (its name in TEMPLATE_ENV for every worker and child process
 * after this) and returns what drops it; nothing when the server cannot be reached. Copying it
 * costs PostgreSQL about half what creating a database and applying every migration does
 * (README, Development).
 *
 * `migrate` opens the database the way a server does, which applies the migrations, and closes it:
 * CREATE DATABASE … TEMPLATE refuses a template anyone is connected to, so the template then takes
 * no connections at all, and copies made at the same time only share its lock.
 */
export async function makeTemplateDatabase(migrate: (url: string) => Promise<void>): Promise<(() => Promise<void>) | undefined> {
  if (await pgUnavailableReason()) return undefined;
  await dropDeadTemplates();
  const name = `${TEMPLATE_PREFIX}${process.pid}_${runTag()}`;
  await withAdmin((client) => client.query(`create database ${pg.escapeIdentifier(name)}`));
  const drop = () => withAdmin((client) => dropTemplate(client, name));
  try {
    await migrate(urlOf(name));
    await withAdmin(async (client) => {
      await client.query(`alter database ${pg.escapeIdentifier(name)} with is_template true allow_connections false`);
      // A backend of the closed migration pool may still be exiting, and a copy made while one is
      // there waits, then fails ("being accessed by other users"): ended here, before any copy.
      await client.query('select pg_terminate_backend(pid) from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()', [name]);
    });
  } catch (err) {
    await drop();
    throw err;
  }
  process.env[TEMPLATE_ENV] = name;
  return async () => {
    delete process.env[TEMPLATE_ENV];
    await drop();
  };
}

/** A template's name: this prefix, the pid of the run that made it, and the run's tag. */
const TEMPLATE_PREFIX = 'regen_test_template_';

async function dropTemplate(client: pg.Client, name: string): Promise<void> {
  const quoted = pg.escapeIdentifier(name);
  // PostgreSQL drops no database marked as a template.
  await client.query(`alter database ${quoted} is_template false`);
  await client.query(`drop database if exists ${quoted} with (force)`);
}

/**
 * Drops the templates of runs no longer alive (a run stopped before its teardown leaves its own):
 * only when the server is this machine's, whose pids they carry.
 */
async function dropDeadTemplates(): Promise<void> {
  if (!['127.0.0.1', 'localhost', '[::1]'].includes(new URL(ADMIN_URL).hostname)) return;
  await withAdmin(async (client) => {
    const { rows } = await client.query<{ datname: string }>('select datname from pg_database where datname like $1', [
      `${TEMPLATE_PREFIX.replace(/_/g, '\\_')}%`,
    ]);
    for (const { datname } of rows) {
      const pid = /^(\d+)_/.exec(datname.slice(TEMPLATE_PREFIX.length))?.[1];
      if (pid && !pidAlive(Number(pid))) await dropTemplate(client, datname);
    }
  });
}

function urlOf(name: string): string {
  const url = new URL(ADMIN_URL);
  url.pathname = `/${name}`;
  return url.toString();
}

/**
 * A new database of its own on the test server, named after the test that asked for it: empty, or
 * with `migrated` a copy of this run's migrated template (empty outside the suite, where there is
 * none: a server applies the migrations as it opens it either way).
 */
export async function createTestDatabase(prefix: string, { migrated = false }: { migrated?: boolean } = {}): Promise<TestDatabase> {
  const tag = prefix.toLowerCase().replace(/[^a-z0-9_]/g, '_');
  const name = `regen_test_${tag}_${runTag()}_${randomBytes(4).toString('hex')}`;
  if (Buffer.byteLength(name) > MAX_IDENTIFIER_BYTES) throw new Error(`database name ${name} is longer than PostgreSQL keeps: shorten the prefix`);
  const quoted = pg.escapeIdentifier(name);
  const template = migrated ? process.env[TEMPLATE_ENV] : undefined;
  await withAdmin((client) => client.query(`create database ${quoted}${template ? ` template ${pg.escapeIdentifier(template)}` : ''}`));
  return {
    url: urlOf(name),
    // FORCE (PostgreSQL 13+) terminates the connections a failed test left open, as it drops.
    async drop() {
      await withAdmin((client) => client.query(`drop database if exists ${quoted} with (force)`));
    },
  };
}

/**
 * `describe` for tests that need PostgreSQL: when the server cannot be reached the suite is skipped
 * with one line saying so, except on CI, where that is a failure. Await it at the top of the file.
 */
export async function describePg(name: string, fn: () => void): Promise<void> {
  const reason = await pgUnavailableReason();
  if (reason) {
    const problem = `PostgreSQL at ${shownUrl()} is not reachable (${reason})`;
    if (process.env.CI === 'true') throw new Error(`${problem}: the tests of "${name}" need it on CI`);
    console.warn(`\n*** ${problem}: SKIPPING the tests of "${name}" (start PostgreSQL or set REGEN_TEST_PG_URL to run them) ***\n`);
  }
  describe.skipIf(reason !== null)(name, fn);
}
