// history.js: usage over a window (1h / 6h / 24h / 7d, or ?since=&until= as given): GPU allocation per
// tenant (stacked), utilisation per GPU model, submit-to-placed waits per tenant (histograms with
// p50/p90/p99) and preemptions over time. A relative window slides forward once a minute.

import { getJSON, withQuery } from './api.js';
import { h, fmtInt, fmtNum, fmtPct, fmtDuration, fmtTime, tenantColour, seriesColour, throttle } from './app.js';
import { timeChart, barChart } from './chart.js';

const RANGES = { '1h': 3600, '6h': 6 * 3600, '24h': 86400, '7d': 7 * 86400 };
const BIN_LABELS = { 1: '≤1s', 10: '≤10s', 60: '≤1m', 300: '≤5m', 1800: '≤30m', 3600: '≤1h' };

export function mount(view, ctx) {
  const { signal, params } = ctx;
  const explicit = params.get('since') || params.get('until');
  const range = RANGES[params.get('range')] ? params.get('range') : explicit ? null : '24h';

  const links = h('nav', { class: 'segmented', 'aria-label': 'Window' }, Object.keys(RANGES).map((r) =>
    h('a', { href: `/ui/history?range=${r}`, class: 'seg range-link', dataset: { range: r },
      'aria-current': r === range ? 'page' : null }, r)));
  const windowText = h('span', { id: 'history-window', class: 'muted' });
  const alloc = h('section', { id: 'chart-allocation', class: 'card' });
  const util = h('section', { id: 'chart-utilisation', class: 'card' });
  const waits = h('section', { id: 'waits', class: 'card' });
  const preempt = h('section', { id: 'chart-preemptions', class: 'card' });

  view.append(h('section', { class: 'page page-history' },
    h('div', { class: 'page-head' }, h('h1', {}, 'History'), links, windowText),
    alloc, util, waits, preempt));
  for (const [el, title] of [[alloc, 'GPU allocation by tenant'], [util, 'Utilisation by GPU model'],
    [waits, 'Waits from submit to placed'], [preempt, 'Preemptions']]) {
    el.append(h('h2', {}, title), h('p', { class: 'muted' }, 'Loading…'));
  }

  function windowParams() {
    if (range) {
      const until = new Date();
      return { since: new Date(until.getTime() - RANGES[range] * 1000).toISOString(), until: until.toISOString() };
    }
    return { since: params.get('since') || '', until: params.get('until') || '' };
  }

  const ms = (iso) => new Date(iso).getTime();

  /** Sum rows into one series per key: key(row) -> name; value(point) -> number|null. */
  function group(rows, key, value, combine) {
    const out = new Map();
    for (const row of rows) {
      const name = key(row) || '—';
      if (!out.has(name)) out.set(name, new Map());
      const acc = out.get(name);
      for (const p of row.points || []) {
        const t = ms(p[0]);
        acc.set(t, combine(acc.get(t), p));
      }
    }
    return [...out.entries()].sort((a, b) => a[0].localeCompare(b[0])).map(([name, acc]) => ({
      name, points: [...acc.entries()].sort((a, b) => a[0] - b[0]).map(([t, v]) => [t, value(v)]),
    }));
  }

  function put(section, title, ...content) {
    section.replaceChildren(h('h2', {}, title), ...content);
  }

  function render(doc) {
    const width = Math.max(320, (alloc.clientWidth || 800) - 34);   // draw charts at their real width
    const stepMs = (doc.step_s || 0) * 1000 || undefined;
    const since = doc.since ? ms(doc.since) : undefined, until = doc.until ? ms(doc.until) : undefined;
    windowText.textContent = `${fmtTime(doc.since)} – ${fmtTime(doc.until)}${doc.step_s ? ` · every ${fmtDuration(doc.step_s)}` : ''}${doc.tenant ? ` · tenant ${doc.tenant}` : ''}`;
    const rows = doc.series || [];

    // allocation: per tenant, the sum over models of allocated GPUs
    const byTenant = group(rows, (r) => r.tenant, (v) => v, (acc, p) => (acc || 0) + (Number(p[1]) || 0));
    byTenant.forEach((s) => { s.color = tenantColour(s.name); });
    put(alloc, 'GPU allocation by tenant', timeChart({
      series: byTenant, mode: 'area', stacked: true, stepMs, since, until, width,
      yFormat: (v) => fmtNum(v, 1), label: 'Allocated GPUs over time, stacked by tenant',
    }), h('p', { class: 'muted small' }, 'Allocated GPUs (mean per step), stacked by tenant.'));

    // utilisation: per model, the allocation-weighted mean of the tenants' means
    const byModel = group(rows, (r) => r.gpu_model, (v) => (v && v.w ? v.sum / v.w : v && v.n ? v.plain / v.n : null),
      (acc, p) => {
        const a = acc || { sum: 0, w: 0, plain: 0, n: 0 };
        const u = p[3];
        if (u !== null && u !== undefined) {
          const w = Number(p[1]) || 0;
          a.sum += u * w; a.w += w; a.plain += u; a.n += 1;
        }
        return a;
      });
    byModel.forEach((s, i) => { s.color = seriesColour(i + 3); });
    put(util, 'Utilisation by GPU model', timeChart({
      series: byModel, mode: 'line', stacked: false, stepMs, since, until, width, yMax: 100,
      yFormat: (v) => fmtPct(v), label: 'Mean GPU utilisation over time per model',
    }), h('p', { class: 'muted small' }, 'Mean utilisation of allocated GPUs, weighted by allocation.'));

    // waits: per tenant, a histogram and its percentiles
    const waitRows = (doc.waits || []).filter((w) => w.count);
    put(waits, 'Waits from submit to placed', waitRows.length
      ? h('div', { class: 'wait-grid' }, waitRows.map((w) => h('div', { class: 'wait-card', dataset: { tenant: w.tenant || '' } },
        h('h3', {}, w.tenant || '—'),
        h('p', { class: 'percentiles' },
          h('span', {}, h('span', { class: 'muted' }, 'jobs '), fmtInt(w.count)),
          h('span', { class: 'p50' }, h('span', { class: 'muted' }, 'p50 '), fmtDuration(w.p50_s)),
          h('span', { class: 'p90' }, h('span', { class: 'muted' }, 'p90 '), fmtDuration(w.p90_s)),
          h('span', { class: 'p99' }, h('span', { class: 'muted' }, 'p99 '), fmtDuration(w.p99_s))),
        barChart({
          bars: (w.histogram || []).map((b) => ({
            label: b.le_s === null || b.le_s === undefined ? '>1h' : BIN_LABELS[b.le_s] || `≤${fmtDuration(b.le_s)}`,
            value: b.count || 0,
          })),
          color: tenantColour(w.tenant), label: `Wait-time histogram for ${w.tenant}`,
        }))))
      : [h('p', { class: 'empty' }, 'No job was placed in this window.')]);

    // preemptions: per tenant, counts per step as stacked bars
    const pre = (doc.preemptions || []).map((p) => ({
      name: p.tenant || '—', color: tenantColour(p.tenant), points: (p.points || []).map((q) => [ms(q[0]), q[1]]),
    })).filter((s) => s.points.some((q) => q[1]));
    const total = pre.reduce((n, s) => n + s.points.reduce((m, q) => m + (Number(q[1]) || 0), 0), 0);
    put(preempt, 'Preemptions', pre.length
      ? timeChart({ series: pre, mode: 'bar', stacked: true, stepMs, since, until, width, height: 160, yFormat: (v) => fmtNum(v, 0),
        label: 'Preemptions per step by tenant' })
      : h('p', { class: 'empty' }, 'No preemptions in this window.'),
    pre.length ? h('p', { class: 'muted small' }, `${fmtInt(total)} preemptions in the window.`) : null);
  }

  async function load() {
    const doc = await getJSON(withQuery('/v1/history', windowParams()), { signal });
    if (!signal.aborted) render(doc);
  }

  const refresh = throttle(load, 1000);
  refresh();
  const timer = range ? setInterval(refresh, 60000) : 0;
  return {
    onReset: refresh,
    unmount() {
      refresh.cancel();
      clearInterval(timer);
    },
  };
}
