import { randomBytes } from 'node:crypto';

export type IdPrefix = 'run' | 'ep' | 'file' | 'batch';

/** Prefixed random ids; time-ordered so that cursor pagination by id follows creation order. */
export function newId(prefix: IdPrefix): string {
  const time = Date.now().toString(36).padStart(9, '0');
  return `${prefix}_${time}${randomBytes(8).toString('hex')}`;
}
