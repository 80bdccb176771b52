import { PARQUET_FEATURES, type OutputFormat } from './output-format.js';
import { rawParquetFeatures } from './raw-row.js';
import { runEndpoint } from './run-endpoint.js';
import { type Spread, TOKEN_FEATURES, type TrainableSpread } from './token-rows.js';

// The dataset card written beside a run's shards (README.md): YAML front matter that Hugging Face
// `datasets` reads (`configs` with the data files of each split, and for Parquet the `features`),
// then what a reader needs to trust the data: model, params, variants, counts, quality, method.

export interface CardShard {
  key: string | null;
  split: string | null;
  lines: number | null;
  errorsKey: string | null;
  errorsLines: number | null;
}

export interface CardRun {
  id: string;
  name: string | null;
  model: string;
  params: unknown;
  createdAt: number;
  /** How the run ended: `completed`, or `cancelled` (the data then holds what was answered before). */
  status: string;
  regenerate: string | null;
  format: OutputFormat;
  /** The server route the run's requests went to (null: chat completions). */
  endpoint?: string | null;
  evalShare: number | null;
  /** The run's variants, when it has them: shown with their weights and params. */
  variants?: readonly { name: string; weight: number; params?: unknown }[] | null;
  counts: { total: number; completed: number; failed: number; cancelled: number };
  /** A conversation run's requests answered, and the tool-call steps among them. */
  turns?: { completed: number; toolSteps: number } | null;
  usage: { prompt_tokens: number; completion_tokens: number; reasoning_tokens: number };
  quality: { flagged: number; by_flag: Record<string, number>; settings: unknown };
  /** A run with output.tokens: its training rows' files by split, and the spread of their trainable tokens. */
  tokens?: { shards: readonly CardShard[]; spread: TrainableSpread } | null;
}

type Yaml = string | number | boolean | null | Yaml[] | { [k: string]: Yaml };

const scalar = (v: Yaml): string => (typeof v === 'string' ? JSON.stringify(v) : String(v));
const isScalar = (v: Yaml): boolean => v === null || typeof v !== 'object';

/** Block YAML, strings double-quoted as JSON writes them (valid YAML): no dependency, nothing left to quoting rules. */
function yaml(v: Yaml, indent = ''): string {
  if (Array.isArray(v)) {
    if (v.length === 0) return `${indent}[]\n`;
    return v
      .map((item) => {
        if (isScalar(item)) return `${indent}- ${scalar(item)}\n`;
        const body = yaml(item, `${indent}  `);
        return `${indent}- ${body.slice(indent.length + 2)}`;
      })
      .join('');
  }
  if (v !== null && typeof v === 'object') {
    return Object.entries(v)
      .map(([k, child]) => {
        if (isScalar(child) || (Array.isArray(child) && child.length === 0)) return `${indent}${k}: ${Array.isArray(child) ? '[]' : scalar(child)}\n`;
        return `${indent}${k}:\n${yaml(child, `${indent}  `)}`;
      })
      .join('');
  }
  return `${indent}${scalar(v)}\n`;
}

/** The splits in the order the card names them, each with its shard objects and row count. */
export function cardSplits(shards: readonly CardShard[]): { split: string; files: string[]; rows: number }[] {
  const bySplit = new Map<string, { files: string[]; rows: number }>();
  for (const s of shards) {
    const split = s.split ?? 'train';
    const entry = bySplit.get(split) ?? { files: [], rows: 0 };
    bySplit.set(split, entry);
    if (s.key) {
      entry.files.push(s.key);
      entry.rows += s.lines ?? 0;
    }
  }
  return [...bySplit].sort(([a], [b]) => (a === 'train' ? -1 : b === 'train' ? 1 : a.localeCompare(b))).map(([split, e]) => ({ split, ...e }));
}

/** A fenced JSON block, its fence longer than any backtick run in the user's strings it shows. */
function json(v: unknown): string {
  const text = JSON.stringify(v, null, 2);
  const fence = '`'.repeat(Math.max(3, ...(text.match(/`+/g) ?? []).map((run) => run.length + 1)));
  return `${fence}json\n${text}\n${fence}\n`;
}

// A run's name and model are the user's text: in the card they must read as text, never as
// emphasis, a link, an image, HTML, a heading's closing `#`s or a table's cell boundary. They sit
// inside a line (a heading's text, a cell), where no block syntax starts, so the inline marks are
// the ones to escape (CommonMark lets a backslash escape any ASCII punctuation).
const MARKDOWN_INLINE = /[\\`*_[\]!|~#]/g;
const oneLine = (s: string) => s.replace(/[\r\n\u2028\u2029]+/g, ' ');

/** `s` as plain text in markdown: punctuation escaped, HTML's `<` and `&` as entities, on one line. */
export const markdownText = (s: string): string =>
  oneLine(s)
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(MARKDOWN_INLINE, (c) => `\\${c}`);

/** `s` as an inline code span: fenced by more backticks than any run inside it, pipes escaped for a table's cell (GFM). */
export function markdownCode(s: string): string {
  const text = oneLine(s);
  const longest = Math.max(0, ...(text.match(/`+/g) ?? []).map((run) => run.length));
  const fence = '`'.repeat(longest + 1);
  const pad = text.startsWith('`') || text.endsWith('`') ? ' ' : '';
  return `${fence}${pad}${text.replace(/\|/g, '\\|')}${pad}${fence}`;
}

/** Below this many percent a share reads as "less than" it: more digits would tell a reader nothing. */
const SMALLEST_PERCENT = 0.01;

/** A share as a percentage with the precision it needs: a tiny eval share never reads as 0% (the hash still puts samples in it). */
export function percent(share: number): string {
  const p = share * 100;
  if (p === 0 || p >= 1) return `${+p.toFixed(2)}%`;
  if (p < SMALLEST_PERCENT) return `less than ${SMALLEST_PERCENT}%`;
  return `${+p.toPrecision(2)}%`;
}

/** What the card's first sentence says the run made, by the route its requests went to. */
const WHAT_WAS_MADE = {
  '/v1/chat/completions': 'Answers regenerated',
  '/v1/completions': 'Completions of raw prompts made',
  '/v1/embeddings': 'Embeddings computed',
} as const;

/** The Parquet columns of a run's rows: a chat row's, or a completions or embeddings run's. */
function parquetFeatures(stored: string | null | undefined): Yaml {
  const endpoint = runEndpoint(stored);
  return (endpoint === '/v1/chat/completions' ? PARQUET_FEATURES : rawParquetFeatures(endpoint)) as Yaml;
}

export function datasetCard(run: CardRun, shards: readonly CardShard[]): string {
  const splits = cardSplits(shards).filter((s) => s.files.length > 0);
  const info: Record<string, Yaml> = {
    ...(run.format === 'parquet' && { features: parquetFeatures(run.endpoint) }),
    splits: splits.map((s) => ({ name: s.split, num_examples: s.rows })),
  };
  const front: Record<string, Yaml> = {
    configs: [{ config_name: 'default', data_files: splits.map((s) => ({ split: s.split, path: s.files })) }],
    dataset_info: info,
  };
  // The training rows are a second config, split like the text: `load_dataset(path, "tokens")`.
  const tokenSplits = run.tokens ? cardSplits(run.tokens.shards).filter((s) => s.files.length > 0) : [];
  if (run.tokens) {
    (front.configs as Yaml[]).push({ config_name: 'tokens', data_files: tokenSplits.map((s) => ({ split: s.split, path: s.files })) });
    front.dataset_info = [
      { config_name: 'default', ...info },
      {
        config_name: 'tokens',
        ...(run.format === 'parquet' && { features: TOKEN_FEATURES as Yaml }),
        splits: tokenSplits.map((s) => ({ name: s.split, num_examples: s.rows })),
      },
    ];
  }
  const errorFiles = shards.filter((s) => s.errorsKey).length;
  const out: string[] = [];
  out.push(`---\n${yaml(front)}---\n\n`);
  out.push(`# ${run.name?.trim() ? markdownText(run.name.trim()) : run.id}\n\n`);
  out.push(
    `${WHAT_WAS_MADE[runEndpoint(run.endpoint)]} by the model ${markdownCode(run.model)} with regen (run \`${run.id}\`, created ${new Date(run.createdAt).toISOString()}, ${run.status}), ` +
      `written as ${run.format === 'parquet' ? 'Parquet shards' : run.format === 'conversations' ? 'JSON lines in the `conversations` shape of SpecForge' : 'JSON lines'}.\n\n`,
  );
  out.push('## Model and parameters\n\n');
  out.push(
    `- model: ${markdownCode(run.model)}\n- regenerate: ${run.regenerate ?? 'no (prompts answered as given)'}\n\nParameters sent with every request:\n\n${json(run.params)}\n`,
  );
  if (run.variants?.length) {
    out.push("## Variants\n\nEach sample takes one variant, chosen by a stable hash of its `custom_id`; its params are laid over the run's.\n\n");
    out.push('| variant | weight | params |\n| --- | --- | --- |\n');
    for (const v of run.variants) out.push(`| ${markdownText(v.name)} | ${v.weight} | ${markdownCode(JSON.stringify(v.params ?? {}))} |\n`);
    out.push('\n');
  }
  out.push('## Counts\n\n| split | rows | files |\n| --- | --- | --- |\n');
  for (const s of splits) out.push(`| ${s.split} | ${s.rows} | ${s.files.length} |\n`);
  const c = run.counts;
  out.push(
    `\n${c.total} samples: ${c.completed} completed, ${c.failed} failed, ${c.cancelled} cancelled. ` +
      `Tokens: ${run.usage.prompt_tokens} prompt, ${run.usage.completion_tokens} completion (${run.usage.reasoning_tokens} reasoning).` +
      (run.turns ? ` Requests: ${run.turns.completed} answered, ${run.turns.toolSteps} of them tool-call steps.` : '') +
      '\n\n',
  );
  out.push('## Quality\n\n');
  const flags = Object.entries(run.quality.by_flag).filter(([, n]) => n > 0);
  out.push(`${run.quality.flagged} of ${c.completed} completed samples flagged${flags.length ? ':' : '.'}\n`);
  if (flags.length) out.push('\n| flag | samples |\n| --- | --- |\n' + flags.map(([f, n]) => `| ${f} | ${n} |\n`).join(''));
  out.push('\nFlagged samples are kept, with their `flags`; filter on that column to drop them.\n\n');
  if (run.tokens) out.push(tokensSection(run.tokens.spread, tokenSplits));
  out.push('## How the data was made\n\n');
  out.push(
    run.turns
      ? "Each conversation was regenerated turn by turn through SGLang's OpenAI-compatible chat completions API: every user turn was sent with the replies regenerated for the turns before it (a tool call's results are the source's, paired with the model's calls), and each reply and, for thinking models, its reasoning were kept with its finish reason, token usage and the quality checks' flags. "
      : "Each input prompt was sent to the model through SGLang's OpenAI-compatible chat completions API; the answer and, for thinking models, its reasoning were kept with the finish reason, token usage and the quality checks' flags. ",
  );
  if (run.evalShare !== null) {
    out.push(
      `A stable hash of each \`custom_id\` puts ${percent(run.evalShare)} of samples in \`eval\` and the rest in \`train\`: the same prompt lands in the same split in every run. `,
    );
  }
  out.push(
    `Samples that failed are not in the data: ${errorFiles ? `their errors are in the ${errorFiles} \`*.errors.jsonl\` file(s) beside the shards` : 'none failed'}. ` +
      '`manifest.json` lists every file with its size, row count and sha256.\n',
  );
  return out.join('');
}

const spreadCells = (s: Spread | null): string => (s ? `${s.rows} | ${s.min} | ${s.p5} | ${s.median} | ${s.p95} | ${s.max}` : '0 | | | | |');

/** The training rows: where they are, what a row holds, and the spread of the loss mask's trainable tokens. */
function tokensSection(spread: TrainableSpread, splits: readonly { split: string; files: string[]; rows: number }[]): string {
  const rows = splits.reduce((n, s) => n + s.rows, 0);
  const out = [
    '## Training rows\n\n',
    `${rows} rows under \`tokens/\` (config \`tokens\`), one per generation kept in the data: each answer, and each turn and tool-call step of a conversation. ` +
      "`input_ids` are the server's own token ids, the prompt as its chat template rendered it followed by the generated ids; `loss_mask` is 0 over the prompt and 1 over the generated ids; `num_trainable` is the mask's sum.\n\n",
    'Trainable tokens per row:\n\n| rows of | count | min | p5 | median | p95 | max |\n| --- | --- | --- | --- | --- | --- | --- |\n',
    `| all | ${spreadCells(spread.overall)} |\n`,
    ...Object.entries(spread.variants).map(([name, s]) => `| ${markdownText(name)} | ${spreadCells(s)} |\n`),
    '\n',
  ];
  return out.join('');
}
