// job.js: one job. Header (who, what, where), a timeline of every event with its reasons (preemptions,
// checkpoints and the exit stand out), a live log tail while it runs, and Cancel / Hold / Release for
// roles that may act. Updates from `job` events for this id (at most one refetch a second).

import { getJSON, postJSON, request, ApiError } from './api.js';
import { h, fmtInt, fmtNum, fmtDuration, fmtShape, fmtTime, timeEl, badge, throttle, guard, reportError, confirmDialog } from './app.js';

const TERMINAL = new Set(['Succeeded', 'Failed', 'Cancelled', 'Rejected']);
const WAITING = new Set(['Admitted', 'Queued']);     // may be held (the gateway's HOLDABLE)
const RUNNING = new Set(['Running', 'Preempting']);              // the log grows
const EXIT_TYPES = new Set(['JobSucceeded', 'JobFailed', 'JobCancelled', 'JobRejected']);
const REASON_KEYS = ['reason', 'reasons', 'message', 'explanation'];
const LOG_LINES = 2000;
const LOG_EVERY_MS = 2000;
const CATCH_UP_CHUNKS = 64;   // chunks read back to back before the next 2 s pause (the gateway's are 256 KiB)

// payload fields worth a line in the timeline (besides the reasons); value formatting per key
const FACTS = {
  node_id: 'node', gpu_indices: 'GPUs', gpu_model: 'model', policy: 'policy', mig_profile: 'MIG',
  mig_start: 'MIG start', gpu_share_milli: 'share (milli)', exit_code: 'exit code', runtime_s: 'ran',
  lost_s: 'work lost', checkpoint_ref: 'checkpoint', grace_s: 'grace', deadline_at: 'deadline',
  preemptor_job_id: 'for job', preemptor_tenant: 'preemptor tenant', preemptor_priority: 'preemptor priority',
  victims: 'victims', tenant_reserved_gpus: 'tenant reserved', tenant_cap_gpus: 'tenant cap',
  borrowed_gpus: 'borrowed', requested_by: 'requested by', submitted_by: 'submitted by', pid: 'pid',
};

const ACTIONS = {
  cancel: { label: 'Cancel', verb: 'Cancel', reason: 'cancelled from the dashboard', yes: 'Cancel job' },
  hold: { label: 'Hold', verb: 'Hold', reason: 'held from the dashboard', yes: 'Hold job' },
  release: { label: 'Release', verb: 'Release', reason: 'released from the dashboard', yes: 'Release job' },
};

const jobLink = (id) => h('a', { href: `/ui/jobs/${encodeURIComponent(id)}`, class: 'mono' }, id);

export function mount(view, ctx) {
  const { id, signal, session } = ctx;
  const enc = encodeURIComponent(id);
  let job = null;
  let gone = false;

  // --- skeleton ---
  const head = h('header', { id: 'job-header', class: 'job-header' }, h('h1', {}, 'Job ', h('span', { class: 'mono' }, id)));
  const buttons = Object.fromEntries(Object.entries(ACTIONS).map(([kind, a]) => [kind,
    h('button', { id: `action-${kind}`, type: 'button', class: kind === 'cancel' ? 'danger' : kind === 'hold' ? 'quiet' : '', hidden: true }, a.label)]));
  const actions = h('div', { id: 'job-actions', class: 'actions', hidden: !(session.may && session.may.act) },
    Object.values(buttons), h('span', { id: 'action-result', role: 'status', 'aria-live': 'polite' }));
  const details = h('dl', { id: 'job-details', class: 'facts' });
  const timeline = h('ol', { id: 'timeline', class: 'timeline' });
  const logStatus = h('span', { id: 'log-status', class: 'muted' }, '');
  const log = h('pre', { id: 'log', class: 'log', tabindex: '0', 'aria-label': 'Job log' });

  const body = h('div', { class: 'page job-body' }, actions,
    h('div', { class: 'job-columns' },
      h('section', { class: 'card' }, h('h2', {}, 'Details'), details),
      h('section', { class: 'card' }, h('h2', {}, 'Timeline'), timeline)),
    h('section', { class: 'card' }, h('div', { class: 'card-head' }, h('h2', {}, 'Log'), logStatus), log));
  view.append(h('section', { class: 'page page-job' }, head, body));

  // --- header and details ---
  function lastPlacement() {
    const placed = (job.events || []).filter((e) => e.type === 'JobPlaced');
    return placed.length ? placed[placed.length - 1].payload || {} : {};
  }

  function renderHead() {
    const placed = lastPlacement();
    head.replaceChildren(
      h('h1', {}, 'Job ', h('span', { class: 'mono' }, job.job_id || id), ' ', badge(job.state, { id: 'job-state' })),
      h('p', { class: 'subtitle' }, job.name ? h('strong', {}, job.name) : h('span', { class: 'muted' }, 'unnamed'),
        ' · tenant ', job.tenant || '—', ' · ', fmtShape({ ...job, mig_profile: placed.mig_profile, gpu_share_milli: placed.gpu_share_milli })));
    const where = [];
    if (job.node_id) where.push(job.node_id);
    if (job.gpu_indices && job.gpu_indices.length) where.push(`GPU ${job.gpu_indices.join(', ')}`);
    if (placed.mig_profile) where.push(`MIG ${placed.mig_profile}${placed.mig_start !== null && placed.mig_start !== undefined ? ' at slice ' + placed.mig_start : ''}`);
    if (placed.gpu_share_milli) where.push(`${fmtNum(placed.gpu_share_milli / 1000, 3)} of the GPU`);
    const w = job.waiting;
    const rows = [
      ['Where', where.length ? where.join(' · ') : '—'],
      w ? ['Waiting', `in ${w.queue || 'the queue'} at position ${fmtInt(w.position)}${w.reason ? ': ' + w.reason : ''}`] : null,
      ['Priority', job.priority ?? '—'],
      ['Submitted by', job.submitted_by || '—'],
      ['Submitted', timeEl(job.submitted_at)],
      ['Admitted', timeEl(job.admitted_at)],
      ['Queued', timeEl(job.queued_at)],
      ['Placed', timeEl(job.placed_at)],
      ['Started', timeEl(job.started_at)],
      ['Finished', timeEl(job.finished_at)],
      job.started_at ? ['Run time', fmtDuration(((job.finished_at ? new Date(job.finished_at) : Date.now()) - new Date(job.started_at)) / 1000)] : null,
      ['Exit code', job.exit_code ?? '—'],
      job.reasons && job.reasons.length ? ['Reasons', h('ul', { class: 'reasons' }, job.reasons.map((r) => h('li', {}, r)))] : null,
    ].filter(Boolean);
    details.replaceChildren(...rows.flatMap(([k, v]) => [h('dt', {}, k), h('dd', { dataset: { fact: k.toLowerCase().replace(/\s+/g, '-') } }, v)]));
    for (const [kind, button] of Object.entries(buttons)) button.hidden = !allowed(kind, job.state);
  }

  function allowed(kind, state) {
    if (kind === 'cancel') return !TERMINAL.has(state);
    if (kind === 'hold') return WAITING.has(state);
    return state === 'Held';
  }

  // --- timeline ---
  function reasonsOf(payload) {
    const out = [];
    for (const k of REASON_KEYS) {
      const v = payload[k];
      if (Array.isArray(v)) out.push(...v.map(String));
      else if (v !== null && v !== undefined && v !== '') out.push(typeof v === 'string' ? v : JSON.stringify(v));
    }
    return out;
  }

  function factValue(key, v) {
    if (key === 'runtime_s' || key === 'lost_s' || key === 'grace_s') return fmtDuration(v);
    if (key === 'deadline_at') return timeEl(v);
    if (key === 'preemptor_job_id') return jobLink(v);
    if (key === 'victims' && Array.isArray(v)) return v.flatMap((x, i) => (i ? [', ', jobLink(x)] : [jobLink(x)]));
    if (Array.isArray(v)) return v.join(', ');
    return String(v);
  }

  function renderTimeline() {
    const events = [...(job.events || [])].sort((a, b) => (a.version ?? 0) - (b.version ?? 0));
    let request = null;   // the latest PreemptionRequested: why the following JobPreempted happened
    const items = events.map((e) => {
      const p = e.payload || {};
      const type = e.type || 'event';
      const cls = ['event'];
      if (type === 'JobPreempted' || type === 'PreemptionRequested') cls.push('event-preempted');
      if (/checkpoint/i.test(type)) cls.push('event-checkpoint');
      if (EXIT_TYPES.has(type)) cls.push('event-exit', type === 'JobSucceeded' ? 'event-ok' : 'event-bad');
      const reasons = reasonsOf(p);
      const body = [];
      if (type === 'JobPreempted') {
        const why = reasons[0] || (request && request.reason) || 'no reason recorded';
        body.push(h('p', { class: 'preempted-reason' }, h('strong', {}, 'Preempted: '), why,
          request && request.preemptor_job_id ? [' (for job ', jobLink(request.preemptor_job_id),
            request.preemptor_tenant ? ` of tenant ${request.preemptor_tenant}` : '',
            request.preemptor_priority !== undefined ? `, priority ${request.preemptor_priority}` : '', ')'] : null));
        reasons.shift();
      }
      if (type === 'PreemptionRequested') request = p;
      body.push(...reasons.map((r) => h('p', { class: 'event-reason' }, r)));
      const facts = Object.keys(FACTS).filter((k) => p[k] !== null && p[k] !== undefined && p[k] !== '' &&
        !(Array.isArray(p[k]) && !p[k].length));
      if (facts.length) {
        body.push(h('p', { class: 'event-facts' }, facts.flatMap((k, i) =>
          [i ? ' · ' : null, h('span', { class: 'muted' }, `${FACTS[k]} `), factValue(k, p[k])])));
      }
      return h('li', { class: cls.join(' '), dataset: { type, version: String(e.version ?? '') } },
        h('div', { class: 'event-head' },
          h('strong', { class: 'event-type' }, type),
          h('time', { datetime: e.occurred_at, title: `occurred ${fmtTime(e.occurred_at)}${e.recorded_at ? ' · recorded ' + fmtTime(e.recorded_at) : ''}` },
            fmtTime(e.occurred_at)),
          e.producer ? h('span', { class: 'muted producer' }, `by ${e.producer}`) : null),
        body,
        h('details', { class: 'payload' }, h('summary', {}, 'payload'), h('pre', {}, JSON.stringify(p, null, 2))));
    });
    timeline.replaceChildren(...(items.length ? items : [h('li', { class: 'muted' }, 'No events recorded.')]));
  }

  // --- log tail ---
  let lines = [];          // complete lines, the last LOG_LINES of them
  let partial = '';        // text after the last newline
  let offset = 0;
  let logTimer = 0;
  let logBusy = false;
  let logFetched = false;
  let logErrors = 0;
  let logAgain = false;

  function appendLog(text) {
    if (!text) return;
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 24;
    const parts = (partial + text).split('\n');
    partial = parts.pop();
    lines.push(...(parts.length > LOG_LINES ? parts.slice(-LOG_LINES) : parts));   // no huge spread
    if (lines.length > LOG_LINES) lines = lines.slice(lines.length - LOG_LINES);
    log.textContent = lines.join('\n') + (partial ? (lines.length ? '\n' : '') + partial : '');
    if (atBottom) log.scrollTop = log.scrollHeight;
  }

  /** One chunk from `offset` (the gateway answers at most a chunk); true when the log went on. */
  async function fetchLog() {
    let advanced = false;
    if (gone) return advanced;
    if (logBusy) {
      logAgain = true;   // e.g. the job just ended during a poll: fetch its last lines after this one
      return advanced;
    }
    logBusy = true;
    try {
      const res = await request(`/v1/jobs/${enc}/logs?offset=${offset}`, { signal, headers: { Accept: 'text/plain' } });
      const text = await res.text();
      const nextOffset = Number.parseInt(res.headers.get('X-Log-Next-Offset') || '', 10);
      const before = offset;
      offset = Number.isFinite(nextOffset) ? nextOffset : offset + new TextEncoder().encode(text).length;
      advanced = offset > before;
      logFetched = true;
      logErrors = 0;
      appendLog(text);
      logStatus.textContent = RUNNING.has(job && job.state) ? 'following' : lines.length || partial ? 'ended' : 'empty';
    } catch (err) {
      if (err instanceof ApiError && err.status === 404) {
        logStatus.textContent = err.detail;   // not run yet: say so quietly
      } else if (!(err && err.name === 'AbortError')) {
        logStatus.textContent = `log unavailable: ${(err && err.detail) || err}`;
        if (logErrors++ === 0) reportError(err);
      }
    } finally {
      logBusy = false;
      if (logAgain && !gone) {
        logAgain = false;
        fetchLog().catch(reportError);
      }
    }
    return advanced;
  }

  /** Read on while the log keeps coming (a long log is many chunks), at most `max` chunks now. */
  async function catchUp(max) {
    for (let i = 0; i < max && !gone; i++) {
      if (!(await fetchLog())) break;
    }
  }

  /** Follow the log while the job runs (one timer chain); fetch once more when it has ended, then stop. */
  let following = false;
  function followLog() {
    if (gone || !job) return;
    const running = RUNNING.has(job.state);
    const ran = running || job.started_at || (job.exit_code !== null && job.exit_code !== undefined);
    if (!ran) {
      if (!logFetched) logStatus.textContent = 'no log until the job runs';
      return;
    }
    if (running) {
      if (!following) {
        following = true;
        tick();
      }
      return;
    }
    if (following || !logFetched) {   // ended: the last lines, then no more polling
      following = false;
      clearTimeout(logTimer);
      catchUp(CATCH_UP_CHUNKS).catch(reportError);
    }
  }
  function tick() {
    if (gone || !following) return;
    catchUp(CATCH_UP_CHUNKS).catch(reportError).finally(() => {
      if (!gone && following) logTimer = setTimeout(tick, LOG_EVERY_MS);
    });
  }

  // --- actions ---
  async function act(kind) {
    const a = ACTIONS[kind];
    const result = document.getElementById('action-result');
    const answer = await confirmDialog({
      title: `${a.verb} job ${id}?`,
      message: kind === 'cancel' ? 'The job stops (running work gets SIGTERM, then SIGKILL after its grace period) and ends Cancelled.'
        : kind === 'hold' ? 'The job is set aside: quota and placement ignore it until it is released.'
          : 'The job goes back in line at its original submission time.',
      reason: a.reason, yes: a.yes,
    });
    if (!answer.ok) return;
    result.dataset.kind = '';
    result.textContent = `${a.verb}: sending…`;
    try {
      const res = await postJSON(`/v1/jobs/${enc}/${kind}`, { reason: answer.reason || a.reason }, { signal });
      const b = res.body && typeof res.body === 'object' ? res.body : {};
      const said = b.cancel || b.hold || b.release || b.detail || (typeof res.body === 'string' ? res.body : '');
      result.dataset.kind = 'ok';
      result.textContent = `${a.verb} accepted (${res.status}${said ? ': ' + said : ''}).`;
    } catch (err) {
      result.dataset.kind = 'error';
      result.textContent = `${a.verb} refused: ${(err && err.detail) || err}`;
      reportError(err);
    }
    refresh();
  }
  for (const kind of Object.keys(buttons)) buttons[kind].addEventListener('click', guard(() => act(kind)));

  // --- data ---
  async function load() {
    try {
      const next = await getJSON(`/v1/jobs/${enc}`, { signal });
      if (signal.aborted) return;
      job = next;
    } catch (err) {
      if (err instanceof ApiError && err.status === 404 && !job) {
        head.replaceChildren(h('h1', {}, 'Job ', h('span', { class: 'mono' }, id)),
          h('p', { id: 'job-missing', class: 'callout' }, `Not found: ${err.detail || 'no such job'}`));
        body.hidden = true;   // nothing else to show
        return;
      }
      throw err;
    }
    renderHead();
    renderTimeline();
    followLog();
  }

  const refresh = throttle(load, 1000);
  refresh();

  return {
    onJob(evt) {
      if (!evt || evt.job_id === id) refresh();
    },
    onReset: refresh,
    unmount() {
      gone = true;
      refresh.cancel();
      clearTimeout(logTimer);
    },
  };
}
