import type { App } from '../../http/app.js';
import { registerCancelBatch } from './cancel.js';
import { registerCreateBatch } from './create.js';
import { registerGetBatch } from './get.js';
import { registerListBatches } from './list.js';

/** OpenAI's Batch API, over runs. */
export function registerBatchRoutes(app: App): void {
  registerCreateBatch(app);
  registerListBatches(app);
  registerGetBatch(app);
  registerCancelBatch(app);
}
