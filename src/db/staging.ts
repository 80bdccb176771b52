import { eq, inArray } from 'drizzle-orm';
import type { DbOrTx } from './client.js';
import { staging } from './schema.js';

/** A completed sample's output while its shard is open, as the JSON the runner staged. */
export async function getStagedOutput(db: DbOrTx, sampleId: number): Promise<string | undefined> {
  const [row] = await db.select({ output: staging.output }).from(staging).where(eq(staging.sampleId, sampleId)).limit(1);
  return row?.output;
}

export function deleteStagedOutputs(db: DbOrTx, sampleIds: number[]): void {
  db.delete(staging).where(inArray(staging.sampleId, sampleIds)).run();
}
