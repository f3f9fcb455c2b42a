// history.js: usage over a window (1h / 6h / 24h / 7d, or ?since=&until= as given): GPU allocation per
// tenant (stacked), utilisation per GPU model, submit-to-placed waits per tenant (histograms with
// p50/p90/p99) and preemptions over time. A relative window slides forward once a minute. Where the
// session may (`may.whatif`), a What-if panel replays a window's jobs under placement policies
// (POST /v1/whatif) and tables the figures per policy and per tenant.

import { getJSON, postJSON, withQuery, isAbort } from './api.js';
import { h, fmtInt, fmtNum, fmtPct, fmtDuration, fmtTime, tenantColour, seriesColour, throttle } from './app.js';
import { timeChart, barChart } from './chart.js';

const RANGES = { '1h': 3600, '6h': 6 * 3600, '24h': 86400, '7d': 7 * 86400 };
const BIN_LABELS = { 1: '≤1s', 10: '≤10s', 60: '≤1m', 300: '≤5m', 1800: '≤30m', 3600: '≤1h' };

const WHATIF_WINDOWS = ['1d', '7d', '30d'];
const WHATIF_POLICIES = ['ours', 'fgd', 'bestfit', 'random'];   // the gateway's policy names (random exists)
const WHATIF_MAX = 3;

export function mount(view, ctx) {
  const { signal, params, session } = ctx;
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

  const mayReplay = !!(session && session.may && session.may.whatif);
  view.append(h('section', { class: 'page page-history' },
    h('div', { class: 'page-head' }, h('h1', {}, 'History'), links, windowText),
    alloc, util, waits, preempt, mayReplay ? whatIfPanel(signal) : null));
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

// --- what-if ----------------------------------------------------------------------------------------

const secs = (v) => (v === null || v === undefined ? '—' : fmtDuration(v));
const num = (v, digits) => (v === null || v === undefined ? '—' : fmtNum(v, digits));

/** A table of `columns` ([heading, cell(row), numeric?]) over `items`, each row's dataset from `data(item)`. */
function figuresTable(id, columns, items, data) {
  return h('div', { class: 'table-scroll' }, h('table', { id, class: 'data compact whatif-table' },
    h('thead', {}, h('tr', {}, columns.map(([title, , n]) => h('th', { class: n ? 'num' : null, scope: 'col' }, title)))),
    h('tbody', {}, items.map((item) => h('tr', { dataset: data(item) },
      columns.map(([, cell, n]) => h('td', { class: n ? 'num' : null }, cell(item))))))));
}

const RUN_COLUMNS = [
  ['Run', ([name]) => name], ['Replayed', ([, r]) => fmtInt(r.replayed), true],
  ['Unsched.', ([, r]) => fmtInt((r.unschedulable || []).length), true],
  ['Avg wait', ([, r]) => secs(r.avg_wait_s), true], ['P99 wait', ([, r]) => secs(r.p99_wait_s), true],
  ['Avg JCT', ([, r]) => secs(r.avg_jct_s), true], ['GPU alloc.', ([, r]) => fmtPct(r.gpu_allocation_pct), true],
  ['Frag.', ([, r]) => (r.fragmentation_pct === null ? '—' : fmtPct(r.fragmentation_pct)), true],
  ['Preemptions', ([, r]) => fmtInt(r.preemptions), true], ['Lost GPU-h', ([, r]) => num(r.lost_gpu_hours, 1), true],
  ['Overshoot GPUs', ([, r]) => num(r.max_quota_overshoot_gpus, 1), true],
];
const TENANT_COLUMNS = [
  ['Run', ([name]) => name], ['Tenant', ([, t]) => t], ['Jobs', ([, , f]) => fmtInt(f.jobs), true],
  ['Avg wait', ([, , f]) => secs(f.avg_wait_s), true], ['P99 wait', ([, , f]) => secs(f.p99_wait_s), true],
  ['Unsched.', ([, , f]) => fmtInt(f.unschedulable), true], ['Preempted', ([, , f]) => fmtInt(f.preempted || 0), true],
];

/** The What-if card: window, policies, Run; then the answer's tables (one request at a time). */
function whatIfPanel(signal) {
  const windowSelect = h('select', { id: 'whatif-window', name: 'since', 'aria-label': 'Replay window' },
    WHATIF_WINDOWS.map((w) => h('option', { value: w, selected: w === '7d' ? true : null }, `last ${w}`)));
  const boxes = WHATIF_POLICIES.map((p) => h('input', { type: 'checkbox', name: 'policy', value: p,
    id: `whatif-policy-${p}`, checked: p === 'ours' || p === 'bestfit' }));
  const run = h('button', { id: 'whatif-run', type: 'submit' }, 'Run');
  const status = h('p', { id: 'whatif-status', class: 'muted small', role: 'status', 'aria-live': 'polite' });
  const result = h('div', { id: 'whatif-result' });
  const form = h('form', { id: 'whatif-form', class: 'whatif-form' },
    h('label', { class: 'seg-label', for: 'whatif-window' }, 'Window'), windowSelect,
    h('fieldset', { class: 'whatif-policies' }, h('legend', { class: 'seg-label' }, 'Policies'),
      boxes.map((box) => h('label', { class: 'whatif-policy', for: box.id }, box, ` ${box.value}`))),
    run);

  async function replay(event) {
    event.preventDefault();
    const policies = boxes.filter((b) => b.checked).map((b) => b.value);
    if (!policies.length || policies.length > WHATIF_MAX) {
      status.textContent = `Choose 1 to ${WHATIF_MAX} policies.`;
      return;
    }
    run.disabled = true;
    status.textContent = `Replaying the last ${windowSelect.value} under ${policies.join(', ')}…`;
    result.replaceChildren();
    try {
      const { body } = await postJSON('/v1/whatif', { since: windowSelect.value, policies }, { signal });
      if (!signal.aborted) show(body);
    } catch (err) {
      if (!isAbort(err)) status.textContent = `The what-if failed: ${err.detail || err.message}`;
    } finally {
      run.disabled = false;
    }
  }

  function show(doc) {
    const runs = Object.entries(doc.runs || {});
    status.textContent = `${fmtInt(doc.jobs)} jobs replayed since ${fmtTime(doc.since)} (${fmtInt(doc.left_out)} ` +
      `left out: never ran or still running) on ${fmtInt(doc.nodes)} nodes, ${fmtInt(doc.gpus)} GPUs.`;
    const tenants = runs.flatMap(([name, r]) => Object.entries(r.tenants || {}).map(([t, f]) => [name, t, f]));
    result.replaceChildren(
      h('h3', {}, 'Per policy'), figuresTable('whatif-runs', RUN_COLUMNS, runs, ([name]) => ({ run: name })),
      h('h3', {}, 'Per policy and tenant'),
      tenants.length ? figuresTable('whatif-tenants', TENANT_COLUMNS, tenants, ([name, t]) => ({ run: name, tenant: t }))
        : h('p', { class: 'empty' }, 'No job was submitted in this window.'));
  }

  form.addEventListener('submit', (event) => { replay(event); });
  return h('section', { id: 'whatif', class: 'card' }, h('h2', {}, 'What-if'),
    h('p', { class: 'muted small' }, 'Replays the jobs submitted in the window, with their real run-times, through ' +
      "today's nodes under each placement policy; a higher-priority job preempts as the live service would."),
    form, status, result);
}
