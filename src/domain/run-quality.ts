import { ContentCounter, type TopContent } from './content-counter.js';
import { FLAGS, flagBit, type Flag, GATE_EXEMPT_BITS } from './flags.js';
import { LengthHistogram } from './length-histogram.js';
import { computeFlags, type GateSettings, isStep, percent, type QualityCheckConfig, type QualityInput, VERDICT_PREFIX } from './quality.js';
import { toolCallParser } from './tools.js';
import { type EndpointCounts, type EndpointQuarantine, endpointVerdict, QUALITY_WINDOW, QualityWindow, windowsOverLimit } from './quality-window.js';

// One run's quality as its answers come in: the checks that need the run so far (duplicate_content,
// short_for_run, each against the answer's own variant) on top of computeFlags, the run's window for the gate, and a window per endpoint
// to tell one bad server from a bad run. O(1) a sample, memory bounded whatever the run's size.

/** What the gate says of a run now. */
export interface RunVerdict {
  /** The run's window is over its limit: pause the run with `reason`. */
  overLimit: boolean;
  /** The operator's words, set when overLimit. */
  reason: string | null;
  /** Endpoints worse than their peers, to take out of dispatch, each with its reason. */
  quarantine: (EndpointQuarantine & { reason: string })[];
}

/** One endpoint's recent answers for a run, as the quarantine sees them. */
export interface EndpointShare {
  endpointId: string;
  samples: number;
  flagged: number;
  share: number;
  /** The flag most of its flagged answers carry; null when none is flagged. */
  topFlag: Flag | null;
}

/** One completed sample as the database holds it, for restore. */
export interface CompletedRow {
  flags: number;
  endpointId: string | null;
  variant?: number | null;
}

/**
 * What the checks that compare an answer with the run compare it with: its own variant's answers
 * (a run without variants is one), so a variant of short plain answers is never short for a run of
 * long thinking ones, and one variant's answers never duplicate another's.
 */
interface Peers {
  contents: ContentCounter;
  lengths: LengthHistogram;
  /** The variant's kept answers, for the gate: a broken variant is caught however small its share. */
  window: QualityWindow;
}

export class RunQuality {
  private readonly peers = new Map<number | null, Peers>();
  private readonly window: QualityWindow;
  /**
   * This process's own kept answers, never restored: what it publishes for the other replicas'
   * gates (PostgreSQL), where the restored window would count their answers a second time.
   */
  private readonly own: QualityWindow;
  private readonly endpoints = new Map<string, QualityWindow>();

  constructor(
    private readonly cfg: QualityCheckConfig & {
      model: string /** The run's variants' names, by index, for the gate's words. */;
      variants?: readonly string[];
    },
    private readonly capacity = QUALITY_WINDOW,
  ) {
    this.window = new QualityWindow(capacity);
    this.own = new QualityWindow(capacity);
  }

  /**
   * The flags of one answer from an endpoint: computeFlags, then duplicate_content and
   * short_for_run against the run's answers so far. Call it for every answer, one to be asked
   * again included: each is evidence about its endpoint, whose window it enters here.
   */
  check(input: QualityInput, endpointId: string, variant: number | null = null): number {
    let flags = computeFlags(input, this.cfg);
    const peers = this.peersOf(variant);
    // A step's content and length are not an answer's: they neither are compared with the run's nor join them.
    if (!isStep(input)) {
      if (peers.contents.observe(input.content).flagged) flags |= flagBit('duplicate_content');
      if (peers.lengths.isShort(input.completion_tokens)) flags |= flagBit('short_for_run');
      peers.lengths.add(input.completion_tokens);
    }
    this.endpointWindow(endpointId).push(flags);
    return flags;
  }

  /**
   * An answer cut while streaming because it looped: flagged repetitive, and nothing else, since
   * its text is partial (its length and content say nothing of the run). It enters its
   * endpoint's window as any answer does.
   */
  cut(endpointId: string): number {
    const flags = flagBit('repetitive');
    this.endpointWindow(endpointId).push(flags);
    return flags;
  }

  /** A sample kept as completed, with the flags it is stored with: it enters the run's window, and its variant's. */
  completed(bits: number, variant: number | null = null): void {
    const flags = bits & ~GATE_EXEMPT_BITS;
    this.window.push(flags);
    this.own.push(flags);
    if (variant !== null) this.peersOf(variant).window.push(flags);
  }

  /**
   * The run's gate and the endpoints to quarantine, among `inRotation` when given (the endpoints
   * that can take the run's work now). O(texts in the content window + endpoints): call it with
   * the gate's check, not per sample.
   */
  verdict(
    gate: GateSettings,
    inRotation?: ReadonlySet<string>,
    peers: readonly EndpointCounts[] = [],
    /** PostgreSQL: the other replicas' windows of their own answers of the run, judged with this one's. */
    otherWindows: readonly EndpointCounts[] = [],
  ): RunVerdict {
    // Alone, the run's window as restored and grown; with others answering, each one's own answers once.
    const overLimit = otherWindows.length ? windowsOverLimit(this.window.total, [this.own, ...otherWindows], gate) : this.window.overLimit(gate);
    // Judged against the endpoints that can still take work, so that one always stays among them.
    const judged = inRotation ? new Map([...this.endpoints].filter(([id]) => inRotation.has(id))) : this.endpoints;
    const quarantine = endpointVerdict(judged, gate, peers).map((q) => ({ ...q, reason: explainQuarantine(q, this.facts(this.window, gate)) }));
    if (overLimit) return { overLimit, reason: explainVerdict(this.facts(this.window, gate)), quarantine };
    // Each variant judged on its own answers (this process's, on PostgreSQL): one broken variant of a
    // small share would never take the run's window over its limit.
    for (const [variant, p] of this.peers) {
      if (variant === null || !p.window.overLimit(gate)) continue;
      const name = this.cfg.variants?.[variant] ?? String(variant);
      const words = explainVerdict({ ...this.facts(p.window, gate), topContent: p.contents.top(), medianTokens: p.lengths.median() });
      return { overLimit: true, reason: `${VERDICT_PREFIX} variant ${name}:${words.slice(VERDICT_PREFIX.length)}`, quarantine };
    }
    return { overLimit: false, reason: null, quarantine };
  }

  /**
   * After a restart: the run's latest completed samples, newest first (the query in
   * QualityWindow.restore, with endpoint_id), its completed count, and its completion lengths as
   * (tokens, samples) pairs. Endpoint windows get those samples' kept answers until new ones come;
   * the content counter starts empty (see ContentCounter).
   */
  restore(
    newestFirst: readonly CompletedRow[],
    completed: number,
    lengths: Iterable<readonly [tokens: number, samples: number, variant?: number | null]>,
  ): void {
    this.window.restore(
      newestFirst.map((r) => r.flags & ~GATE_EXEMPT_BITS),
      completed,
    );
    this.endpoints.clear();
    const byEndpoint = new Map<string, number[]>();
    for (const r of newestFirst) {
      if (r.endpointId === null) continue;
      const flags = byEndpoint.get(r.endpointId);
      if (flags) flags.push(r.flags & ~GATE_EXEMPT_BITS);
      else byEndpoint.set(r.endpointId, [r.flags & ~GATE_EXEMPT_BITS]);
    }
    for (const [id, flags] of byEndpoint) this.endpointWindow(id).restore(flags);
    // Each variant's window from its share of those samples: judged again once it holds min_samples.
    const byVariant = new Map<number, number[]>();
    for (const r of newestFirst) {
      if (r.variant === null || r.variant === undefined) continue;
      const flags = byVariant.get(r.variant);
      if (flags) flags.push(r.flags & ~GATE_EXEMPT_BITS);
      else byVariant.set(r.variant, [r.flags & ~GATE_EXEMPT_BITS]);
    }
    for (const [variant, flags] of byVariant) this.peersOf(variant).window.restore(flags);
    for (const [tokens, samples, variant] of lengths) this.peersOf(variant ?? null).lengths.add(tokens, samples);
  }

  private peersOf(variant: number | null): Peers {
    let p = this.peers.get(variant);
    if (!p) {
      p = { contents: new ContentCounter(), lengths: new LengthHistogram(), window: new QualityWindow(this.capacity) };
      this.peers.set(variant, p);
    }
    return p;
  }

  /** This process's own window of the run in numbers (never restored): its samples and how many were flagged. */
  windowCounts(): EndpointCounts {
    return { size: this.own.size, flagged: this.own.flagged };
  }

  /** Each endpoint's window: what the quarantine judges, the most flagged first. */
  endpointShares(): EndpointShare[] {
    return [...this.endpoints]
      .map(([endpointId, w]) => ({ endpointId, samples: w.size, flagged: w.flagged, share: w.share, topFlag: w.dominantFlag() }))
      .sort((a, b) => b.share - a.share || a.endpointId.localeCompare(b.endpointId));
  }

  /** Forgets an endpoint's answers: once it is removed, or put back after a fix. */
  forgetEndpoint(endpointId: string): void {
    this.endpoints.delete(endpointId);
  }

  private endpointWindow(endpointId: string): QualityWindow {
    let w = this.endpoints.get(endpointId);
    if (!w) {
      w = new QualityWindow(this.capacity);
      this.endpoints.set(endpointId, w);
    }
    return w;
  }

  private facts(window: QualityWindow, gate: GateSettings): VerdictFacts {
    // The words name the largest group's commonest text and median: the run's, when it has no variants.
    const largest = [...this.peers.values()].sort((a, b) => b.lengths.total - a.lengths.total)[0];
    return {
      window,
      gate,
      topContent: largest?.contents.top() ?? null,
      medianTokens: largest?.lengths.median() ?? null,
      model: this.cfg.model,
      minTrainable: this.cfg.min_trainable_tokens,
    };
  }
}

// ---- the operator's words ----

/** What a verdict is made of. */
export interface VerdictFacts {
  window: QualityWindow;
  gate: GateSettings;
  /** The run's commonest recent text (ContentCounter.top). */
  topContent: TopContent | null;
  /** The run's median completion length (LengthHistogram.median). */
  medianTokens: number | null;
  model: string;
  /** quality.min_trainable_tokens, for the few_trainable words. */
  minTrainable?: number;
}

// Hints named for at most this many flags, the commonest first: the rest are in the counts.
const MAX_HINTS = 2;

/**
 * "quality gate: 87% of the last 400 samples flagged (limit 20%): think_in_content 87%, truncated
 * 3%; the server returns its thinking inside content: launch SGLang with --reasoning-parser qwen3"
 */
export function explainVerdict(f: VerdictFacts): string {
  const { window: w } = f;
  return `${VERDICT_PREFIX} ${percent(w.flagged, w.size)} of the last ${w.size} samples flagged (limit ${limit(f.gate)}): ${flagShares(w)}${hints(f)}`;
}

/** "quality gate: endpoint gpu-3: 87% of its last 50 answers flagged against 0% on the other endpoints: …" */
export function explainQuarantine(q: EndpointQuarantine, f: Omit<VerdictFacts, 'window'>): string {
  const hint = HINTS[q.flag]({ ...f, share: q.flagShare });
  return `${VERDICT_PREFIX} endpoint ${q.endpointId}: ${percent(q.share, 1)} of its last ${q.samples} answers flagged against ${percent(q.peerShare, 1)} on the other endpoints: ${q.flag} ${percent(q.flagShare, 1)}; ${hint}`;
}

function limit(gate: GateSettings): string {
  return `${Math.round(1000 * gate.max_flag_rate) / 10}%`;
}

function flagShares(w: QualityWindow): string {
  const counts = w.counts();
  return FLAGS.filter((f) => counts[f] > 0)
    .sort((a, b) => counts[b] - counts[a])
    .map((f) => `${f} ${percent(counts[f], w.size)}`)
    .join(', ');
}

function hints(f: VerdictFacts): string {
  const counts = f.window.counts();
  const named = FLAGS.filter((flag) => counts[flag] > 0).sort((a, b) => counts[b] - counts[a]);
  // A server without a reasoning parser also leaves reasoning_content empty: think_in_content is
  // the cause of missing_reasoning, so it is named first whenever it is over the limit.
  // Likewise a server without a tool-call parser: its calls land in content, whatever else fires.
  // And a loss mask of a few tokens: the training rows are useless, whatever flag the text raises.
  for (const flag of ['think_in_content', 'tool_call_in_content', 'few_trainable'] as const) {
    const cause = named.indexOf(flag);
    if (cause > 0 && counts[flag] > f.gate.max_flag_rate * f.window.size) named.unshift(...named.splice(cause, 1));
  }
  return named
    .slice(0, MAX_HINTS)
    .map((flag) => `; ${HINTS[flag]({ ...f, share: counts[flag] / f.window.size })}`)
    .join('');
}

/** What a hint reads: the facts, and the share of the window its flag holds when known. */
type HintFacts = Omit<VerdictFacts, 'window'> & { share?: number };

/** What each flag means on a server, and what to check. */
const HINTS: Record<Flag, (f: HintFacts) => string> = {
  empty_content: () => 'answers are empty: check the chat template, and max_tokens when the think block never closes',
  missing_reasoning: () =>
    'thinking was asked for but reasoning_content is empty: check that SGLang runs with --reasoning-parser and that the chat template thinks (enable_thinking)',
  truncated: () => 'answers stop at max_tokens (finish_reason length): raise max_tokens, or look for loops',
  repetitive: () => 'answers loop on the same text: check temperature and the repetition penalties',
  too_short: () => "answers are under the run's min_completion_tokens",
  duplicate_content: ({ topContent: top }) =>
    top ? `${percent(top.share, 1)} of recent answers are the same text '${top.text}'` : 'many answers are the same text',
  think_in_content: ({ model }) => `the server returns its thinking inside content: launch SGLang with --reasoning-parser ${reasoningParser(model)}`,
  tool_call_in_content: ({ model }) =>
    `tools were offered and the server writes its calls inside content: launch SGLang with --tool-call-parser ${toolCallParser(model)}`,
  invalid_tool_arguments: () => "tool calls' arguments are not a JSON object: check the tool-call parser and the tools' schemas",
  unknown_tool: () => "tool calls name functions the line's tools do not offer: check the tools sent and the tool-call parser",
  tool_mismatch: () => "the source's tool results could not be paired with the target's calls (the data, not the server)",
  few_trainable: ({ share, minTrainable }) =>
    `${share === undefined ? 'many' : percent(share, 1)} of rows have fewer than ${minTrainable ?? 16} trainable tokens: the loss mask would train the drafter on almost nothing; check the chat template and thinking (an empty think block and a throwaway answer), and the stop settings`,
  short_for_run: ({ medianTokens }) =>
    `answers are far shorter than the run's median${medianTokens === null ? '' : ` (median ${Math.round(medianTokens)} tokens)`}: check the chat template and the stop settings`,
};

/** SGLang's parser for the model's think tags (SGLang "Reasoning Parser"), by its name. */
export function reasoningParser(model: string): string {
  const m = model.toLowerCase();
  // R1 and its distillations (on Qwen bases too) take deepseek-r1.
  if (/deepseek.*(r1|reasoner)/.test(m)) return 'deepseek-r1';
  if (m.includes('qwen3')) return 'qwen3';
  if (m.includes('deepseek')) return 'deepseek-v3';
  return "<the model's parser: qwen3, deepseek-r1, …>";
}
