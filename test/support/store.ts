import { resolve } from 'node:path';
import { openDb, type Db } from '../../src/db/client.js';
import { createTestDatabase, type TestDatabase } from './pg.js';

/**
 * The store the suite runs on: SQLite files (the default), or with REGEN_TEST_STORE=pg a
 * PostgreSQL database of its own, migrated, for each data folder a test starts a server on. The vitest
 * project `pg` (vitest.config.ts) sets it, so the same tests run on both.
 */
export const TEST_STORE: 'sqlite' | 'pg' = process.env.REGEN_TEST_STORE === 'pg' ? 'pg' : 'sqlite';

const databases = new Map<string, Promise<TestDatabase>>();

function databaseFor(dataDir: string): Promise<TestDatabase> {
  const key = resolve(dataDir);
  let db = databases.get(key);
  if (!db) {
    db = createTestDatabase('suite', { migrated: true });
    databases.set(key, db);
  }
  return db;
}

/** Drops every database this file's servers used: the `pg` project's setup file runs it after each test file, whatever its tests did. */
export async function dropTestDatabases(): Promise<void> {
  const all = [...databases.values()];
  databases.clear();
  await Promise.all(all.map(async (d) => (await d).drop()));
}

/** The settings that point a server with this data folder at its store: the same database every time for the same folder, so a restart finds its state. */
export async function storeEnv(dataDir: string): Promise<Record<string, string>> {
  if (TEST_STORE === 'sqlite') return {};
  return { REGEN_DATABASE_URL: (await databaseFor(dataDir)).url };
}

/** Opens the store a server with this data folder used, to check what it left (the server stopped or running). */
export async function openTestStore(dataDir: string): Promise<Db> {
  if (TEST_STORE === 'sqlite') return openDb(resolve(dataDir, 'regen.db'));
  return openDb((await databaseFor(dataDir)).url);
}

/** True on PostgreSQL: tests of SQLite's own mechanics (its write lock, its query plans, its file) have no form there and skip. */
export const onPg = TEST_STORE === 'pg';
