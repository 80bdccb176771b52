// @ts-check
// The charts of a run page: throughput, samples/s (filled) and completion tokens/s (line, right
// axis) over the run's whole life, from the server's history (and the progress events since its
// last point); and the projected finish over the run, from the server's forecast history.

const PAD = { left: 52, right: 64, top: 12, bottom: 26 };
const DAY_MS = 86_400_000;

/**
 * The axis maximum: the first of 1, 2, 2.5, 5 and 10 times a power of ten at or above `v`.
 * @param {number} v
 */
function niceMax(v) {
  if (v <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 2.5, 5].map((m) => m * p).find((m) => m >= v) ?? 10 * p;
}

/** @param {number} v */
const short = (v) =>
  v >= 10_000 ? `${(v / 1000).toFixed(0)}k` : v >= 1000 ? `${(v / 1000).toFixed(1)}k` : v >= 10 ? v.toFixed(0) : String(Number(v.toPrecision(3)));
/** @param {number} t */
const clock = (t) => new Date(t).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
/** An axis end: the clock time, with the date when the chart spans more than a day. */
/**
 * @param {number} t
 * @param {number} span
 */
const axisTime = (t, span) => (span > DAY_MS ? `${new Date(t).toLocaleDateString([], { month: 'short', day: 'numeric' })} ${clock(t)}` : clock(t));

/**
 * The canvas sized to its box at the screen's pixel density, cleared, in CSS pixels.
 * @param {HTMLCanvasElement} canvas
 */
function blankCanvas(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = canvas.clientHeight;
  canvas.width = Math.round(width * dpr);
  canvas.height = Math.round(height * dpr);
  const ctx = /** @type {CanvasRenderingContext2D} */ (canvas.getContext('2d'));
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, width, height);
  ctx.font = '11px system-ui, sans-serif';
  return { ctx, width, height };
}

/**
 * The four horizontal grid lines (and the plot's top and bottom), at the heights `label` is given.
 * @param {CanvasRenderingContext2D} ctx
 * @param {number} plotW
 * @param {number} plotH
 * @param {(y: number, i: number) => void} [label] draws a line's labels, if any
 */
function gridLines(ctx, plotW, plotH, label) {
  for (let i = 0; i <= 4; i++) {
    const y = Math.round(PAD.top + (plotH * i) / 4) + 0.5;
    ctx.strokeStyle = '#e4e7ec';
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(PAD.left, y);
    ctx.lineTo(PAD.left + plotW, y);
    ctx.stroke();
    label?.(y, i);
  }
}

/**
 * @param {HTMLCanvasElement} canvas
 * @param {{ t: number, sps: number, tps: number }[]} points
 */
export function drawThroughput(canvas, points) {
  const { ctx, width, height } = blankCanvas(canvas);

  // What the chart spans, for a reader of the page (and its tests) that cannot see the pixels.
  canvas.dataset.points = String(points.length);
  canvas.dataset.from = points.length ? new Date(points[0].t).toISOString() : '';
  canvas.dataset.to = points.length ? new Date(points[points.length - 1].t).toISOString() : '';
  if (points.length < 2) {
    ctx.fillStyle = '#6b7385';
    ctx.textAlign = 'center';
    ctx.fillText('No throughput yet (the server records a point every 5 s while the run is worked on)', width / 2, height / 2);
    return;
  }
  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  const t0 = points[0].t;
  const t1 = points[points.length - 1].t;
  const maxS = niceMax(Math.max(...points.map((p) => p.sps)));
  const maxT = niceMax(Math.max(...points.map((p) => p.tps)));
  /** @param {number} t */
  const x = (/** @type {number} */ t) => PAD.left + (plotW * (t - t0)) / Math.max(1, t1 - t0);
  /** @param {number} v */
  const yS = (v) => PAD.top + plotH - (plotH * v) / maxS;
  /** @param {number} v */
  const yT = (v) => PAD.top + plotH - (plotH * v) / maxT;

  gridLines(ctx, plotW, plotH, (y, i) => {
    ctx.fillStyle = '#2563c9';
    ctx.textAlign = 'right';
    ctx.fillText(short((maxS * (4 - i)) / 4), PAD.left - 6, y + 4);
    ctx.fillStyle = '#c2610c';
    ctx.textAlign = 'left';
    ctx.fillText(short((maxT * (4 - i)) / 4), PAD.left + plotW + 6, y + 4);
  });
  ctx.fillStyle = '#6b7385';
  ctx.textAlign = 'left';
  ctx.fillText(axisTime(t0, t1 - t0), PAD.left, height - 8);
  ctx.textAlign = 'right';
  ctx.fillText(axisTime(t1, t1 - t0), PAD.left + plotW, height - 8);

  ctx.beginPath();
  ctx.moveTo(x(t0), yS(0));
  for (const p of points) ctx.lineTo(x(p.t), yS(p.sps));
  ctx.lineTo(x(t1), yS(0));
  ctx.closePath();
  ctx.fillStyle = 'rgba(37, 99, 201, 0.15)';
  ctx.fill();
  ctx.beginPath();
  for (const [i, p] of points.entries()) i ? ctx.lineTo(x(p.t), yS(p.sps)) : ctx.moveTo(x(p.t), yS(p.sps));
  ctx.strokeStyle = '#2563c9';
  ctx.lineWidth = 2;
  ctx.stroke();

  ctx.beginPath();
  for (const [i, p] of points.entries()) i ? ctx.lineTo(x(p.t), yT(p.tps)) : ctx.moveTo(x(p.t), yT(p.tps));
  ctx.strokeStyle = '#c2610c';
  ctx.lineWidth = 1.5;
  ctx.setLineDash([4, 3]);
  ctx.stroke();
  ctx.setLineDash([]);
}

/**
 * The forecast chart of a run page: the projected finish (line) and its 90% interval (band) at
 * each point of the server's forecast history, so an operator sees whether it holds or drifts.
 * @param {HTMLCanvasElement} canvas
 * @param {import('../client/schema.js').components['schemas']['ForecastPoint'][]} points
 */
export function drawForecast(canvas, points) {
  const { ctx, width, height } = blankCanvas(canvas);
  const known = points.flatMap(({ at, finishes_at, low, high }) =>
    finishes_at ? [{ t: Date.parse(at), f: Date.parse(finishes_at), lo: Date.parse(low ?? finishes_at), hi: Date.parse(high ?? finishes_at) }] : [],
  );
  if (known.length < 2) {
    ctx.fillStyle = '#6b7385';
    ctx.textAlign = 'center';
    ctx.fillText('No forecast history yet (a point every few seconds once the fleet has a rate)', width / 2, height / 2);
    return;
  }
  const plotW = width - PAD.left - PAD.right;
  const plotH = height - PAD.top - PAD.bottom;
  const t0 = known[0].t;
  const t1 = known[known.length - 1].t;
  const yMin = Math.min(...known.map((p) => p.lo));
  const yMax = Math.max(...known.map((p) => p.hi));
  const x = (/** @type {number} */ t) => PAD.left + (plotW * (t - t0)) / Math.max(1, t1 - t0);
  const y = (/** @type {number} */ v) => PAD.top + plotH - (plotH * (v - yMin)) / Math.max(1, yMax - yMin);

  gridLines(ctx, plotW, plotH);
  ctx.fillStyle = '#2563c9';
  ctx.textAlign = 'left';
  ctx.fillText(clock(yMax), 4, PAD.top + 4);
  ctx.fillText(clock(yMin), 4, PAD.top + plotH);
  ctx.fillStyle = '#6b7385';
  ctx.fillText(clock(t0), PAD.left, height - 8);
  ctx.textAlign = 'right';
  ctx.fillText(clock(t1), PAD.left + plotW, height - 8);

  ctx.beginPath();
  for (const [i, p] of known.entries()) i ? ctx.lineTo(x(p.t), y(p.hi)) : ctx.moveTo(x(p.t), y(p.hi));
  for (const p of [...known].reverse()) ctx.lineTo(x(p.t), y(p.lo));
  ctx.closePath();
  ctx.fillStyle = 'rgba(37, 99, 201, 0.15)';
  ctx.fill();
  ctx.beginPath();
  for (const [i, p] of known.entries()) i ? ctx.lineTo(x(p.t), y(p.f)) : ctx.moveTo(x(p.t), y(p.f));
  ctx.strokeStyle = '#2563c9';
  ctx.lineWidth = 2;
  ctx.stroke();
}
