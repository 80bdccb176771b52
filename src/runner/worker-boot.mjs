// The runner thread's entry point. A worker thread may not inherit the tsx loader that
// bin/regen.js registers for the main thread, so this registers it before loading TypeScript.
import { register } from 'tsx/esm/api';

register();
await import('./worker.ts');
