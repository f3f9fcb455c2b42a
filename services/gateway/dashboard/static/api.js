// api.js: the one way the dashboard talks to the gateway.
//
// Every request is same-origin with the session cookie; every unsafe one carries the CSRF token the
// session handed out. Failures become an ApiError that carries the RFC 9457 problem's fields, so a
// caller can always show `err.detail`. A 401 means the session ended: we go to the sign-in page.

let csrfToken = null;

/** Remember the CSRF token from GET /ui/session (sent as X-CSRF-Token on every POST). */
export function setCsrf(token) {
  csrfToken = token || null;
}

/** An HTTP failure or a network error, with the problem document's fields when there was one. */
export class ApiError extends Error {
  constructor(status, problem, url) {
    const detail = (problem && (problem.detail || problem.title)) || defaultDetail(status, url);
    super(detail);
    this.name = 'ApiError';
    this.status = status;          // 0: no answer (network error, aborted)
    this.problem = problem || null;
    this.detail = detail;
    this.url = url;
  }
}

function defaultDetail(status, url) {
  if (status === 0) return `The gateway could not be reached (${url}).`;
  return `The gateway answered ${status} for ${url}.`;
}

/** Where the sign-in page should send us back to: the current path and query. */
export function signinUrl() {
  return '/ui/signin?next=' + encodeURIComponent(location.pathname + location.search);
}

/** Leave for the sign-in page (once: several requests may see the 401 at the same time). */
let leaving = false;
export function goSignIn() {
  if (leaving) return;
  leaving = true;
  location.assign(signinUrl());
}

async function readProblem(res) {
  const type = res.headers.get('Content-Type') || '';
  try {
    if (type.includes('json')) return await res.json();
    const text = (await res.text()).trim();
    return text ? { detail: text.slice(0, 500), status: res.status } : null;
  } catch {
    return null;
  }
}

/**
 * fetch() with our defaults. Resolves with the Response when it is 2xx; otherwise throws ApiError.
 * `opts.quiet401`: do not leave for the sign-in page on a 401 (the caller handles it).
 */
export async function request(url, opts = {}) {
  const { quiet401 = false, json, headers = {}, ...rest } = opts;
  const init = { credentials: 'same-origin', ...rest, headers: { Accept: 'application/json', ...headers } };
  const method = (init.method || 'GET').toUpperCase();
  if (json !== undefined) {
    init.body = JSON.stringify(json);
    init.headers['Content-Type'] = 'application/json';
  }
  if (method !== 'GET' && method !== 'HEAD' && csrfToken) init.headers['X-CSRF-Token'] = csrfToken;
  let res;
  try {
    res = await fetch(url, init);
  } catch (err) {
    if (err && err.name === 'AbortError') throw err;   // the view went away: not worth a banner
    throw new ApiError(0, null, url);
  }
  if (res.ok) return res;
  const problem = await readProblem(res);
  if (res.status === 401 && !quiet401) goSignIn();
  throw new ApiError(res.status, problem, url);
}

/** GET a JSON document. */
export async function getJSON(url, opts = {}) {
  const res = await request(url, opts);
  return res.json();
}

/** POST a JSON body (the CSRF header is added); resolves with {status, body} (body may be null). */
export async function postJSON(url, body, opts = {}) {
  const res = await request(url, { ...opts, method: 'POST', json: body === undefined ? {} : body });
  let data = null;
  if (res.status !== 204) {
    try {
      data = (res.headers.get('Content-Type') || '').includes('json') ? await res.json() : await res.text();
    } catch {
      data = null;
    }
  }
  return { status: res.status, body: data };
}

/** Build "path?a=1&b=2" leaving out empty values. */
export function withQuery(path, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== '') q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

/** True for an AbortError (a fetch cancelled because its view was left). */
export function isAbort(err) {
  return !!err && err.name === 'AbortError';
}
