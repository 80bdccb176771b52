import { eq, inArray } from 'drizzle-orm';
import type { DbOrTx } from './client.js';

/** A completed sample's output while its shard is open, as the JSON the runner staged. */
export async function getStagedOutput(db: DbOrTx, sampleId: number): Promise<string | undefined> {
  const { staging } = db.t;
  const [row] = await db.q.select({ output: staging.output }).from(staging).where(eq(staging.sampleId, sampleId)).limit(1);
  return row?.output;
}

export async function deleteStagedOutputs(db: DbOrTx, sampleIds: number[]): Promise<void> {
  const { staging } = db.t;
  await db.write((w) => w.q.delete(staging).where(inArray(staging.sampleId, sampleIds)));
}
