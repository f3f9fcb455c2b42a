// cluster.js: every node as a row of GPU cells (through the virtualised list), with totals by model,
// the fragmentation figure and what fits right now above it. Refetches on `cluster` events (at most
// every 2 s) and every 15 s for utilisation.

import { getJSON } from './api.js';
import { h, fmtInt, fmtNum, fmtPct, fmtFrac, timeEl, badge, tenantColour, throttle, setQuery } from './app.js';
import { VirtualList } from './vlist.js';

const STATES = ['free', 'busy', 'idle', 'cordoned', 'unhealthy'];
const STATE_WORDS = {
  free: 'free: nothing allocated', busy: 'busy: allocated and working', idle: 'idle: allocated, no utilisation',
  cordoned: 'cordoned: takes no new work', unhealthy: 'unhealthy: failed health checks',
};
const MIG_SLOTS = 8;        // a MIG GPU's memory slices; mig_start and mig_slices count them
const ROW_HEIGHT = 46;

export function mount(view, ctx) {
  const { signal, params } = ctx;
  let data = null;
  let colour = params.get('colour') === 'tenant' ? 'tenant' : 'state';
  let filter = params.get('node') || '';
  const haystacks = new WeakMap();  // node -> lower-case text the filter searches

  // --- skeleton ---
  const asOf = h('span', { id: 'cluster-asof', class: 'muted' });
  const models = h('div', { id: 'models', class: 'card' });
  const frag = h('div', { id: 'fragmentation', class: 'card' });
  const fits = h('div', { id: 'fits', class: 'card' });
  const filterBox = h('input', {
    id: 'node-filter', type: 'search', placeholder: 'Filter nodes: id, model, state, tenant',
    'aria-label': 'Filter nodes', value: filter, autocomplete: 'off',
  });
  const byState = h('button', { id: 'colour-state', type: 'button', class: 'seg' }, 'state');
  const byTenant = h('button', { id: 'colour-tenant', type: 'button', class: 'seg' }, 'tenant');
  const count = h('span', { id: 'node-count', class: 'muted' });
  const legend = h('div', { id: 'legend', class: 'legend', 'aria-label': 'Legend' });
  const grid = h('div', { id: 'node-grid', class: 'node-grid', 'aria-label': 'Nodes' });

  view.append(h('section', { class: 'page page-cluster' },
    h('div', { class: 'page-head' }, h('h1', {}, 'Cluster'), asOf),
    h('div', { class: 'summary' }, models, frag, fits),
    h('div', { class: 'toolbar' }, filterBox,
      h('span', { class: 'segmented', role: 'group', 'aria-label': 'Colour by' },
        h('span', { class: 'seg-label' }, 'colour by'), byState, byTenant),
      count),
    legend,
    grid));

  const list = new VirtualList(grid, {
    rowHeight: ROW_HEIGHT, renderRow: nodeRow, key: (n) => n.node_id, empty: 'Loading nodes…',
  });

  // --- rendering ---
  function nodeRow(node) {
    const gpus = node.gpus || [];
    const models = [...new Set(gpus.map((g) => g.model).filter(Boolean))].join(', ');
    return h('div', { class: 'node-row', dataset: { node: node.node_id, nodeState: node.state || '' } },
      h('div', { class: 'node-info' },
        h('span', { class: 'node-id', title: [node.hostname, models].filter(Boolean).join(' · ') }, node.node_id),
        badge(node.state)),
      h('div', { class: 'gpu-cells' },
        gpus.length ? gpus.map((g) => gpuCell(node, g)) : h('span', { class: 'muted' }, 'no GPUs')));
  }

  function gpuCell(node, gpu) {
    const allocs = gpu.allocations || [];
    const state = gpu.state || 'free';
    const util = gpu.utilization_pct;
    const lines = [`${node.node_id} GPU ${gpu.index}`, gpu.model, state];
    if (util !== null && util !== undefined) lines.push(`${fmtPct(util)} util`);
    if (gpu.memory_used_mib !== null && gpu.memory_used_mib !== undefined) {
      lines.push(`${fmtInt(gpu.memory_used_mib)} / ${fmtInt(gpu.memory_mib)} MiB`);
    }
    if (gpu.mig_enabled) lines.push('MIG');
    for (const a of allocs) lines.push(`job ${a.job_id} (tenant ${a.tenant || '—'}, ${allocWords(a)})`);

    const cell = h('div', {
      class: 'gpu-cell', title: lines.filter(Boolean).join(' · '),
      dataset: { state, gpu: String(gpu.index), colour },
    });
    let shareBottom = 0;   // shares stack upwards from the bottom of the cell
    for (const a of allocs) {
      const seg = h('a', {
        class: 'alloc', href: `/ui/jobs/${encodeURIComponent(a.job_id)}`,
        title: `job ${a.job_id} · tenant ${a.tenant || '—'} · ${allocWords(a)}`,
        'aria-label': `${node.node_id} GPU ${gpu.index}: job ${a.job_id}, tenant ${a.tenant || 'none'}`,
        dataset: { job: a.job_id, tenant: a.tenant || '' },
      });
      if (a.mig_profile) {
        const slices = a.mig_slices ?? Math.max(1, Math.round((a.milli || 0) / 1000 * MIG_SLOTS));
        seg.classList.add('mig');
        seg.style.left = `${((a.mig_start || 0) / MIG_SLOTS) * 100}%`;
        seg.style.width = `${(slices / MIG_SLOTS) * 100}%`;
      } else if ((a.milli ?? 1000) < 1000) {
        const frac = Math.max(0.04, (a.milli || 0) / 1000);
        seg.classList.add('share');
        seg.style.bottom = `${shareBottom * 100}%`;
        seg.style.height = `${Math.min(frac, 1 - shareBottom) * 100}%`;
        shareBottom = Math.min(1, shareBottom + frac);
      } else {
        seg.classList.add('whole');
      }
      if (colour === 'tenant') seg.style.backgroundColor = tenantColour(a.tenant);
      cell.append(seg);
    }
    if (util !== null && util !== undefined) {
      const bar = h('span', { class: 'util', 'aria-hidden': 'true' });
      bar.style.width = `${Math.max(0, Math.min(100, util))}%`;
      cell.append(bar, h('span', { class: 'cell-label', 'aria-hidden': 'true' }, fmtPct(util)));
    }
    return cell;
  }

  function allocWords(a) {
    if (a.mig_profile) return `MIG ${a.mig_profile}${a.mig_start !== null && a.mig_start !== undefined ? ' @' + a.mig_start : ''}`;
    if ((a.milli ?? 1000) < 1000) return `${fmtNum(a.milli / 1000, 3)} GPU share${a.memory_mib ? ', ' + fmtInt(a.memory_mib) + ' MiB' : ''}`;
    return 'whole GPU';
  }

  function renderSummary() {
    const rows = data.models || [];
    models.replaceChildren(h('h2', {}, 'GPUs by model'), rows.length
      ? h('table', { class: 'data compact' },
        h('thead', {}, h('tr', {}, ['Model', 'Nodes', 'GPUs', 'Free', 'Allocated', 'Unhealthy', 'Mean util']
          .map((c, i) => h('th', { class: i ? 'num' : null, scope: 'col' }, c)))),
        h('tbody', {}, rows.map((m) => h('tr', { dataset: { model: m.model } },
          h('th', { scope: 'row' }, m.model),
          [m.nodes, m.gpus, m.free, m.allocated, m.unhealthy].map((v) => h('td', { class: 'num' }, fmtInt(v))),
          h('td', { class: 'num' }, fmtPct(m.mean_utilization_pct))))))
      : h('p', { class: 'muted' }, 'No GPUs registered.'));

    const f = data.fragmentation || {};
    frag.replaceChildren(h('h2', {}, 'Fragmentation'),
      h('p', { class: 'big-figure', id: 'fragmentation-figure' }, fmtFrac(f.figure)),
      h('p', { class: 'muted' }, `${fmtInt(f.free_gpus)} free GPUs · ${fmtInt(f.stranded_gpus)} stranded`),
      f.explain ? h('p', { class: 'explain' }, f.explain) : null);

    const chips = (data.fits || []).map((s) => h('span', {
      class: 'chip', dataset: { shape: s.shape }, title: `${fmtInt(s.count)} more jobs of shape ${s.shape} would fit now`,
    }, h('span', { class: 'chip-label' }, s.shape), h('strong', {}, fmtInt(s.count))));
    fits.replaceChildren(h('h2', {}, 'Fits right now'),
      chips.length ? h('div', { class: 'chips' }, chips) : h('p', { class: 'muted' }, 'Nothing reported.'));
  }

  function renderLegend(nodes) {
    if (colour === 'state') {
      const counts = Object.fromEntries(STATES.map((s) => [s, 0]));
      for (const n of nodes) for (const g of n.gpus || []) counts[g.state] = (counts[g.state] || 0) + 1;
      legend.replaceChildren(...STATES.map((s) => h('span', { class: 'legend-item', title: STATE_WORDS[s] },
        h('span', { class: 'swatch gpu-swatch', dataset: { state: s } }), `${s} ${fmtInt(counts[s])}`)));
      return;
    }
    const gpusBy = new Map((data.tenants || []).map((t) => [t, 0]));
    for (const n of nodes) {
      for (const g of n.gpus || []) {
        for (const a of g.allocations || []) {
          const t = a.tenant || '—';
          gpusBy.set(t, (gpusBy.get(t) || 0) + (a.milli ?? 1000) / 1000);
        }
      }
    }
    const items = [...gpusBy.entries()].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
    legend.replaceChildren(...(items.length ? items.map(([t, gpus]) => {
      const sw = h('span', { class: 'swatch' });
      sw.style.backgroundColor = tenantColour(t === '—' ? null : t);
      return h('span', { class: 'legend-item', dataset: { tenant: t } }, sw, `${t} ${fmtNum(gpus, 2)} GPUs`);
    }) : [h('span', { class: 'muted' }, 'No allocations.')]));
  }

  function haystack(node) {
    let s = haystacks.get(node);
    if (!s) {
      const parts = [node.node_id, node.hostname, node.state];
      for (const g of node.gpus || []) {
        parts.push(g.model, g.state);
        for (const a of g.allocations || []) parts.push(a.tenant, a.job_id);
      }
      s = parts.filter(Boolean).join(' ').toLowerCase();
      haystacks.set(node, s);
    }
    return s;
  }

  function renderNodes() {
    const all = data ? data.nodes || [] : [];
    const terms = filter.toLowerCase().split(/\s+/).filter(Boolean);
    const shown = terms.length ? all.filter((n) => terms.every((t) => haystack(n).includes(t))) : all;
    list.setEmptyText(all.length ? 'No node matches the filter.' : 'No nodes registered.');
    list.setItems(shown);
    const gpus = shown.reduce((s, n) => s + (n.gpus || []).length, 0);
    count.textContent = `${fmtInt(shown.length)} of ${fmtInt(all.length)} nodes · ${fmtInt(gpus)} GPUs`;
    renderLegend(shown);
  }

  function showColour() {
    byState.setAttribute('aria-pressed', String(colour === 'state'));
    byTenant.setAttribute('aria-pressed', String(colour === 'tenant'));
    grid.dataset.colour = colour;
  }

  function syncUrl() {
    setQuery({ colour: colour === 'tenant' ? 'tenant' : '', node: filter });
  }

  // --- data ---
  async function load() {
    const next = await getJSON('/v1/cluster', { signal });
    if (signal.aborted) return;
    data = next;
    asOf.replaceChildren('as of ', timeEl(data.as_of));
    renderSummary();
    renderNodes();
  }

  // --- wiring ---
  const setColour = (c) => {
    colour = c;
    showColour();
    syncUrl();
    list.redraw();
    if (data) renderLegend(list.items);
  };
  byState.addEventListener('click', () => setColour('state'));
  byTenant.addEventListener('click', () => setColour('tenant'));
  let typing = 0;
  filterBox.addEventListener('input', () => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      filter = filterBox.value.trim();
      syncUrl();
      renderNodes();
    }, 120);
  });

  showColour();
  const refresh = throttle(load, 2000);
  refresh();
  const timer = setInterval(refresh, 15000);

  return {
    onCluster: refresh,
    onReset: refresh,
    unmount() {
      refresh.cancel();
      clearInterval(timer);
      clearTimeout(typing);
      list.destroy();
    },
  };
}
