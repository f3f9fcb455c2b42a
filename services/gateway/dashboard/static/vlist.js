// vlist.js: a virtualised list of fixed-height rows. Only the rows in (and just around) the visible
// window are in the DOM, so 10,000 jobs or 1,000 nodes scroll as smoothly as 50.
//
//   const list = new VirtualList(viewportEl, {rowHeight: 36, renderRow: (item, i) => el, key: (item) => id});
//   list.setItems(items);        // keeps the scroll position; rebuilds only rows whose item changed
//
// The viewport is the scrolling element (give it a height in CSS); rows are absolutely positioned
// inside a spacer as tall as all rows together. A row is rebuilt only when its item object changes
// (identity), so callers that keep unchanged items as the same objects get cheap refreshes.

export class VirtualList {
  constructor(viewport, { rowHeight, renderRow, key = (item, i) => i, overscan = 8, empty = null }) {
    this.viewport = viewport;
    this.rowHeight = rowHeight;
    this.renderRow = renderRow;
    this.key = key;
    this.overscan = overscan;
    this.emptyText = empty;
    this.items = [];
    this.rows = new Map();       // key -> {el, item, index}
    this.frame = 0;

    viewport.classList.add('vlist');
    viewport.tabIndex = 0;       // scrollable by keyboard (arrows, Page Up/Down)
    viewport.setAttribute('role', 'list');
    this.spacer = document.createElement('div');
    this.spacer.className = 'vlist-spacer';
    this.emptyEl = document.createElement('p');
    this.emptyEl.className = 'vlist-empty';
    this.emptyEl.hidden = true;
    viewport.replaceChildren(this.spacer, this.emptyEl);

    this.onScroll = () => this.schedule();
    viewport.addEventListener('scroll', this.onScroll, { passive: true });
    this.resize = new ResizeObserver(() => this.schedule());
    this.resize.observe(viewport);
    // a row that receives focus (Tab) is scrolled into full view
    viewport.addEventListener('focusin', (e) => {
      const row = e.target.closest('.vlist-row');
      if (row) this.scrollToIndex(Number(row.dataset.index));
    });
  }

  /** Replace the items; the scroll position is kept (clamped to the new length). */
  setItems(items) {
    this.items = items;
    this.spacer.style.height = `${items.length * this.rowHeight}px`;
    this.emptyEl.hidden = items.length > 0 || !this.emptyText;
    this.emptyEl.textContent = this.emptyText || '';
    this.draw();
  }

  /** Set the text shown when there are no items. */
  setEmptyText(text) {
    this.emptyText = text;
    this.emptyEl.textContent = text || '';
    this.emptyEl.hidden = this.items.length > 0 || !text;
  }

  /** Scroll so that row i is fully visible. */
  scrollToIndex(i) {
    const top = i * this.rowHeight, vp = this.viewport;
    if (top < vp.scrollTop) vp.scrollTop = top;
    else if (top + this.rowHeight > vp.scrollTop + vp.clientHeight) {
      vp.scrollTop = top + this.rowHeight - vp.clientHeight;
    }
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.draw();
    });
  }

  /** Put exactly the visible window's rows into the DOM. */
  draw() {
    const { items, rowHeight, viewport } = this;
    const height = viewport.clientHeight || 600;
    const first = Math.max(0, Math.floor(viewport.scrollTop / rowHeight) - this.overscan);
    const last = Math.min(items.length, Math.ceil((viewport.scrollTop + height) / rowHeight) + this.overscan);
    const keep = new Map();
    for (let i = first; i < last; i++) {
      const item = items[i];
      const k = this.key(item, i);
      let row = this.rows.get(k);
      if (row && row.item === item) {
        this.rows.delete(k);
      } else {
        if (row) {
          row.el.remove();
          this.rows.delete(k);
        }
        const el = this.renderRow(item, i);
        el.classList.add('vlist-row');
        el.setAttribute('role', 'listitem');
        el.style.height = `${rowHeight}px`;
        row = { el, item, index: -1 };
      }
      if (row.index !== i) {
        row.index = i;
        row.el.dataset.index = String(i);
        row.el.style.transform = `translateY(${i * rowHeight}px)`;
      }
      if (!row.el.isConnected) this.spacer.append(row.el);
      keep.set(k, row);
    }
    for (const row of this.rows.values()) row.el.remove();   // rows scrolled out of the window
    this.rows = keep;
  }

  /** Forget every rendered row (e.g. when the way rows are drawn changes) and draw again. */
  redraw() {
    for (const row of this.rows.values()) row.el.remove();
    this.rows.clear();
    this.draw();
  }

  destroy() {
    cancelAnimationFrame(this.frame);
    this.viewport.removeEventListener('scroll', this.onScroll);
    this.resize.disconnect();
    this.rows.clear();
  }
}
