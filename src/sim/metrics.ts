/** What one DP rank reports. */
export interface RankMetrics {
  running: number;
  queued: number;
  tokenUsage: number;
  genThroughput: number;
  cacheHitRate: number;
  retractedWaiting: number;
  retractions: number;
}

export interface MetricValues {
  model: string;
  /** With data parallelism every series carries a dp_rank label. */
  dataParallel: boolean;
  ranks: RankMetrics[];
  promptTokens: number;
  generationTokens: number;
}

const escapeLabel = (value: string): string => value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');

interface Family {
  name: string;
  type: 'gauge' | 'counter';
  help: string;
  value: (rank: RankMetrics) => number;
}

// SGLang's names, types and help texts (observability/metrics_collector.py). num_retracted_reqs
// is a gauge; the cumulative count is num_retracted_requests_total.
const RANK_FAMILIES: Family[] = [
  { name: 'num_running_reqs', type: 'gauge', help: 'The number of running requests.', value: (r) => r.running },
  { name: 'num_queue_reqs', type: 'gauge', help: 'The number of requests in the waiting queue.', value: (r) => r.queued },
  { name: 'token_usage', type: 'gauge', help: 'The token usage.', value: (r) => r.tokenUsage },
  { name: 'gen_throughput', type: 'gauge', help: 'The generation throughput (token/s).', value: (r) => r.genThroughput },
  { name: 'cache_hit_rate', type: 'gauge', help: 'The prefix cache hit rate.', value: (r) => r.cacheHitRate },
  { name: 'num_retracted_reqs', type: 'gauge', help: 'The number of retracted requests.', value: (r) => r.retractedWaiting },
  {
    name: 'num_retracted_requests_total',
    type: 'counter',
    help: 'Total number of retracted requests.',
    value: (r) => r.retractions,
  },
];

/** The subset of SGLang's Prometheus metrics that regen reads, one series per DP rank. */
export function renderMetrics(values: MetricValues): string {
  // A single GPU per rank: tensor, pipeline and expert parallel ranks are all 0.
  const base = `model_name="${escapeLabel(values.model)}",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"`;
  const labels = values.ranks.map((_, i) => `{${base}${values.dataParallel ? `,dp_rank="${i}"` : ''}}`);
  let text = '';
  for (const family of RANK_FAMILIES) {
    text += `# HELP sglang:${family.name} ${family.help}\n# TYPE sglang:${family.name} ${family.type}\n`;
    for (const [i, rank] of values.ranks.entries()) text += `sglang:${family.name}${labels[i]} ${family.value(rank)}\n`;
  }
  // The tokenizer process counts these once for the whole server.
  const serverLabels = `{${base}}`;
  const counter = (name: string, help: string, value: number): string =>
    `# HELP sglang:${name} ${help}\n# TYPE sglang:${name} counter\nsglang:${name}${serverLabels} ${value}\n`;
  return (
    text +
    counter('prompt_tokens_total', 'Number of prefill tokens processed.', values.promptTokens) +
    counter('generation_tokens_total', 'Number of generation tokens processed.', values.generationTokens)
  );
}
