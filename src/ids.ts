import { randomBytes } from 'node:crypto';

export type IdPrefix = 'run' | 'ep' | 'file' | 'batch';

const TIME_CHARS = 9;
const RANDOM_BYTES = 8;

/** Prefixed random ids; time-ordered so that cursor pagination by id follows creation order. */
export function newId(prefix: IdPrefix): string {
  const time = Date.now().toString(36).padStart(TIME_CHARS, '0');
  return `${prefix}_${time}${randomBytes(RANDOM_BYTES).toString('hex')}`;
}

/** When an id of newId's making was made (ms since the epoch); null for a string not of its shape. */
export function idTime(id: string, prefix: IdPrefix): number | null {
  const m = new RegExp(`^${prefix}_([0-9a-z]{${TIME_CHARS}})[0-9a-f]{${RANDOM_BYTES * 2}}$`).exec(id);
  return m ? Number.parseInt(m[1], 36) : null;
}
