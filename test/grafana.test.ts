import { execFile, spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { Metrics } from '../src/services/metrics.js';
import { tempDir } from './support/server.js';

const run = promisify(execFile);
const DASHBOARD = new URL('../grafana/regen.json', import.meta.url);
/** Grafana's reference to the dashboard's Prometheus variable: the data source picked on import. */
const DATASOURCE = '$' + '{datasource}';

const havePromtool = spawnSync('promtool', ['--version'], { stdio: 'ignore' }).status === 0;
if (!havePromtool) {
  if (process.env.CI === 'true') throw new Error('promtool is missing: the Grafana test needs Debian’s prometheus package on CI');
  console.warn('SKIPPED: promtool (Debian package prometheus) is missing, so the Grafana dashboard’s queries are not parsed');
}

interface Target {
  expr: string;
}
interface Panel {
  type: string;
  title: string;
  targets?: Target[];
  datasource?: { uid: string };
}
const dashboard = JSON.parse(readFileSync(DASHBOARD, 'utf8')) as {
  panels: Panel[];
  templating: { list: { name: string; definition?: string }[] };
};
const panels = dashboard.panels.filter((p) => p.type !== 'row');

/**
 * Each query of the dashboard, with Grafana's variables given values Prometheus would see: the
 * rate interval a duration, the run selector's regex "All".
 */
const queries = [
  ...panels.flatMap((p) => (p.targets ?? []).map((t, i) => ({ where: `${p.title} (${String.fromCharCode(65 + i)})`, expr: t.expr }))),
  ...dashboard.templating.list.flatMap((v) => (v.definition ? [{ where: `variable ${v.name}`, expr: v.definition }] : [])),
].map(({ where, expr }) => ({ where, expr, promql: expr.replaceAll('$__rate_interval', '1m').replaceAll('$run', '.*') }));

/** Words of PromQL that are not metric names where an identifier not followed by "(" may stand. */
const KEYWORDS = new Set(['and', 'or', 'unless', 'bool', 'offset', 'inf', 'nan']);

/**
 * The metric names a query selects: identifiers left once strings, label matchers, ranges and the
 * label lists of by/without/on/ignoring/group_left/group_right are taken out, functions (followed
 * by "(") and operators' keywords aside. Grafana's label_values(metric, label) names its metric first.
 */
function metricNames(promql: string): string[] {
  const labelValues = /^label_values\((\w+),/.exec(promql);
  if (labelValues) return [labelValues[1]];
  const bare = promql
    .replace(/"(?:[^"\\]|\\.)*"/g, '""')
    .replace(/\{[^}]*\}/g, '')
    .replace(/\[[^\]]*\]/g, '')
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ');
  return [...bare.matchAll(/\b[a-zA-Z_:][\w:]*\b(?!\s*\()/g)].map((m) => m[0]).filter((w) => !KEYWORDS.has(w.toLowerCase()));
}

/** Every series name regen's /metrics can carry: its registry's metrics, a histogram's three series. */
async function exported(): Promise<Set<string>> {
  const metrics = await new Metrics().registry.getMetricsAsJSON();
  return new Set(metrics.flatMap((m) => (String(m.type) === 'histogram' ? ['_bucket', '_sum', '_count'].map((s) => m.name + s) : [m.name])));
}

describe('the Grafana dashboard (grafana/regen.json)', () => {
  it('has the dashboard page’s panels, each reading the chosen Prometheus', () => {
    const titles = panels.map((p) => p.title);
    for (const want of [
      'Fleet throughput (requests/s)',
      'Fleet throughput (tokens/s)',
      'Run throughput (samples/s)',
      'Run throughput (turns/s)',
      'Run throughput (requests/s)',
      'In flight per run (requests and samples)',
      'Run throughput (tokens/s)',
      'In flight and cap per endpoint',
      'Progress',
      "ETA at the last 10 minutes' rate",
      'Quality flags raised',
      'Retries by reason',
      'Failed samples',
      'Shard uploads',
      'Prefix-cache hit rate',
    ])
      expect(titles).toContain(want);
    for (const p of panels) {
      expect(p.datasource?.uid, p.title).toBe(DATASOURCE);
      expect(p.targets?.length, p.title).toBeGreaterThan(0);
    }
  });

  it('names only metrics regen exports, at least one in every query', async () => {
    const names = await exported();
    expect(names.has('regen_run_completion_tokens_total')).toBe(true);
    const unknown = queries.flatMap(({ where, promql }) => {
      const used = metricNames(promql);
      if (!used.length) return [`${where}: no metric in ${promql}`];
      return used.filter((n) => !names.has(n)).map((n) => `${where}: ${n}`);
    });
    expect(unknown).toEqual([]);
    // The reading can fail: a name regen does not export is caught.
    expect(metricNames('sum by (run_id) (rate(regen_samples_total{run_id=~".*"}[1m])) / on (run_id) regen_runs').filter((n) => !names.has(n))).toEqual([
      'regen_samples_total',
    ]);
  });

  it.skipIf(!havePromtool)('parses as PromQL, every query (promtool check rules)', async () => {
    const dir = tempDir('regen-grafana-');
    try {
      // Each query a recording rule, named after its panel so promtool's complaint points at it; JSON is YAML.
      const rules = (exprs: string[]) => ({ groups: [{ name: 'grafana', rules: exprs.map((expr, i) => ({ record: `grafana:query_${i}`, expr })) }] });
      const file = join(dir.dir, 'rules.yml');
      const exprs = queries.filter((q) => !q.where.startsWith('variable'));
      writeFileSync(file, JSON.stringify(rules(exprs.map((q) => q.promql))));
      const checked = await run('promtool', ['check', 'rules', file]).catch((err) => err as { stdout: string; stderr: string; code: number });
      expect('code' in checked ? `${checked.stdout}${checked.stderr}` : '', exprs.map((q, i) => `query_${i}: ${q.where}`).join('\n')).toBe('');
      expect(checked.stdout).toContain(`SUCCESS: ${exprs.length} rules found`);
      // And a query that is not PromQL is refused, so the check above can fail.
      writeFileSync(file, JSON.stringify(rules(['sum(rate(regen_runs[1m])'])));
      await expect(run('promtool', ['check', 'rules', file])).rejects.toMatchObject({ code: 1 });
    } finally {
      dir.cleanup();
    }
  });
});
