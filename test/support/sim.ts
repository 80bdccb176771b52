import type * as SpawnModule from '../../src/sim/spawn.js';
import { loadSource } from './build.js';

export type { SimProcess } from '../../src/sim/spawn.js';

/** `regen sim` as its own process, compiled (test/support/build.ts): it listens in a third of the time tsx takes. */
export const { spawnSimulator } = await loadSource<typeof SpawnModule>('src/sim/spawn.ts');
