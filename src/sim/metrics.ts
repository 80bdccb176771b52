export interface MetricValues {
  running: number;
  queued: number;
  promptTokens: number;
  generationTokens: number;
}

const escapeLabel = (value: string): string => value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');

/** The subset of SGLang's Prometheus metrics that regen reads, under SGLang's names. */
export function renderMetrics(model: string, values: MetricValues): string {
  const labels = `{model_name="${escapeLabel(model)}"}`;
  const metric = (name: string, type: 'gauge' | 'counter', help: string, value: number): string =>
    `# HELP sglang:${name} ${help}\n# TYPE sglang:${name} ${type}\nsglang:${name}${labels} ${value}\n`;
  return (
    metric('num_running_reqs', 'gauge', 'The number of running requests.', values.running) +
    metric('num_queue_reqs', 'gauge', 'The number of requests in the waiting queue.', values.queued) +
    metric('prompt_tokens_total', 'counter', 'Number of prefill tokens processed.', values.promptTokens) +
    metric('generation_tokens_total', 'counter', 'Number of generation tokens processed.', values.generationTokens)
  );
}
