// jobs.js: the job list. Filters (state, tenant) and the search box live in the URL query so a link
// reproduces the view; an exact job id in the search box opens that job. Every loaded row goes through
// the virtualised list; job events refetch the first page (at most once a second) and merge it in
// place, so rows change state without a reload.

import { getJSON, withQuery, ApiError } from './api.js';
import { h, fmtInt, fmtShape, timeEl, badge, throttle, debounce, setQuery, navigate, guard, reportError } from './app.js';
import { VirtualList } from './vlist.js';

// the job states the lifecycle knows (libs/core/gpusched_core/lifecycle/state.py: JobStatus)
export const JOB_STATES = ['Admitted', 'Queued', 'Held', 'Placed', 'Running', 'Preempting', 'Preempted',
  'Succeeded', 'Failed', 'Cancelled', 'Rejected'];
const PAGE = 500;
const ROW_HEIGHT = 38;
const MAX_SINGLE_REFRESH = 25;   // loaded rows beyond the first page refreshed one by one per event burst

const COLUMNS = ['Job', 'Name', 'Tenant', 'State', 'Shape', 'Prio', 'Node', 'Submitted', 'Finished'];

export function mount(view, ctx) {
  const { signal, params } = ctx;
  let filters = { state: params.get('state') || '', tenant: params.get('tenant') || '', q: params.get('q') || '' };
  let rows = [];            // every loaded job, in the server's order
  let byId = new Map();     // job_id -> row object
  let next = null;          // cursor of the next page (null: all loaded)
  let pagesLoaded = 0;
  let generation = 0;       // bumps when filters change, so answers for old filters are dropped
  const touched = new Set(); // job ids that had events since the last live refresh

  // --- skeleton ---
  const stateSel = h('select', { id: 'filter-state', 'aria-label': 'State' },
    h('option', { value: '' }, 'any state'), JOB_STATES.map((s) => h('option', { value: s }, s)));
  stateSel.value = filters.state;
  const tenantBox = h('input', { id: 'filter-tenant', type: 'text', placeholder: 'tenant', 'aria-label': 'Tenant',
    value: filters.tenant, autocomplete: 'off' });
  const qBox = h('input', { id: 'filter-q', type: 'search', placeholder: 'job id or name', 'aria-label': 'Search: job id or name',
    value: filters.q, autocomplete: 'off' });
  const form = h('form', { id: 'job-filters', class: 'toolbar', role: 'search' },
    stateSel, tenantBox, qBox, h('button', { type: 'submit' }, 'Search'));
  const exact = h('p', { id: 'exact-match', class: 'callout', hidden: true });
  const count = h('span', { id: 'job-count', class: 'muted' });
  const header = h('div', { class: 'job-row job-head', 'aria-hidden': 'true' }, COLUMNS.map((c) => h('span', {}, c)));
  const viewport = h('div', { id: 'job-list', class: 'job-list', 'aria-label': 'Jobs' });
  const more = h('button', { id: 'load-more', type: 'button', hidden: true }, 'Load more');

  view.append(h('section', { class: 'page page-jobs' },
    h('div', { class: 'page-head' }, h('h1', {}, 'Jobs'), count),
    form, exact,
    h('div', { class: 'table-scroll' }, h('div', { class: 'job-table' }, header, viewport)),
    h('div', { class: 'list-foot' }, more)));

  const list = new VirtualList(viewport, {
    rowHeight: ROW_HEIGHT, renderRow: jobRow, key: (j) => j.job_id, empty: 'Loading jobs…',
  });

  function jobRow(job) {
    const href = `/ui/jobs/${encodeURIComponent(job.job_id)}`;
    const where = job.node_id ? `${job.node_id}${job.gpu_indices && job.gpu_indices.length ? ' [' + job.gpu_indices.join(',') + ']' : ''}` : '—';
    const reasons = (job.reasons || []).join('; ');
    return h('div', { class: 'job-row', dataset: { job: job.job_id, state: job.state || '' } },
      h('span', { class: 'mono ellipsis' }, h('a', { class: 'job-link', href, title: job.job_id }, job.job_id)),
      h('span', { class: 'ellipsis', title: job.name || '' }, job.name || '—'),
      h('span', { class: 'ellipsis' }, job.tenant || '—'),
      h('span', { title: reasons || null }, badge(job.state)),
      h('span', { class: 'ellipsis' }, fmtShape(job)),
      h('span', { class: 'num' }, job.priority ?? '—'),
      h('span', { class: 'ellipsis mono', title: where }, where),
      h('span', {}, timeEl(job.submitted_at)),
      h('span', {}, job.finished_at ? timeEl(job.finished_at) : h('span', { class: 'muted' }, job.exit_code ?? '—')));
  }

  function listUrl(cursor) {
    return withQuery('/v1/jobs', {
      state: filters.state, tenant: filters.tenant, name: filters.q, limit: PAGE, cursor: cursor || '',
    });
  }

  function show() {
    list.setEmptyText(filters.state || filters.tenant || filters.q ? 'No job matches these filters.' : 'No jobs yet.');
    list.setItems(rows);
    more.hidden = !next;
    count.textContent = `${fmtInt(rows.length)} job${rows.length === 1 ? '' : 's'} loaded${next ? ' (more available)' : ''}`;
  }

  /** A row object per id: reuse the old one when nothing changed, so the list need not redraw it. */
  function adopt(job) {
    const old = byId.get(job.job_id);
    if (old && JSON.stringify(old) === JSON.stringify(job)) return old;
    byId.set(job.job_id, job);
    return job;
  }

  // --- loading ---
  async function loadFirst() {
    const gen = ++generation;
    const body = await getJSON(listUrl(null), { signal });
    if (gen !== generation || signal.aborted) return;
    byId = new Map();
    rows = (body.jobs || []).map(adopt);
    next = body.next || null;
    pagesLoaded = 1;
    show();
  }

  async function loadMore() {
    if (!next) return;
    const gen = generation;
    more.disabled = true;
    try {
      const body = await getJSON(listUrl(next), { signal });
      if (gen !== generation || signal.aborted) return;
      for (const job of body.jobs || []) {
        if (!byId.has(job.job_id)) rows.push(adopt(job));
      }
      next = body.next || null;
      pagesLoaded += 1;
      show();
    } finally {
      more.disabled = false;
    }
  }

  /** Live: refetch the first page, merge it over what is loaded, refresh touched rows further down. */
  async function liveRefresh() {
    const gen = generation;
    const ids = [...touched];
    touched.clear();
    const body = await getJSON(listUrl(null), { signal });
    if (gen !== generation || signal.aborted) return;
    const inFirst = new Set((body.jobs || []).map((j) => j.job_id));
    const later = ids.filter((id) => !inFirst.has(id) && byId.has(id)).slice(0, MAX_SINGLE_REFRESH);
    const fresh = await Promise.all(later.map((id) => getJSON(`/v1/jobs/${encodeURIComponent(id)}`, { signal })
      .catch(() => null)));
    if (gen !== generation || signal.aborted) return;
    // merge only now, after the last await: a "Load more" that finished meanwhile keeps its rows
    const first = (body.jobs || []).map(adopt);
    for (const job of fresh) if (job) adopt(stripDetail(job));
    const rest = rows.filter((j) => !inFirst.has(j.job_id));
    rows = first.concat(rest.map((j) => byId.get(j.job_id) || j));
    if (pagesLoaded <= 1) next = body.next || null;   // a deeper cursor stays where "Load more" left it
    show();
  }

  // the single-job answer carries events and waiting; the list rows do not
  function stripDetail(job) {
    const { events, waiting, ...row } = job;
    return row;
  }

  /** Is the search text an exact job id? Shows a link to it (and opens it when `open`). */
  async function checkExact(open) {
    exact.hidden = true;
    const q = filters.q;
    if (!q || /\s/.test(q)) return false;
    try {
      const job = await getJSON(`/v1/jobs/${encodeURIComponent(q)}`, { signal });
      if (signal.aborted || q !== filters.q) return false;
      if (open) {
        navigate(`/ui/jobs/${encodeURIComponent(job.job_id || q)}`);
        return true;
      }
      exact.replaceChildren('Exact job id: ', h('a', { href: `/ui/jobs/${encodeURIComponent(job.job_id || q)}` },
        job.job_id || q), job.name ? ` (${job.name})` : '', ' ', badge(job.state));
      exact.hidden = false;
    } catch (err) {
      if (!(err instanceof ApiError) || (err.status !== 404 && err.status !== 403 && err.status !== 422)) reportError(err);
    }
    return false;
  }

  /** Read the filter controls; when they changed, put them in the URL and reload the first page. */
  async function applyFilters() {
    const nextFilters = { state: stateSel.value, tenant: tenantBox.value.trim(), q: qBox.value.trim() };
    if (JSON.stringify(nextFilters) === JSON.stringify(filters)) return;
    filters = nextFilters;
    setQuery(filters);
    rows = [];
    next = null;
    list.setItems(rows);
    list.viewport.scrollTop = 0;
    await loadFirst();
  }

  // --- wiring ---
  const typed = debounce(() => Promise.all([applyFilters(), checkExact(false)]), 350);
  stateSel.addEventListener('change', guard(applyFilters));
  tenantBox.addEventListener('input', typed);
  qBox.addEventListener('input', typed);
  form.addEventListener('submit', guard(async (e) => {
    e.preventDefault();
    typed.cancel();
    // applyFilters sets `filters` before its first await, so checkExact sees the submitted text
    await Promise.all([applyFilters(), checkExact(true)]);
  }));
  more.addEventListener('click', guard(loadMore));

  const live = throttle(liveRefresh, 1000);
  loadFirst().catch(reportError);
  checkExact(false);

  return {
    onJob(evt) {
      if (evt && evt.job_id) touched.add(evt.job_id);
      live();
    },
    onReset: live,
    unmount() {
      live.cancel();
      typed.cancel();
      list.destroy();
    },
  };
}
