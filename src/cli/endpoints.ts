import type { components } from '../client/index.js';
import { Client, type ClientOptions, UsageError } from './client.js';
import { ms, num, rate, table } from './format.js';

type EndpointView = components['schemas']['Endpoint'];
type Sharing = Pick<
  components['schemas']['PatchEndpoint'],
  'request_priority' | 'bulk_header' | 'share' | 'schedule' | 'timezone' | 'lend_until' | 'drain_grace_ms'
>;
type Window = NonNullable<Sharing['schedule']>[number];
type Day = NonNullable<Window['days']>[number];

/** The sharing flags as given on the command line (commands.ts `sharing`). */
export interface SharingOptions {
  requestPriority?: string;
  bulkHeader?: string;
  share?: string;
  schedule?: string;
  timezone?: string;
  lendUntil?: string;
  drainGrace?: string;
}

const DAYS: Day[] = ['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'];
const NONE = 'none';

/** A whole number, or null for `none`; the server checks its range and names the field. */
function intOrNone(flag: string, value: string): number | null {
  if (value === NONE) return null;
  if (!/^-?\d+$/.test(value)) throw new UsageError(`${flag}: expected a whole number or "none" (got ${JSON.stringify(value)})`);
  return Number(value);
}

/** "mon-fri,sun" → the days it names. */
function days(text: string): Day[] {
  const out: Day[] = [];
  for (const part of text.split(',')) {
    const [from, to = from] = part.trim().split('-') as [Day, Day?];
    const a = DAYS.indexOf(from);
    const b = DAYS.indexOf(to as Day);
    if (a < 0 || b < 0) throw new UsageError(`--schedule: ${JSON.stringify(part)} is not a day or a range of days (mon, tue-fri)`);
    for (let d = a; ; d = (d + 1) % 7) {
      if (!out.includes(DAYS[d])) out.push(DAYS[d]);
      if (d === b) break;
    }
  }
  return out;
}

/** "mon-fri 20:00-07:00; 12:00-13:00" → the windows (a window without days is every day's). */
export function parseSchedule(text: string): Window[] | null {
  if (text.trim() === NONE) return null;
  return text.split(';').map((raw) => {
    const m = /^(?:(\S+)\s+)?(\d\d:\d\d)-(\d\d:\d\d)$/.exec(raw.trim());
    if (!m) throw new UsageError(`--schedule: ${JSON.stringify(raw.trim())} is not "[days] HH:MM-HH:MM"`);
    return { ...(m[1] && { days: days(m[1]) }), from: m[2], to: m[3] };
  });
}

/** The body fields of the sharing flags that were given. */
export function sharingBody(o: SharingOptions): Sharing {
  const body: Sharing = {};
  if (o.requestPriority !== undefined) body.request_priority = intOrNone('--request-priority', o.requestPriority);
  if (o.bulkHeader !== undefined) {
    if (o.bulkHeader !== 'on' && o.bulkHeader !== 'off') throw new UsageError('--bulk-header: expected on or off');
    body.bulk_header = o.bulkHeader === 'on';
  }
  if (o.share !== undefined) {
    const m = /^(\d+),(\d+)$/.exec(o.share);
    if (o.share !== NONE && !m) throw new UsageError('--share: expected reserve_slots,max_other_queue (e.g. 2,0) or "none"');
    body.share = m ? { reserve_slots: Number(m[1]), max_other_queue: Number(m[2]) } : null;
  }
  if (o.schedule !== undefined) body.schedule = parseSchedule(o.schedule);
  if (o.timezone !== undefined) body.timezone = o.timezone;
  if (o.lendUntil !== undefined) body.lend_until = o.lendUntil === NONE ? null : o.lendUntil;
  if (o.drainGrace !== undefined) body.drain_grace_ms = intOrNone('--drain-grace', o.drainGrace);
  return body;
}

const describe = (ep: EndpointView): string =>
  `${ep.id}  ${ep.name}  ${ep.url}  ${ep.state}${ep.off_schedule ? ` (off schedule${ep.next_window_at ? ` until ${ep.next_window_at}` : ''})` : ''}  cap ${ep.max_concurrency} (${ep.max_concurrency_source})\n`;

/** `regen endpoints add URL`: registers (or updates) an SGLang server; prints its id and state. */
export async function addEndpointCommand(url: string, opts: ClientOptions & SharingOptions & { name?: string; maxConcurrency?: number }): Promise<number> {
  const client = new Client(opts);
  const ep = await client.post('/v1/endpoints', {
    body: {
      url,
      ...(opts.name !== undefined && { name: opts.name }),
      ...(opts.maxConcurrency !== undefined && { max_concurrency: opts.maxConcurrency }),
      ...sharingBody(opts),
    },
  });
  process.stdout.write(describe(ep));
  return 0;
}

/** `regen endpoints set ID`: changes an endpoint's sharing settings; prints it as `add` does. */
export async function setEndpointCommand(id: string, opts: ClientOptions & SharingOptions): Promise<number> {
  const body = sharingBody(opts);
  if (Object.keys(body).length === 0) throw new UsageError('nothing to set: give at least one of the sharing flags (regen endpoints set --help)');
  const client = new Client(opts);
  process.stdout.write(describe(await client.patch('/v1/endpoints/{id}', { params: { path: { id } }, body })));
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
        e.off_schedule ? 'off_schedule' : e.state,
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
