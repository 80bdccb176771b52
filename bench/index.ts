import { loadavg } from 'node:os';
import { benchAdaptive } from './adaptive.js';
import { benchDispatch, benchSaturation, benchStream } from './dispatch.js';
import { benchConversationEta } from './conversation-eta.js';
import { benchConversations } from './conversations.js';
import { benchEndless } from './endless.js';
import { benchFormats } from './formats.js';
import { benchIngest } from './ingest.js';
import { benchMillion } from './million.js';
import { benchScale } from './scale.js';
import { benchShare } from './share.js';
import { benchStores } from './stores.js';
import { machine, SCALE, type Figure } from './support.js';
import { benchTail } from './tail.js';
import { benchTokens } from './tokens.js';
import { benchVariants } from './variants.js';

const PARTS: Record<string, () => Promise<Figure[]>> = {
  ingest: benchIngest,
  dispatch: benchDispatch,
  saturation: benchSaturation,
  stream: benchStream,
  million: benchMillion,
  adaptive: benchAdaptive,
  tail: benchTail,
  scale: benchScale,
  stores: benchStores,
  endless: benchEndless,
  variants: benchVariants,
  formats: benchFormats,
  share: benchShare,
  conversations: benchConversations,
  'conversation-eta': benchConversationEta,
  tokens: benchTokens,
};

/**
 * Parts run only when named: `conversations` starts 32 simulators and runs for many minutes;
 * `tokens` runs four whole runs of 500,000 samples each.
 */
const ON_REQUEST = new Set(['conversations', 'conversation-eta', 'tokens']);

const fmt = (n: number | null, unit = '') =>
  n === null ? '' : unit === '%' ? n.toFixed(2) : n >= 100 ? Math.round(n).toLocaleString('en') : n.toFixed(n >= 10 ? 1 : 2);

function table(figures: Figure[]): string {
  const rows = [
    '| part | figure | regen | baseline | ratio | target | met |',
    '|---|---|---|---|---|---|---|',
    ...figures.map(
      (f) =>
        `| ${f.part} | ${f.figure} | ${fmt(f.regen, f.unit)} ${f.unit} | ${f.baseline === null ? '' : `${fmt(f.baseline, f.unit)} ${f.unit}`} | ${f.ratio === null ? '' : f.ratio.toFixed(3)} | ${f.target} | ${f.ok === null ? '' : f.ok ? 'yes' : 'no'} |`,
    ),
  ];
  return rows.join('\n');
}

/**
 * `npm run bench [part…]`: runs the parts (all by default), prints regen next to its baseline for
 * every figure, with the machine and its load. Parts: ingest, dispatch, saturation, stream, million, adaptive, tail, scale, stores, endless, variants, formats, share; conversations, conversation-eta and tokens only when named.
 */
async function main(): Promise<void> {
  const asked = process.argv.slice(2);
  const unknown = asked.filter((p) => !PARTS[p]);
  if (unknown.length) {
    console.error(`unknown part(s): ${unknown.join(', ')}; parts: ${Object.keys(PARTS).join(', ')}`);
    process.exit(2);
  }
  const figures: Figure[] = [];
  for (const part of asked.length ? asked : Object.keys(PARTS).filter((p) => !ON_REQUEST.has(p))) {
    console.error(`running ${part}…`);
    const got = await PARTS[part]();
    figures.push(...got);
    console.error(table(got));
  }
  // Printed, never written over BENCHMARKS.md: its current table and history are kept by hand from runs like this.
  console.log(
    `Measured ${new Date().toISOString().slice(0, 10)} on ${machine()}${SCALE !== 1 ? `, scale ${SCALE}` : ''}, load average ${loadavg()[0].toFixed(1)} at the end.\n\n${table(figures)}\n`,
  );
}

await main();
