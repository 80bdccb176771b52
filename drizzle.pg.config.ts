import { defineConfig } from 'drizzle-kit';

// The PostgreSQL store's migrations (REGEN_DATABASE_URL=postgres://…); drizzle.config.ts has SQLite's.
export default defineConfig({
  dialect: 'postgresql',
  schema: './src/db/schema-pg.ts',
  out: './migrations/pg',
});
