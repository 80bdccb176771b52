import type { components } from '../client/index.js';
import { Client, type ClientOptions } from './client.js';
import { ms, num, rate, table } from './format.js';

type EndpointView = components['schemas']['Endpoint'];

/** `regen endpoints add URL`: registers (or updates) an SGLang server; prints its id and state. */
export async function addEndpointCommand(url: string, opts: ClientOptions & { name?: string; maxConcurrency?: number }): Promise<number> {
  const client = new Client(opts);
  const ep = await client.post('/v1/endpoints', {
    body: {
      url,
      ...(opts.name !== undefined && { name: opts.name }),
      ...(opts.maxConcurrency !== undefined && { max_concurrency: opts.maxConcurrency }),
    },
  });
  process.stdout.write(`${ep.id}  ${ep.name}  ${ep.url}  ${ep.state}  cap ${num(ep.max_concurrency)} (${ep.max_concurrency_source})\n`);
  return 0;
}

export async function listEndpointsCommand(opts: ClientOptions): Promise<number> {
  const client = new Client(opts);
  const { data } = await client.get('/v1/endpoints', { params: { query: { limit: 1000 } } });
  if (!data.length) {
    process.stdout.write('no endpoints; add one with `regen endpoints add http://host:30000`\n');
    return 0;
  }
  const server = (e: EndpointView) => (e.server.running == null && e.server.queued == null ? '-' : `${num(e.server.running)}/${num(e.server.queued)}`);
  process.stdout.write(
    table(
      ['ENDPOINT', 'NAME', 'URL', 'MODEL', 'STATE', 'IN FLIGHT/CAP', 'SAMPLES/S', 'P50', 'SERVER RUN/QUEUE', 'DONE', 'FAILED', 'LAST ERROR'],
      data.map((e) => [
        e.id,
        e.name,
        e.url,
        e.model ?? '-',
        e.state,
        `${num(e.in_flight)}/${num(e.max_concurrency)}`,
        rate(e.stats.samples_per_second),
        ms(e.stats.p50_latency_ms),
        server(e),
        num(e.stats.completed),
        num(e.stats.failed),
        e.state === 'ready' ? '' : (e.last_error ?? '').slice(0, 80),
      ]),
      [5, 6, 7, 8, 9, 10],
    ) + '\n',
  );
  return 0;
}
