// app.js: the dashboard's shell. It loads the session, routes /ui/... paths to a page module, holds the
// one EventSource of the page load, and exports the helpers every page uses (DOM building, number and
// time formatting, badges, the error banner, throttling, the confirmation dialog).
//
// A page module exports mount(view, ctx) -> {onJob?, onCluster?, onReset?, unmount?}. ctx is
// {session, params: URLSearchParams, id, signal}; signal aborts when the page is left, so late answers
// are dropped. Pages are imported dynamically, after this module has finished evaluating, so their
// `import ... from './app.js'` always sees initialised exports.

import { getJSON, request, setCsrf, goSignIn, isAbort } from './api.js';

// --- DOM ----------------------------------------------------------------------------------------

/**
 * h('a', {class: 'x', href: '/ui', dataset: {job: id}, onclick: fn}, 'text', child, [more]) builds an
 * element. Strings become text nodes (never HTML); null/undefined/false children are skipped.
 */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = String(v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'value' || k === 'checked' || k === 'disabled' || k === 'hidden') el[k] = v;
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** SVG element with attributes (no children helper needed beyond append). */
export function svg(tag, attrs, ...children) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined && v !== false) el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

// --- formatting -----------------------------------------------------------------------------------

const intFmt = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
export const fmtInt = (n) => (n === null || n === undefined || Number.isNaN(n) ? '—' : intFmt.format(n));

/** 1234.5 -> "1,234.5" with at most `digits` decimals. */
const numFmts = new Map();   // digits -> Intl.NumberFormat (building one is slow; rows format a lot)
export function fmtNum(n, digits = 2) {
  if (n === null || n === undefined || Number.isNaN(Number(n))) return '—';
  if (!numFmts.has(digits)) numFmts.set(digits, new Intl.NumberFormat(undefined, { maximumFractionDigits: digits }));
  return numFmts.get(digits).format(n);
}

/** 87.4 -> "87%"; a 0..1 fraction goes through fmtFrac. */
export const fmtPct = (p) => (p === null || p === undefined || Number.isNaN(p) ? '—' : `${Math.round(p)}%`);
export const fmtFrac = (f) => (f === null || f === undefined ? '—' : `${fmtNum(f * 100, 1)}%`);

/** Seconds -> "3m 20s", "2h 5m", "4d 3h", "850ms". */
export function fmtDuration(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return '—';
  if (s < 0) s = -s;
  if (s < 1) return `${Math.round(s * 1000)}ms`;
  if (s < 60) return `${fmtNum(s, s < 10 ? 1 : 0)}s`;
  const d = Math.floor(s / 86400), hr = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60), sec = Math.floor(s % 60);
  if (d) return hr ? `${d}d ${hr}h` : `${d}d`;
  if (hr) return m ? `${hr}h ${m}m` : `${hr}h`;
  return sec ? `${m}m ${sec}s` : `${m}m`;
}

const absFmt = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'medium' });

/** An ISO time as the viewer's local date and time ("" for none). */
export function fmtTime(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? String(iso) : absFmt.format(d);
}

/** "5m ago" / "in 2h" / "just now". */
export function fmtRelative(iso, now = Date.now()) {
  if (!iso) return '—';
  const t = new Date(iso).getTime();
  if (Number.isNaN(t)) return String(iso);
  const diff = (t - now) / 1000;
  if (Math.abs(diff) < 5) return 'just now';
  return diff < 0 ? `${fmtDuration(-diff)} ago` : `in ${fmtDuration(diff)}`;
}

/** <time> showing the relative time, with the absolute one on hover. */
export function timeEl(iso) {
  if (!iso) return h('span', { class: 'muted' }, '—');
  return h('time', { datetime: iso, title: fmtTime(iso) }, fmtRelative(iso));
}

/** A job's shape in words: "2× H100-80GB", "1 GPU", "0.5 GPU share", "MIG 3g.40gb", "2 nodes × 8 GPUs". */
export function fmtShape(job) {
  if (!job) return '—';
  if (job.shape) return String(job.shape);
  const model = job.gpu_model ? ` ${job.gpu_model}` : '';
  if (job.mig_profile) return `MIG ${job.mig_profile}${model}`;
  const milli = job.share_milli ?? job.gpu_share_milli;
  if (milli) return `${fmtNum(milli / 1000, 3)}${model} GPU share`;
  if (job.gpus === null || job.gpus === undefined) return job.gpu_model || '—';
  const gpus = `${fmtInt(job.gpus)}${model ? ' ×' + model : job.gpus === 1 ? ' GPU' : ' GPUs'}`;
  return job.nodes > 1 ? `${fmtInt(job.nodes)} nodes × ${gpus}` : gpus;
}

// --- badges and colours -----------------------------------------------------------------------------

/** A state badge; the colour comes from CSS by data-state, the text always says the state. */
export function badge(state, extra = {}) {
  return h('span', { class: 'badge', dataset: { state: state || 'unknown' }, ...extra }, state || 'unknown');
}

// Series colours for charts (not bound to a tenant).
const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948',
  '#b07aa1', '#ff9da7', '#9c755f', '#86bcb6', '#8cd17d', '#d37295'];

function hash(s) {   // FNV-1a, 32 bit
  let x = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) x = Math.imul(x ^ s.charCodeAt(i), 0x01000193);
  return x >>> 0;
}

/** A tenant's colour, the same on every page and every load: a hue and a lightness from its name's hash. */
export function tenantColour(name) {
  if (!name) return '#8a8f98';
  const x = hash(String(name));
  const hue = Math.round(((x % 1000) / 1000) * 360);
  const light = [44, 56, 66][(x >>> 12) % 3];
  return `hsl(${hue} 62% ${light}%)`;
}

/** Colour for series i of a chart (not tenant-bound). */
export const seriesColour = (i) => PALETTE[i % PALETTE.length];

// --- the error banner -----------------------------------------------------------------------------

export function showBanner(message, kind = 'error') {
  const banner = document.getElementById('banner');
  const text = document.getElementById('banner-text');
  if (!banner || !text) return;
  text.textContent = message;
  banner.dataset.kind = kind;
  banner.hidden = false;
}

export function hideBanner() {
  const banner = document.getElementById('banner');
  if (banner) banner.hidden = true;
}

/** Show any error in the banner (aborts from leaving a page are not errors). */
export function reportError(err) {
  if (isAbort(err)) return;
  const msg = (err && (err.detail || err.message)) || String(err);
  showBanner(msg);
}

/** Wrap an async event handler so that a rejection reaches the banner, never the console. */
export const guard = (fn) => (...args) => {
  try {
    const r = fn(...args);
    if (r && typeof r.catch === 'function') r.catch(reportError);
  } catch (err) {
    reportError(err);
  }
};

// --- throttling -----------------------------------------------------------------------------------

/**
 * throttle(fn, ms) returns schedule(): calling it runs fn soon, but never more often than once per ms
 * and never two runs at once (a call during a run queues one more run). schedule.cancel() stops it.
 * This is how views turn a burst of live events into one refetch.
 */
export function throttle(fn, ms) {
  let last = 0, timer = null, running = false, again = false, stopped = false;
  async function run() {
    timer = null;
    if (stopped) return;
    running = true;
    last = Date.now();
    try { await fn(); } catch (err) { reportError(err); } finally { running = false; }
    if (again) { again = false; schedule(); }
  }
  function schedule() {
    if (stopped || timer) return;
    if (running) { again = true; return; }
    timer = setTimeout(run, Math.max(0, last + ms - Date.now()));
  }
  schedule.cancel = () => { stopped = true; clearTimeout(timer); timer = null; };
  return schedule;
}

/** Plain trailing debounce (for typing). */
export function debounce(fn, ms) {
  let t = null;
  const d = (...args) => { clearTimeout(t); t = setTimeout(() => guard(fn)(...args), ms); };
  d.cancel = () => clearTimeout(t);
  return d;
}

// --- confirmation dialog --------------------------------------------------------------------------

/**
 * confirmDialog({title, message, reason: 'placeholder' | null, yes}) -> Promise<{ok, reason}>, drawn in
 * the page's <dialog id="confirm"> (never window.confirm).
 */
export function confirmDialog({ title, message, reason = null, yes = 'Confirm' }) {
  const dialog = document.getElementById('confirm');
  const input = document.getElementById('confirm-reason');
  document.getElementById('confirm-title').textContent = title;
  document.getElementById('confirm-message').textContent = message;
  document.getElementById('confirm-yes').textContent = yes;
  input.value = '';
  input.placeholder = reason || '';
  document.getElementById('confirm-reason-row').hidden = reason === null;
  return new Promise((resolve) => {
    dialog.addEventListener('close', () => {
      resolve({ ok: dialog.returnValue === 'yes', reason: input.value.trim() });
    }, { once: true });
    dialog.returnValue = '';
    dialog.showModal();
    (reason === null ? document.getElementById('confirm-no') : input).focus();
  });
}

function wireDialog() {
  const dialog = document.getElementById('confirm');
  document.getElementById('confirm-yes').addEventListener('click', () => dialog.close('yes'));
  document.getElementById('confirm-no').addEventListener('click', () => dialog.close('no'));
  document.getElementById('confirm-form').addEventListener('submit', (e) => {
    e.preventDefault();
    dialog.close('yes');
  });
}

// --- navigation -----------------------------------------------------------------------------------

/** Go to a /ui URL without reloading (pushState + route). */
export function navigate(url, { replace = false } = {}) {
  if (replace) history.replaceState(null, '', url);
  else history.pushState(null, '', url);
  render(!replace);
}

/** Rewrite the current URL's query (filters) without re-rendering the page. */
export function setQuery(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  const s = q.toString();
  const url = location.pathname + (s ? `?${s}` : '');
  if (url !== location.pathname + location.search) history.replaceState(null, '', url);
}

let session = null;
let current = null;       // the mounted page: {onJob, onCluster, onReset, unmount}
let controller = null;    // aborts the mounted page's requests
let renderSeq = 0;

const PAGES = {
  cluster: { title: 'Cluster', load: () => import('./cluster.js') },
  queues: { title: 'Queues', load: () => import('./queues.js') },
  jobs: { title: 'Jobs', load: () => import('./jobs.js') },
  job: { title: 'Job', load: () => import('./job.js') },
  history: { title: 'History', load: () => import('./history.js') },
};

/** Which page a path shows (the role decides what /ui/ is). */
function route(pathname) {
  const p = pathname.replace(/\/+$/, '');
  const may = session.may || {};
  const home = may.nodes ? 'cluster' : may.jobs ? 'jobs' : 'queues';
  if (p === '/ui' || p === '') return { page: home };
  if (p === '/ui/cluster') return { page: may.nodes ? 'cluster' : home };
  if (p === '/ui/queues') return { page: 'queues' };
  if (p === '/ui/jobs') return { page: 'jobs' };
  if (p === '/ui/history') return { page: 'history' };
  const m = /^\/ui\/jobs\/([^/]+)$/.exec(p);
  if (m) {
    try { return { page: 'job', id: decodeURIComponent(m[1]) }; } catch { return { page: null }; }
  }
  return { page: null };
}

function markNav(page) {
  const navPage = page === 'job' ? 'jobs' : page;
  for (const a of document.querySelectorAll('#nav a[data-nav]')) {
    if (a.dataset.nav === navPage) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
}

async function render(moveFocus = false) {
  const seq = ++renderSeq;
  if (current && current.unmount) {
    try { current.unmount(); } catch (err) { reportError(err); }
  }
  current = null;
  if (controller) controller.abort();
  controller = new AbortController();
  const view = document.getElementById('view');
  view.replaceChildren();
  const { page, id } = route(location.pathname);
  markNav(page);
  if (!page) {
    document.title = 'Not found · gpusched';
    view.append(h('section', { class: 'empty-page' }, h('h1', {}, 'Not found'),
      h('p', {}, 'No dashboard page at ', h('code', {}, location.pathname), '. '),
      h('a', { href: '/ui/' }, 'Back to the dashboard')));
    return;
  }
  document.title = `${id ? id + ' · ' : ''}${PAGES[page].title} · gpusched`;
  const ctx = { session, params: new URLSearchParams(location.search), id, signal: controller.signal };
  try {
    const mod = await PAGES[page].load();
    if (seq !== renderSeq) return;           // another navigation happened meanwhile
    current = (await mod.mount(view, ctx)) || {};
  } catch (err) {
    reportError(err);
  }
  if (moveFocus) {
    window.scrollTo(0, 0);
    view.focus({ preventScroll: true });
  }
}

/** Same-origin clicks on /ui links route in place; modified clicks, downloads, targets keep defaults. */
function onClick(e) {
  if (e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const a = e.target.closest && e.target.closest('a[href]');
  if (!a || a.target || a.hasAttribute('download')) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || !url.pathname.startsWith('/ui')) return;
  if (url.pathname.startsWith('/ui/signin') || url.pathname.startsWith('/ui/static/')) return;
  e.preventDefault();
  if (url.pathname + url.search === location.pathname + location.search && !url.hash) {
    navigate(url.pathname + url.search, { replace: true });   // same page: just refresh it
  } else {
    navigate(url.pathname + url.search + url.hash);
  }
}

// --- live updates -----------------------------------------------------------------------------------

let source = null;
let lost = false;   // the stream broke: events may have been missed, so the view refetches on reopening

function setLive(status, text) {
  const el = document.getElementById('live');
  if (!el) return;
  el.dataset.status = status;
  el.textContent = text;
  el.title = status === 'open' ? 'Receiving live updates' : status === 'connecting'
    ? 'Connection lost; reconnecting' : 'Live updates stopped; retrying';
}

/** Hand an SSE event to the mounted page, if it listens to that kind. */
function dispatch(kind, raw) {
  if (!current) return;
  let data = null;
  try { data = raw ? JSON.parse(raw) : null; } catch { data = null; }
  const handler = kind === 'job' ? current.onJob : kind === 'cluster' ? current.onCluster : current.onReset;
  if (handler) guard(handler)(data);
  else if (kind === 'reset') render(false);
}

function connect() {
  setLive('connecting', 'connecting');
  source = new EventSource('/v1/stream', { withCredentials: true });
  source.addEventListener('open', () => {
    setLive('open', 'live');
    if (lost) dispatch('reset', null);
    lost = false;
  });
  source.addEventListener('job', (e) => dispatch('job', e.data));
  source.addEventListener('cluster', (e) => dispatch('cluster', e.data));
  source.addEventListener('reset', (e) => dispatch('reset', e.data));
  source.addEventListener('error', () => {
    lost = true;
    if (source.readyState === EventSource.CONNECTING) {
      setLive('connecting', 'reconnecting');
      return;
    }
    // CLOSED: the browser gave up (the stream answered an error status). Check the session (a 401
    // goes to sign-in), then open a new stream after a pause; one at a time.
    setLive('closed', 'offline');
    source.close();
    retryLater();
  });
}

/** Reopen the stream once the session answers again (a 401 has left for sign-in; else retry). */
function retryLater() {
  setTimeout(async () => {
    try {
      await getJSON('/ui/session');
      connect();
    } catch (err) {
      if (!err || err.status !== 401) retryLater();   // the live indicator already says offline
    }
  }, 10000);
}

// --- start ------------------------------------------------------------------------------------------

function showSession() {
  const may = session.may || {};
  const who = [session.subject, session.role, session.tenant ? `tenant ${session.tenant}` : null];
  document.getElementById('identity').textContent = who.filter(Boolean).join(' · ');
  document.getElementById('nav-cluster').hidden = !may.nodes;
  document.getElementById('nav-jobs').hidden = may.jobs === false;
  document.getElementById('nav-history').hidden = may.history === false;
}

async function signOut() {
  try {
    await request('/ui/session/signout', { method: 'POST', quiet401: true });
  } catch (err) {
    if (!err || err.status !== 401) throw err;   // 401: already signed out
  }
  location.assign('/ui/signin');
}

async function start() {
  window.addEventListener('unhandledrejection', (e) => { e.preventDefault(); reportError(e.reason); });
  window.addEventListener('error', (e) => reportError(e.error || e.message));   // a bug shows, never silently
  document.getElementById('banner-close').addEventListener('click', hideBanner);
  document.getElementById('signout').addEventListener('click', guard(signOut));
  wireDialog();
  try {
    session = await getJSON('/ui/session');       // a 401 leaves for the sign-in page
  } catch (err) {
    if (err && err.status !== 401) reportError(err);
    return;
  }
  setCsrf(session.csrf);
  showSession();
  document.body.classList.add('ready');
  document.addEventListener('click', onClick);
  window.addEventListener('popstate', () => render(false));
  connect();
  await render(false);
}

export const getSession = () => session;
export { goSignIn };

start().catch(reportError);
