// chart.js: small SVG charts of our own: a time chart (lines, stacked areas or stacked bars over time,
// with a legend and a hover readout) and a bar chart of labelled bins (histograms). Drawn in a fixed
// viewBox that scales to the container's width; text is text (textContent), never markup.

import { h, svg, fmtNum, fmtTime, seriesColour } from './app.js';

const DEFAULT_W = 800;   // viewBox width when the caller does not say how wide the chart is drawn
const M = { left: 56, right: 14, top: 12, bottom: 28 };

/** A round number >= x (1, 2, 2.5, 5 x 10^k). */
function niceCeil(x) {
  if (!(x > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(x));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= x) return m * p;
  return 10 * p;
}

function yTicks(max, n = 4) {
  const step = niceCeil(max / n);
  const out = [];
  for (let v = 0; v <= max + step / 1e6; v += step) out.push(v);
  return out;
}

function timeTicks(t0, t1, n = 6) {
  const span = t1 - t0;
  const steps = [60, 300, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800].map((s) => s * 1000);
  const step = steps.find((s) => span / s <= n) || steps[steps.length - 1];
  const tzOffset = new Date(t0).getTimezoneOffset() * 60000;   // ticks on local round times
  const out = [];
  for (let t = Math.ceil((t0 - tzOffset) / step) * step + tzOffset; t <= t1; t += step) out.push(t);
  return { ticks: out, long: span > 36 * 3600 * 1000 };
}

const shortTime = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit' });
const dayTime = new Intl.DateTimeFormat(undefined, { month: 'short', day: 'numeric' });
const dayHour = new Intl.DateTimeFormat(undefined, { month: 'short', day: 'numeric', hour: '2-digit' });

/** An empty chart: its frame and a plain message, so an empty window never looks like a broken chart. */
function emptyChart(fig, width, height) {
  fig.classList.add('chart-empty');
  const root = svg('svg', { viewBox: `0 0 ${width} ${height}`, class: 'chart-svg', role: 'img', 'aria-label': 'No samples in this window' },
    svg('line', { x1: 8, x2: width - 8, y1: height - 24, y2: height - 24, class: 'axis-line' }),
    svg('text', { x: width / 2, y: height / 2, class: 'empty-text', 'text-anchor': 'middle' }, 'No samples in this window.'));
  fig.append(root);
  return fig;
}

function legend(series) {
  return h('div', { class: 'legend chart-legend' }, series.map((s, i) => {
    const sw = h('span', { class: 'swatch' });
    sw.style.backgroundColor = s.color || seriesColour(i);
    return h('span', { class: 'legend-item' }, sw, s.name);
  }));
}

/**
 * timeChart({series: [{name, color?, points: [[ms, value|null], ...]}], mode: 'line'|'area'|'bar',
 *   stacked, stepMs, since, until, yFormat, yMax, width, height, label}) -> <figure class="chart">.
 * `stepMs` (the sampling step) tells real gaps (no point for longer than 1.5 steps) from neighbours.
 * Stacked: a series without a point at a time another has counts 0 there.
 */
export function timeChart(opts) {
  const { mode = 'line', stacked = mode !== 'line', yFormat = (v) => fmtNum(v, 1), height = 240, label = '' } = opts;
  const W = Math.max(320, Math.round(opts.width || DEFAULT_W));   // pass the container's width: text stays 1:1
  const series = opts.series.map((s, i) => ({ ...s, color: s.color || seriesColour(i),
    map: new Map(s.points.filter((p) => p[1] !== null && p[1] !== undefined).map((p) => [p[0], Number(p[1])])) }));
  const xs = [...new Set(series.flatMap((s) => [...s.map.keys()]))].sort((a, b) => a - b);
  const fig = h('figure', { class: 'chart', 'aria-label': label });
  if (!xs.length) return emptyChart(fig, W, Math.min(height, 140));
  const diffs = xs.slice(1).map((x, i) => x - xs[i]).sort((a, b) => a - b);
  const step = opts.stepMs || diffs[Math.floor(diffs.length / 2)] || 60000;
  const t0 = Math.min(xs[0], opts.since ?? Infinity), t1 = Math.max(xs[xs.length - 1], opts.until ?? -Infinity, xs[0] + step);

  // stacked values: lower/upper per series per x
  const stack = series.map(() => new Map());
  let max = 0;
  for (const x of xs) {
    let base = 0;
    series.forEach((s, i) => {
      const v = s.map.has(x) ? s.map.get(x) : stacked ? 0 : null;
      if (v === null) return;
      const lo = stacked ? base : 0, hi = lo + v;
      stack[i].set(x, [lo, hi]);
      if (stacked) base = hi;
      max = Math.max(max, hi);
    });
  }
  const yTop = opts.yMax ?? niceCeil(max || 1);
  const ticks = yTicks(yTop);
  const pw = W - M.left - M.right, ph = height - M.top - M.bottom;
  const X = (t) => M.left + ((t - t0) / (t1 - t0 || 1)) * pw;
  const Y = (v) => M.top + ph - (Math.min(v, yTop) / yTop) * ph;

  const root = svg('svg', { viewBox: `0 0 ${W} ${height}`, class: 'chart-svg', role: 'img', 'aria-label': label });
  // grid and axes
  for (const v of ticks) {
    root.append(svg('line', { x1: M.left, x2: W - M.right, y1: Y(v), y2: Y(v), class: 'grid' }),
      svg('text', { x: M.left - 6, y: Y(v) + 4, class: 'axis', 'text-anchor': 'end' }, yFormat(v)));
  }
  const tt = timeTicks(t0, t1);
  for (const t of tt.ticks) {
    const d = new Date(t);
    const text = tt.long ? (d.getHours() === 0 ? dayTime.format(d) : dayHour.format(d)) : shortTime.format(d);
    root.append(svg('line', { x1: X(t), x2: X(t), y1: M.top + ph, y2: M.top + ph + 4, class: 'tick' }),
      svg('text', { x: X(t), y: height - 8, class: 'axis', 'text-anchor': 'middle' }, text));
  }
  root.append(svg('line', { x1: M.left, x2: W - M.right, y1: M.top + ph, y2: M.top + ph, class: 'axis-line' }));

  // runs of consecutive xs without a gap longer than 1.5 steps
  const runs = (keys) => {
    const out = [];
    let cur = [];
    for (const x of keys) {
      if (cur.length && x - cur[cur.length - 1] > step * 1.5) { out.push(cur); cur = []; }
      cur.push(x);
    }
    if (cur.length) out.push(cur);
    return out;
  };
  const pt = (x, v) => `${X(x).toFixed(1)},${Y(v).toFixed(1)}`;

  series.forEach((s, i) => {
    const vals = stack[i];
    const keys = xs.filter((x) => vals.has(x));
    const g = svg('g', { class: `series series-${mode}` });
    if (mode === 'bar') {
      const bw = Math.max(1, (step / (t1 - t0 || 1)) * pw * 0.8);
      for (const x of keys) {
        const [lo, hi] = vals.get(x);
        if (hi - lo <= 0) continue;
        const r = svg('rect', { x: X(x) - bw / 2, y: Y(hi), width: bw, height: Math.max(0.5, Y(lo) - Y(hi)), fill: s.color },
          svg('title', {}, `${s.name} · ${fmtTime(new Date(x).toISOString())}: ${yFormat(hi - lo)}`));
        g.append(r);
      }
    } else {
      for (const run of runs(keys)) {
        const top = run.map((x) => pt(x, vals.get(x)[1]));
        if (mode === 'area') {
          const bottom = run.slice().reverse().map((x) => pt(x, vals.get(x)[0]));
          g.append(svg('polygon', { points: top.concat(bottom).join(' '), fill: s.color, class: 'area' }));
        }
        if (run.length === 1) g.append(svg('circle', { cx: X(run[0]), cy: Y(vals.get(run[0])[1]), r: 2.5, fill: s.color }));
        else g.append(svg('polyline', { points: top.join(' '), stroke: s.color, class: 'line' }));
      }
    }
    root.append(g);
  });

  // hover readout: the nearest sampled time, every series' value there
  const guide = svg('line', { y1: M.top, y2: M.top + ph, class: 'guide', visibility: 'hidden' });
  const overlay = svg('rect', { x: M.left, y: M.top, width: pw, height: ph, class: 'overlay' });
  root.append(guide, overlay);
  const tip = h('div', { class: 'chart-tip', hidden: true, role: 'status' });
  const nearest = (t) => {
    let lo = 0, hi = xs.length - 1;
    while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (xs[mid] < t) lo = mid; else hi = mid; }
    return Math.abs(xs[lo] - t) <= Math.abs(xs[hi] - t) ? xs[lo] : xs[hi];
  };
  const show = (x, clientX) => {
    guide.setAttribute('x1', X(x));
    guide.setAttribute('x2', X(x));
    guide.setAttribute('visibility', 'visible');
    tip.replaceChildren(h('strong', {}, fmtTime(new Date(x).toISOString())), ...series.map((s, i) => {
      const v = stack[i].get(x);
      const sw = h('span', { class: 'swatch' });
      sw.style.backgroundColor = s.color;
      return h('div', {}, sw, `${s.name}: ${v ? yFormat(v[1] - v[0]) : '—'}`);
    }));
    tip.hidden = false;
    const box = fig.getBoundingClientRect();
    const left = clientX - box.left;
    tip.style.left = `${Math.min(Math.max(0, left + 12), Math.max(0, box.width - 220))}px`;
  };
  overlay.addEventListener('mousemove', (e) => {
    const box = root.getBoundingClientRect();
    const t = t0 + (((e.clientX - box.left) / box.width) * W - M.left) / pw * (t1 - t0);
    show(nearest(t), e.clientX);
  });
  overlay.addEventListener('mouseleave', () => { tip.hidden = true; guide.setAttribute('visibility', 'hidden'); });

  // keyboard: focus the chart, arrows move the readout
  let kx = -1;
  fig.tabIndex = 0;
  fig.addEventListener('keydown', (e) => {
    if (e.key !== 'ArrowLeft' && e.key !== 'ArrowRight') return;
    e.preventDefault();
    kx = Math.max(0, Math.min(xs.length - 1, kx < 0 ? xs.length - 1 : kx + (e.key === 'ArrowRight' ? 1 : -1)));
    const box = root.getBoundingClientRect();
    show(xs[kx], box.left + (X(xs[kx]) / W) * box.width);
  });
  fig.addEventListener('blur', () => { tip.hidden = true; guide.setAttribute('visibility', 'hidden'); });

  fig.append(root, tip, legend(series));
  return fig;
}

/**
 * barChart({bars: [{label, value, title?}], yFormat, height, label, color}) -> <figure class="chart">:
 * one bar per labelled bin, its value printed above it.
 */
export function barChart({ bars, yFormat = (v) => fmtNum(v, 0), height = 180, label = '', color = seriesColour(0) }) {
  const fig = h('figure', { class: 'chart chart-bars', 'aria-label': label });
  const width = 420;
  if (!bars.length || bars.every((b) => !b.value)) return emptyChart(fig, width, Math.min(height, 120));
  const m = { left: 8, right: 8, top: 18, bottom: 24 };
  const pw = width - m.left - m.right, ph = height - m.top - m.bottom;
  const max = Math.max(...bars.map((b) => b.value || 0)) || 1;
  const slot = pw / bars.length;
  const root = svg('svg', { viewBox: `0 0 ${width} ${height}`, class: 'chart-svg', role: 'img', 'aria-label': label });
  bars.forEach((b, i) => {
    const v = b.value || 0;
    const bh = (v / max) * ph;
    const x = m.left + i * slot + slot * 0.12;
    root.append(
      svg('rect', { x, y: m.top + ph - bh, width: slot * 0.76, height: Math.max(v ? 1 : 0, bh), fill: color, class: 'hist-bar' },
        svg('title', {}, b.title || `${b.label}: ${yFormat(v)}`)),
      svg('text', { x: x + slot * 0.38, y: m.top + ph - bh - 4, class: 'value', 'text-anchor': 'middle' }, yFormat(v)),
      svg('text', { x: x + slot * 0.38, y: height - 8, class: 'axis', 'text-anchor': 'middle' }, b.label));
  });
  root.append(svg('line', { x1: m.left, x2: width - m.right, y1: m.top + ph, y2: m.top + ph, class: 'axis-line' }));
  fig.append(root);
  return fig;
}
