import { execFile } from 'node:child_process';
import { cpSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import Database from 'better-sqlite3';
import { getTableColumns, getTableName, is, Table } from 'drizzle-orm';
import type { Config } from 'drizzle-kit';
import { drizzle } from 'drizzle-orm/node-postgres';
import { migrate } from 'drizzle-orm/node-postgres/migrator';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, expectTypeOf, it } from 'vitest';
import sqliteConfig from '../drizzle.config.js';
import pgConfig from '../drizzle.pg.config.js';
import { closeDb, openDb } from '../src/db/client.js';
import * as sqliteSchema from '../src/db/schema.js';
import * as pgSchema from '../src/db/schema-pg.js';
import { createTestDatabase, describePg, type TestDatabase } from './support/pg.js';

// The SQLite and PostgreSQL schemas are written twice (schema.ts, schema-pg.ts) and migrated from
// two folders. These tests fail when the two drift apart, or when a schema changed without its
// migration being generated.

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const DRIZZLE_KIT = join(ROOT, 'node_modules/.bin/drizzle-kit');
// drizzle-kit's own bookkeeping table (SQLite keeps it beside ours; PostgreSQL in schema "drizzle").
const MIGRATIONS_TABLE = '__drizzle_migrations';

interface Column {
  /** SQLite's storage class for the column: what both dialects' types are compared by. */
  affinity: 'integer' | 'real' | 'text';
  notNull: boolean;
  /** The default as SQL, casts removed; null when there is none. */
  default: string | null;
}

interface Index {
  table: string;
  unique: boolean;
  columns: string[];
  /** The WHERE of a partial index, normalised (see normalisePredicate); null for a full index. */
  predicate: string | null;
}

interface ForeignKey {
  columns: string[];
  references: string;
  onDelete: string;
}

interface Catalog {
  tables: Record<string, { columns: Record<string, Column>; primaryKey: string[]; foreignKeys: ForeignKey[] }>;
  /** By name, primary keys excluded (their names are each dialect's own). */
  indexes: Record<string, Index>;
}

const withoutCasts = (sql: string) => sql.replace(/::[a-z_]+(\[\])?/g, '');

/**
 * A partial index's predicate in a form both dialects print alike: no casts, parentheses or
 * spaces, and SQLite's `b = 1` on a boolean column as PostgreSQL's `b`.
 */
function normalisePredicate(sql: string, booleans = new Set<string>()): string {
  const bare = withoutCasts(sql).replace(/[()\s]/g, '');
  const [column, value] = bare.split('=');
  return value === '1' && booleans.has(column) ? column : bare;
}

function tablesOf(schema: Record<string, unknown>): Table[] {
  return Object.values(schema).filter((v): v is Table => is(v, Table));
}

/** The columns schema.ts stores as SQLite's integer booleans (PostgreSQL's are boolean). */
const SQLITE_BOOLEANS = new Set(
  tablesOf(sqliteSchema).flatMap((t) =>
    Object.values(getTableColumns(t))
      .filter((c) => c.columnType === 'SQLiteBoolean')
      .map((c) => c.name),
  ),
);

function readSqliteCatalog(sqlite: Database.Database): Catalog {
  const catalog: Catalog = { tables: {}, indexes: {} };
  const tables = sqlite
    .prepare(`select name from sqlite_master where type = 'table' and name not like 'sqlite\\_%' escape '\\' and name <> ?`)
    .pluck()
    .all(MIGRATIONS_TABLE) as string[];
  for (const table of tables) {
    const info = sqlite.pragma(`table_info(${table})`) as { name: string; type: string; notnull: number; dflt_value: string | null; pk: number }[];
    catalog.tables[table] = {
      columns: Object.fromEntries(
        info.map((c) => [
          c.name,
          // A primary key column is NOT NULL in PostgreSQL whatever it says; drizzle-kit writes it on both.
          { affinity: c.type.toLowerCase() as Column['affinity'], notNull: c.notnull === 1 || c.pk > 0, default: c.dflt_value },
        ]),
      ),
      primaryKey: info
        .filter((c) => c.pk > 0)
        .sort((a, b) => a.pk - b.pk)
        .map((c) => c.name),
      foreignKeys: groupForeignKeys(sqlite.pragma(`foreign_key_list(${table})`) as { id: number; table: string; from: string; on_delete: string }[]),
    };
    const indexes = sqlite.pragma(`index_list(${table})`) as { name: string; unique: number; origin: string; partial: number }[];
    for (const ix of indexes.filter((i) => i.origin !== 'pk')) {
      const columns = (sqlite.pragma(`index_info(${ix.name})`) as { seqno: number; name: string }[]).sort((a, b) => a.seqno - b.seqno).map((c) => c.name);
      let predicate: string | null = null;
      if (ix.partial) {
        const sql = sqlite.prepare(`select sql from sqlite_master where type = 'index' and name = ?`).pluck().get(ix.name) as string;
        predicate = normalisePredicate(sql.slice(sql.search(/\sWHERE\s/i) + ' WHERE '.length), SQLITE_BOOLEANS);
      }
      catalog.indexes[ix.name] = { table, unique: ix.unique === 1, columns, predicate };
    }
  }
  return catalog;
}

function groupForeignKeys(rows: { id: number; table: string; from: string; on_delete: string }[]): ForeignKey[] {
  const byId = new Map<number, ForeignKey>();
  for (const r of rows) {
    const fk = byId.get(r.id) ?? { columns: [], references: r.table, onDelete: r.on_delete.toLowerCase() };
    fk.columns.push(r.from);
    byId.set(r.id, fk);
  }
  return [...byId.values()];
}

const sortedKeys = (keys: ForeignKey[]) => [...keys].sort((a, b) => a.columns.join().localeCompare(b.columns.join()));

const PG_AFFINITY: Record<string, Column['affinity']> = {
  integer: 'integer',
  bigint: 'integer',
  boolean: 'integer',
  'double precision': 'real',
  text: 'text',
  jsonb: 'text',
};

const PG_ON_DELETE: Record<string, string> = { a: 'no action', r: 'restrict', c: 'cascade', n: 'set null', d: 'set default' };

async function readPgCatalog(client: pg.Client): Promise<Catalog> {
  const catalog: Catalog = { tables: {}, indexes: {} };
  const tables = await client.query<{ table_name: string }>(
    `select table_name from information_schema.tables where table_schema = 'public' and table_type = 'BASE TABLE' and table_name <> $1`,
    [MIGRATIONS_TABLE],
  );
  for (const { table_name } of tables.rows) catalog.tables[table_name] = { columns: {}, primaryKey: [], foreignKeys: [] };

  const columns = await client.query<{ table_name: string; column_name: string; data_type: string; is_nullable: string; column_default: string | null }>(
    `select table_name, column_name, data_type, is_nullable, column_default from information_schema.columns where table_schema = 'public'`,
  );
  for (const c of columns.rows) {
    const table = catalog.tables[c.table_name];
    if (!table) continue;
    const affinity = PG_AFFINITY[c.data_type];
    if (!affinity) throw new Error(`${c.table_name}.${c.column_name} is ${c.data_type}: say in PG_AFFINITY which SQLite type it stands for`);
    table.columns[c.column_name] = { affinity, notNull: c.is_nullable === 'NO', default: c.column_default === null ? null : withoutCasts(c.column_default) };
  }

  const constraints = await client.query<{ table: string; type: string; columns: string[]; references: string | null; on_delete: string }>(
    `select t.relname as table, c.contype as type, r.relname as references, c.confdeltype as on_delete,
       array(select a.attname from unnest(c.conkey) with ordinality k(attnum, n)
             join pg_attribute a on a.attrelid = c.conrelid and a.attnum = k.attnum order by k.n)::text[] as columns
     from pg_constraint c join pg_class t on t.oid = c.conrelid join pg_namespace ns on ns.oid = t.relnamespace
       left join pg_class r on r.oid = c.confrelid
     where ns.nspname = 'public' and c.contype in ('p', 'f')`,
  );
  for (const c of constraints.rows) {
    const table = catalog.tables[c.table];
    if (!table) continue;
    if (c.type === 'p') table.primaryKey = c.columns;
    else table.foreignKeys.push({ columns: c.columns, references: c.references!, onDelete: PG_ON_DELETE[c.on_delete] });
  }

  const indexes = await client.query<{ table: string; name: string; unique: boolean; columns: string[]; predicate: string | null }>(
    `select i.tablename as table, i.indexname as name, x.indisunique as unique, pg_get_expr(x.indpred, x.indrelid) as predicate,
       array(select a.attname from unnest(x.indkey::int2[]) with ordinality k(attnum, n)
             join pg_attribute a on a.attrelid = x.indrelid and a.attnum = k.attnum order by k.n)::text[] as columns
     from pg_indexes i join pg_index x on x.indexrelid = format('%I.%I', i.schemaname, i.indexname)::regclass
     where i.schemaname = 'public' and not x.indisprimary`,
  );
  for (const ix of indexes.rows) {
    catalog.indexes[ix.name] = {
      table: ix.table,
      unique: ix.unique,
      columns: ix.columns,
      predicate: ix.predicate === null ? null : normalisePredicate(ix.predicate),
    };
  }
  return catalog;
}

/** Each table's JS properties and the SQL column each maps to, from a schema module. */
function propertiesOf(schema: Record<string, unknown>): Record<string, Record<string, string>> {
  return Object.fromEntries(
    tablesOf(schema).map((t) => [getTableName(t), Object.fromEntries(Object.entries(getTableColumns(t)).map(([key, column]) => [key, column.name]))]),
  );
}

const run = promisify(execFile);

/** Runs `drizzle-kit generate` for a config on a copy of its migrations folder; returns its output and the files it wrote. */
async function generateIntoCopy(config: Config): Promise<{ output: string; written: string[] }> {
  const out = config.out!;
  const dir = mkdtempSync(join(tmpdir(), 'regen-drizzle-kit-'));
  try {
    cpSync(join(ROOT, out), join(dir, out), { recursive: true });
    // drizzle-kit reads `out` relative to the working directory (it refuses an absolute one), so it
    // runs in the copy, with the schema named by its absolute path.
    const schema = [config.schema ?? []].flat().map((path) => join(ROOT, path));
    writeFileSync(join(dir, 'drizzle.config.json'), JSON.stringify({ ...config, schema }));
    const before = new Set(readdirSync(join(dir, out), { recursive: true }) as string[]);
    // Not on a TTY, drizzle-kit fails rather than asks whether a column was renamed; the timeout is for anything else.
    const { stdout, stderr } = await run(DRIZZLE_KIT, ['generate', '--config', 'drizzle.config.json'], { cwd: dir, timeout: 60_000 }).catch(
      (err: { stdout?: string; stderr?: string; message: string }) => ({ stdout: err.stdout ?? '', stderr: `${err.stderr ?? ''}\n${err.message}` }),
    );
    const written = (readdirSync(join(dir, out), { recursive: true }) as string[]).filter((f) => !before.has(f));
    return { output: `${stdout}\n${stderr}`, written };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('the two schemas', () => {
  it('have the same tables, JS properties and SQL column names', () => {
    expect(propertiesOf(pgSchema)).toEqual(propertiesOf(sqliteSchema));
  });

  it('read back the same row types', () => {
    // Checked by tsc (npm run typecheck), not at run time.
    expectTypeOf<typeof pgSchema.endpoints.$inferSelect>().toEqualTypeOf<typeof sqliteSchema.endpoints.$inferSelect>();
    expectTypeOf<typeof pgSchema.files.$inferSelect>().toEqualTypeOf<typeof sqliteSchema.files.$inferSelect>();
    expectTypeOf<typeof pgSchema.runs.$inferSelect>().toEqualTypeOf<typeof sqliteSchema.runs.$inferSelect>();
    expectTypeOf<typeof pgSchema.shards.$inferSelect>().toEqualTypeOf<typeof sqliteSchema.shards.$inferSelect>();
    expectTypeOf<typeof pgSchema.samples.$inferSelect>().toEqualTypeOf<typeof sqliteSchema.samples.$inferSelect>();
    expectTypeOf<typeof pgSchema.staging.$inferSelect>().toEqualTypeOf<typeof sqliteSchema.staging.$inferSelect>();
    expectTypeOf<typeof pgSchema.events.$inferSelect>().toEqualTypeOf<typeof sqliteSchema.events.$inferSelect>();
    expectTypeOf<typeof pgSchema.webhookDeliveries.$inferSelect>().toEqualTypeOf<typeof sqliteSchema.webhookDeliveries.$inferSelect>();
    expectTypeOf<typeof pgSchema.forecasts.$inferSelect>().toEqualTypeOf<typeof sqliteSchema.forecasts.$inferSelect>();
    expectTypeOf<typeof pgSchema.runnerLock.$inferSelect>().toEqualTypeOf<typeof sqliteSchema.runnerLock.$inferSelect>();
  });

  it.each([
    ['drizzle.config.ts', sqliteConfig],
    ['drizzle.pg.config.ts', pgConfig],
  ])('have their migrations generated (%s)', async (_name, config) => {
    const { output, written } = await generateIntoCopy(config);
    expect(written, `drizzle-kit generate would write a migration; run it and check the files in:\n${output}`).toEqual([]);
    expect(output).toContain('No schema changes');
  });
});

await describePg('the migrated SQLite and PostgreSQL databases', () => {
  let tmp: string;
  let database: TestDatabase | undefined;
  let sqlite: Catalog;
  let postgres: Catalog;

  beforeAll(async () => {
    database = await createTestDatabase('schema');
    const client = new pg.Client({ connectionString: database.url });
    await client.connect();
    try {
      await migrate(drizzle(client), { migrationsFolder: join(ROOT, pgConfig.out!) });
      postgres = await readPgCatalog(client);
    } finally {
      await client.end();
    }

    // Migrated the way the server does it; the catalog is read on a connection of its own.
    tmp = mkdtempSync(join(tmpdir(), 'regen-pg-schema-'));
    const path = join(tmp, 'regen.db');
    await closeDb(await openDb(path));
    const file = new Database(path, { readonly: true });
    try {
      sqlite = readSqliteCatalog(file);
    } finally {
      file.close();
    }
  });

  afterAll(async () => {
    await database?.drop();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
  });

  it('have the same tables', () => {
    expect(Object.keys(postgres.tables).sort()).toEqual(Object.keys(sqlite.tables).sort());
  });

  it('have the same columns, of the same kind, nullable and defaulted alike', () => {
    for (const [table, { columns }] of Object.entries(sqlite.tables)) {
      expect(postgres.tables[table]?.columns, table).toEqual(columns);
    }
  });

  it('have the same primary and foreign keys', () => {
    for (const [table, { primaryKey, foreignKeys }] of Object.entries(sqlite.tables)) {
      expect(postgres.tables[table]?.primaryKey, table).toEqual(primaryKey);
      expect(sortedKeys(postgres.tables[table]?.foreignKeys ?? []), table).toEqual(sortedKeys(foreignKeys));
    }
  });

  it('have the same indexes: names, uniqueness, columns and partial predicates', () => {
    expect(Object.keys(postgres.indexes).sort()).toEqual(Object.keys(sqlite.indexes).sort());
    for (const [name, ix] of Object.entries(sqlite.indexes)) expect(postgres.indexes[name], name).toEqual(ix);
    // Guards the comparison itself: the partial indexes were read as partial.
    expect(Object.values(sqlite.indexes).filter((ix) => ix.predicate !== null).length).toBeGreaterThan(0);
  });
});
