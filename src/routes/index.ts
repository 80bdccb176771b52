import type { App } from '../http/app.js';
import { registerBatchRoutes } from './batches/index.js';
import { registerDeleteEndpoint } from './endpoints/delete.js';
import { registerGetEndpoint } from './endpoints/get.js';
import { registerListEndpoints } from './endpoints/list.js';
import { registerPatchEndpoint } from './endpoints/patch.js';
import { registerUpsertEndpoint } from './endpoints/upsert.js';
import { registerFileContent } from './files/content.js';
import { registerDeleteFile } from './files/delete.js';
import { registerGetFile } from './files/get.js';
import { registerListFiles } from './files/list.js';
import { registerUploadFile } from './files/upload.js';
import { registerRunActions } from './runs/actions.js';
import { registerCreateRun } from './runs/create.js';
import { registerRunEvents } from './runs/events.js';
import { registerRunForecasts } from './runs/forecasts.js';
import { registerGetRun } from './runs/get.js';
import { registerListRuns } from './runs/list.js';
import { registerGetSample } from './runs/sample.js';
import { registerListSamples } from './runs/samples.js';
import { registerRunQuality } from './runs/quality.js';
import { registerListShards } from './runs/shards.js';
import { registerValidateRun } from './runs/validate.js';
import { registerDashboard } from './service/dashboard.js';
import { registerHealth } from './service/health.js';
import { registerMetrics } from './service/metrics.js';
import { registerOpenApi } from './service/openapi.js';

/** The OpenAI layer: routes that answer in OpenAI's shapes, errors included (README "OpenAI Batch API"). */
export const OPENAI_PATHS = ['/v1/files/*', '/v1/batches/*'];

export function registerRoutes(app: App): void {
  registerHealth(app);
  registerMetrics(app);
  registerOpenApi(app);
  registerUploadFile(app);
  registerListFiles(app);
  registerGetFile(app);
  registerFileContent(app);
  registerDeleteFile(app);
  registerBatchRoutes(app);
  registerCreateRun(app);
  registerValidateRun(app);
  registerListRuns(app);
  registerGetRun(app);
  registerRunEvents(app);
  registerListShards(app);
  registerListSamples(app);
  registerGetSample(app);
  registerRunQuality(app);
  registerRunForecasts(app);
  registerRunActions(app);
  registerUpsertEndpoint(app);
  registerListEndpoints(app);
  registerGetEndpoint(app);
  registerPatchEndpoint(app);
  registerDeleteEndpoint(app);
  registerDashboard(app);
}
