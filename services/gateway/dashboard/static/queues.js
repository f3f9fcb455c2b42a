// queues.js: quota per cohort and tenant (reserved against nominal, borrowing beyond it, the limit as an
// end mark; fair share, decayed usage and pending demand as numbers), then the waiting jobs in the quota
// cycle's order and, apart, the jobs waiting for capacity. Refetches on job events, at most once a second.

import { getJSON } from './api.js';
import { h, fmtInt, fmtNum, fmtFrac, fmtShape, timeEl, badge, throttle, reportError } from './app.js';

const MAX_ROWS = 1000;   // the waiting table draws at most this many rows (the count says how many wait)
const CAPACITY = /capacity|no node|not fit|fits no|insufficient|free gpu|no gpu|placement/i;

export function mount(view, ctx) {
  const { signal } = ctx;
  const quota = h('div', { id: 'quota', class: 'quota' }, h('p', { class: 'muted' }, 'Loading quota…'));
  const unitsNote = h('p', { id: 'units-note', class: 'muted small' });
  const waitCount = h('span', { id: 'queue-count', class: 'muted' });
  const table = h('div', { id: 'queue-table', class: 'table-scroll' });
  const capacity = h('div', { id: 'capacity-waits', class: 'table-scroll' });

  view.append(h('section', { class: 'page page-queues' },
    h('div', { class: 'page-head' }, h('h1', {}, 'Queues')),
    h('section', {}, h('h2', {}, 'Quota by cohort'), quota, unitsNote),
    h('section', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', {}, 'Waiting jobs'), waitCount), table),
    h('section', { class: 'card' }, h('h2', {}, 'Waiting for capacity'),
      h('p', { class: 'muted small' }, 'Jobs that hold quota (or are otherwise admitted) but find no GPUs of their shape free.'),
      capacity)));

  // --- quota ---
  /** Units -> a display amount: GPUs when the server says how many units make one, else raw units. */
  function unitFormatter(units) {
    const per = units && typeof units === 'object' ? Number(units.per_gpu) : NaN;
    if (per > 0) return { fmt: (u) => fmtNum(u / per, 3), suffix: 'GPU', note: units.explain || '' };
    const name = typeof units === 'string' ? units : (units && units.name) || 'units';
    return { fmt: (u) => fmtInt(u), suffix: name, note: '' };
  }

  /** One flavor's bar: reserved within nominal, borrowed beyond it, a marker at nominal, a limit mark. */
  function quotaBar(row, u) {
    const reserved = row.reserved_units || 0, nominal = row.nominal_units || 0;
    const limit = row.limit_units ?? null;
    const borrowed = row.borrowed_units ?? Math.max(0, reserved - nominal);
    const scale = Math.max(reserved, nominal, limit || 0, 1) * 1.04;
    const pct = (x) => `${Math.min(100, (x / scale) * 100)}%`;
    const within = h('span', { class: 'bar-fill' });
    within.style.width = pct(reserved - borrowed);
    const over = h('span', { class: 'bar-borrowed' });
    over.style.left = pct(reserved - borrowed);
    over.style.width = pct(borrowed);
    const nom = h('span', { class: 'bar-nominal', title: `nominal ${u.fmt(nominal)} ${u.suffix}` });
    nom.style.left = pct(nominal);
    const parts = [within, over, nom];
    if (limit !== null) {
      const lim = h('span', { class: 'bar-limit', title: `limit ${u.fmt(limit)} ${u.suffix}` });
      lim.style.left = pct(limit);
      parts.push(lim);
    }
    const words = `${u.fmt(reserved)} of ${u.fmt(nominal)} ${u.suffix} reserved` +
      (borrowed ? `, ${u.fmt(borrowed)} borrowed` : '') + (limit !== null ? `, limit ${u.fmt(limit)}` : '');
    return h('div', { class: 'quota-flavor', dataset: { flavor: row.flavor || '' } },
      h('span', { class: 'flavor-name' }, row.flavor || '—'),
      h('span', { class: 'bar', role: 'img', 'aria-label': words, title: words }, parts),
      h('span', { class: 'flavor-numbers num' }, `${u.fmt(reserved)} / ${u.fmt(nominal)}`,
        borrowed ? h('span', { class: 'borrowed-text' }, ` +${u.fmt(borrowed)} borrowed`) : null));
  }

  function tenantBlock(t, u) {
    const flavors = t.flavors || [];
    return h('div', { class: 'quota-tenant', dataset: { tenant: t.tenant } },
      h('div', { class: 'quota-tenant-head' },
        h('strong', {}, t.tenant),
        h('span', { class: 'quota-stats' },
          stat('fair share', t.fair_share === null || t.fair_share === undefined ? '—' : fmtFrac(t.fair_share)),
          stat('decayed usage', t.decayed_usage === null || t.decayed_usage === undefined ? '—' : `${fmtNum(t.decayed_usage, 2)} GEQ`),
          t.weight !== null && t.weight !== undefined ? stat('weight', fmtNum(t.weight, 2)) : null,
          stat('pending', `${fmtInt(t.pending_jobs ?? 0)} jobs · ${fmtNum(t.pending_gpus ?? 0, 2)} GPUs`))),
      flavors.length ? flavors.map((f) => quotaBar(f, u)) : h('p', { class: 'muted small' }, 'No quota for any flavor.'));
  }

  const stat = (label, value) => h('span', { class: 'stat' }, h('span', { class: 'muted' }, `${label} `), value);

  function renderQuota(doc) {
    const u = unitFormatter(doc.units);
    unitsNote.textContent = u.note;
    let tenants = doc.tenants;
    if (!Array.isArray(tenants)) {   // an older server: only the usage rows, grouped here by tenant
      const by = new Map();
      for (const r of doc.usage || []) {
        if (!by.has(r.tenant)) by.set(r.tenant, { tenant: r.tenant, cohort: null, flavors: [] });
        by.get(r.tenant).flavors.push(r);
      }
      tenants = [...by.values()];
    }
    const byName = new Map(tenants.map((t) => [t.tenant, t]));
    const blocks = [];
    const placed = new Set();
    for (const c of doc.cohorts || []) {
      const members = (c.tenants || []).map((n) => byName.get(n)).filter(Boolean);
      members.forEach((t) => placed.add(t.tenant));
      blocks.push(h('div', { class: 'card cohort', dataset: { cohort: c.cohort } },
        h('div', { class: 'card-head' }, h('h3', {}, `Cohort ${c.cohort}`),
          h('span', { class: 'muted' }, `${u.fmt(c.reserved_units || 0)} of ${u.fmt(c.nominal_units || 0)} ${u.suffix} reserved`)),
        members.length ? members.map((t) => tenantBlock(t, u)) : h('p', { class: 'muted small' }, 'No tenant visible.')));
    }
    const rest = tenants.filter((t) => !placed.has(t.tenant));
    if (rest.length) {
      blocks.push(h('div', { class: 'card cohort', dataset: { cohort: '' } },
        h('div', { class: 'card-head' }, h('h3', {}, doc.cohorts && doc.cohorts.length ? 'Other tenants' : 'Tenants')),
        rest.map((t) => tenantBlock(t, u))));
    }
    quota.replaceChildren(...(blocks.length ? blocks : [h('p', { class: 'muted' }, 'No tenants have quota.')]));
  }

  // --- waiting jobs ---
  const cols = ['#', 'Job', 'Name', 'Tenant', 'Shape', 'Priority', 'State', 'Waits for', 'Reason', 'Submitted'];

  function jobCell(j) {
    return h('td', { class: 'mono' }, h('a', { href: `/ui/jobs/${encodeURIComponent(j.job_id)}` }, j.job_id));
  }

  function waitsFor(j) {
    if (j.blocked_by) return typeof j.blocked_by === 'string' ? j.blocked_by : JSON.stringify(j.blocked_by);
    return CAPACITY.test(j.reason || '') ? 'capacity' : '—';
  }

  function renderQueue(doc) {
    const jobs = doc.jobs || [];
    waitCount.textContent = `${fmtInt(jobs.length)} waiting${jobs.length > MAX_ROWS ? `, first ${fmtInt(MAX_ROWS)} shown` : ''}`;
    if (!jobs.length) {
      table.replaceChildren(h('p', { class: 'muted' }, 'Nothing is waiting.'));
      capacity.replaceChildren(h('p', { class: 'muted' }, 'No job waits for capacity.'));
      return;
    }
    table.replaceChildren(h('table', { class: 'data' },
      h('thead', {}, h('tr', {}, cols.map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, jobs.slice(0, MAX_ROWS).map((j) => h('tr', { dataset: { job: j.job_id, queue: j.queue || '' } },
        h('td', { class: 'num' }, j.position ?? '—'), jobCell(j),
        h('td', { class: 'ellipsis' }, j.name || '—'), h('td', {}, j.tenant || '—'), h('td', {}, fmtShape(j)),
        h('td', { class: 'num', title: j.ahead_higher_priority ? `${j.ahead_higher_priority} higher-priority jobs ahead` : null }, j.priority ?? '—'),
        h('td', {}, j.state ? badge(j.state) : '—'), h('td', {}, waitsFor(j)),
        h('td', { class: 'reason' }, j.reason || '—'), h('td', {}, timeEl(j.submitted_at)))))));

    const blocked = jobs.filter((j) => waitsFor(j) === 'capacity' || CAPACITY.test(String(j.blocked_by || '')));
    capacity.replaceChildren(blocked.length ? h('table', { class: 'data' },
      h('thead', {}, h('tr', {}, ['Job', 'Tenant', 'Shape that does not fit', 'Queue', 'Reason'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, blocked.slice(0, MAX_ROWS).map((j) => h('tr', { dataset: { job: j.job_id } },
        jobCell(j), h('td', {}, j.tenant || '—'), h('td', {}, h('strong', {}, fmtShape(j))),
        h('td', {}, j.queue || '—'), h('td', { class: 'reason' }, j.reason || '—')))))
      : h('p', { class: 'muted' }, 'No job waits for capacity.'));
  }

  // --- data: both documents at once; one failing still shows the other ---
  async function load() {
    const [tenants, queue] = await Promise.allSettled([
      getJSON('/v1/tenants', { signal }), getJSON('/v1/queue', { signal })]);
    if (signal.aborted) return;
    if (tenants.status === 'fulfilled') renderQuota(tenants.value);
    else {
      reportError(tenants.reason);
      if (!quota.querySelector('.cohort')) quota.replaceChildren(h('p', { class: 'muted' }, 'Quota unavailable.'));
    }
    if (queue.status === 'fulfilled') renderQueue(queue.value);
    else reportError(queue.reason);
  }

  const refresh = throttle(load, 1000);
  refresh();
  return { onJob: refresh, onReset: refresh, unmount: () => refresh.cancel() };
}
