import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { describe } from 'vitest';

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

/** A new, empty database of its own on the test server, named after the test that asked for it. */
export async function createTestDatabase(prefix: string): Promise<TestDatabase> {
  const tag = prefix.toLowerCase().replace(/[^a-z0-9_]/g, '_');
  const name = `regen_test_${tag}_${process.pid}_${randomBytes(4).toString('hex')}`;
  if (Buffer.byteLength(name) > MAX_IDENTIFIER_BYTES) throw new Error(`database name ${name} is longer than PostgreSQL keeps: shorten the prefix`);
  const quoted = pg.escapeIdentifier(name);
  await withAdmin((client) => client.query(`create database ${quoted}`));
  const url = new URL(ADMIN_URL);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
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
