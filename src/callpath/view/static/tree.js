// tree.js — the navigation tree and the metric columns as ONE virtual table: a single scrolling
// element holds the sticky header, the tree column (sticky on the left) and the metric cells,
// so vertical scrolling of tree and metrics is synchronised by construction.
//
// Only the rows in view exist in the DOM (a small pool of row elements is reused), and
// children are fetched from the server a page at a time as their rows scroll into view: an
// expanded node with 10^5 children costs one array of placeholders, not 10^5 requests or
// elements. Very tall trees (beyond what a browser can lay out as one element) are scrolled
// proportionally: the scroll fraction chooses the first row.

import { publish } from "./store.js";

const PAGE = 200;
const MAX_SPACER = 8_000_000; // px; browsers clamp element heights near 2^25

/** One visible line of the tree: a loaded row or a placeholder waiting for its page. */
class Entry {
  constructor(parent, idx, depth) {
    this.parent = parent;   // Entry or null (the root row)
    this.idx = idx;         // index among its siblings (server order)
    this.depth = depth;
    this.row = null;        // the server's ROW once its page arrived
    this.kids = null;       // Entry[] when expanded
    this.total = 0;
    this.pages = new Set(); // page offsets requested
  }
  get key() { return this.row ? this.row.key : null; }
}

export class TreeTable {
  /**
   * @param {HTMLElement} host  the element the table fills
   * @param {object} hooks  fetchChildren(node, offset, limit) -> Promise<{root?, total, rows}>,
   *   onSelect(entry), onActivate(entry), onContext(entry, x, y), onSort(colKey),
   *   onReorder(fromKey, toKey), onExpandChange(), isExpanded(key)
   */
  constructor(host, hooks) {
    this.host = host;
    this.hooks = hooks;
    this.columns = [];
    this.rows = [];          // flat list of visible entries (preorder)
    this.selected = null;    // Entry
    this.selKey = null;      // wanted selection (restored when its row arrives)
    this.expandedKeys = new Set();
    this.sortKey = null;
    this.order = "desc";
    this.generation = 0;     // bumps on reload; stale pages are dropped
    this.rowHeight = 22;
    this.pool = [];
    this.scrollToSel = false;
    this.treeW = null;       // the Scope column's width set by its grip (px), else it fills

    host.classList.add("tv");
    host.innerHTML = "";
    this.scroller = el("div", "tv-scroll");
    this.scroller.tabIndex = 0;
    this.scroller.setAttribute("role", "treegrid");
    this.scroller.setAttribute("aria-label", "navigation tree and metrics");
    this.head = el("div", "tv-head tv-grid");
    this.head.setAttribute("role", "row");
    this.spacer = el("div", "tv-spacer");
    this.body = el("div", "tv-rows");
    this.spacer.appendChild(this.body);
    this.scroller.append(this.head, this.spacer);
    host.appendChild(this.scroller);

    this.scroller.addEventListener("scroll", () => this.render());
    this.scroller.addEventListener("keydown", (e) => this.onKey(e));
    new ResizeObserver(() => this.render()).observe(this.scroller);
    this.body.addEventListener("click", (e) => this.onClick(e));
    this.body.addEventListener("dblclick", (e) => {
      const entry = this.entryAt(e);
      if (entry && entry.row) this.hooks.onActivate(entry);
    });
    this.body.addEventListener("contextmenu", (e) => {
      const entry = this.entryAt(e);
      if (!entry || !entry.row) return;
      e.preventDefault();
      this.select(entry);
      this.hooks.onContext(entry, e.clientX, e.clientY);
    });
  }

  setFont(px) {
    this.rowHeight = Math.round(px * 1.65);
    this.host.style.setProperty("--font", `${px}px`);
    this.host.style.setProperty("--row-h", `${this.rowHeight}px`);
    this.render();
  }

  /** (Re)loads the tree from the root with the given columns, sort and expanded keys. */
  async load(columns, sortKey, order, expandedKeys, selKey) {
    this.columns = columns;
    this.sortKey = sortKey;
    this.order = order;
    this.expandedKeys = new Set(expandedKeys);
    this.selKey = selKey;
    this.scrollToSel = !!selKey;
    const gen = ++this.generation;
    this.renderHead();
    const res = await this.hooks.fetchChildren(null, 0, PAGE);
    if (gen !== this.generation) return;
    const root = new Entry(null, 0, 0);
    root.row = res.root;
    this.root = root;
    this.rows = [root];
    this.selected = null;
    this.installKids(root, res, gen);
    this.afterRowsArrived([root], gen);
    this.render();
  }

  /** Re-renders the header (sort marks, names, order) without refetching rows. */
  renderHead() {
    const cols = this.columns;
    this.host.style.setProperty("--ncols", String(cols.length));
    this.head.innerHTML = "";
    const scope = el("div", "tv-hcell tv-tree");
    scope.textContent = "Scope";
    scope.setAttribute("role", "columnheader");
    const grip = el("span", "tv-grip");
    grip.title = "drag to resize the Scope column";
    grip.addEventListener("mousedown", (e) => {
      e.preventDefault();
      const x0 = e.clientX, w0 = scope.offsetWidth;
      // a click on the grip (or a pixel's jitter) keeps the width that fills the pane
      const move = (ev) => {
        if (Math.abs(ev.clientX - x0) < 4 && this.treeW === null) return;
        this.treeW = Math.max(120, w0 + ev.clientX - x0);
        this.render();
      };
      window.addEventListener("mousemove", move);
      window.addEventListener("mouseup", () => window.removeEventListener("mousemove", move), { once: true });
    });
    scope.appendChild(grip);
    this.head.appendChild(scope);
    for (const c of cols) {
      const h = el("div", "tv-hcell tv-metric");
      h.setAttribute("role", "columnheader");
      h.dataset.key = c.key;
      h.draggable = true;
      h.title = `${c.name}${c.description ? " — " + c.description : ""}\nclick: sort; click again: toggle order; drag: move`;
      const name = el("span", "tv-hname");
      name.textContent = c.display || c.name;
      const mark = el("span", "tv-sort");
      if (c.key === this.sortKey) {
        mark.textContent = this.order === "desc" ? " ▼" : " ▲";
        h.classList.add("sorted");
        h.setAttribute("aria-sort", this.order === "desc" ? "descending" : "ascending");
      }
      const agg = el("div", "tv-agg");
      agg.textContent = c.aggregate_text ?? "";
      h.append(name, mark, agg);
      h.addEventListener("click", () => this.hooks.onSort(c.key));
      h.addEventListener("dragstart", (e) => {
        e.dataTransfer.setData("text/x-callpath-col", c.key);
        e.dataTransfer.effectAllowed = "move";
      });
      h.addEventListener("dragover", (e) => { e.preventDefault(); h.classList.add("drop"); });
      h.addEventListener("dragleave", () => h.classList.remove("drop"));
      h.addEventListener("drop", (e) => {
        e.preventDefault();
        h.classList.remove("drop");
        const from = e.dataTransfer.getData("text/x-callpath-col");
        if (from && from !== c.key) this.hooks.onReorder(from, c.key);
      });
      this.head.appendChild(h);
    }
    this.layoutColumns();  // now, not at the next frame: the headers stay where they are drawn
  }

  installKids(entry, res, gen) {
    entry.total = res.total;
    entry.kids = new Array(res.total);
    for (let i = 0; i < res.total; i++) entry.kids[i] = new Entry(entry, i, entry.depth + 1);
    entry.pages = new Set([res.offset || 0]);
    this.fillPage(entry, res.offset || 0, res.rows, gen);
    // splice the children in right after the entry (no spread: totals may be large)
    const p = this.indexOf(entry);
    this.rows = this.rows.slice(0, p + 1).concat(entry.kids, this.rows.slice(p + 1));
  }

  fillPage(entry, offset, rows, gen) {
    const arrived = [];
    for (let i = 0; i < rows.length; i++) {
      const kid = entry.kids[offset + i];
      if (!kid) continue;
      kid.row = rows[i];
      arrived.push(kid);
    }
    this.afterRowsArrived(arrived, gen);
  }

  /** Rows that just arrived: restore their expansion and the wanted selection. */
  afterRowsArrived(entries, gen) {
    for (const e of entries) {
      if (!e.row) continue;
      if (this.selKey && e.row.key === this.selKey) {
        this.selected = e;
        if (this.scrollToSel) { this.scrollToSel = false; requestAnimationFrame(() => this.reveal(e)); }
        this.notifySelect(e, true);
      }
      if (e.row.has_children && this.expandedKeys.has(e.row.key) && !e.kids) this.expand(e, gen);
    }
  }

  indexOf(entry) {
    // the entry is usually near the rows in view: look there first
    const first = this.firstIndex || 0;
    for (let i = Math.max(0, first - 50); i < Math.min(this.rows.length, first + 300); i++) {
      if (this.rows[i] === entry) return i;
    }
    return this.rows.indexOf(entry);
  }

  async expand(entry, gen = this.generation) {
    if (!entry.row || !entry.row.has_children || entry.kids || entry.loading) return;
    entry.loading = true;
    this.expandedKeys.add(entry.row.key);
    try {
      const res = await this.hooks.fetchChildren(entry.row.key, 0, PAGE);
      if (gen !== this.generation) return;
      if (this.indexOf(entry) < 0) return; // collapsed away meanwhile
      this.installKids(entry, res, gen);
    } finally {
      entry.loading = false;
    }
    this.hooks.onExpandChange();
    this.render();
  }

  collapse(entry) {
    if (!entry.kids) return;
    const p = this.indexOf(entry);
    if (p < 0) { entry.kids = null; return; } // inside a subtree collapsed already
    let q = p + 1;
    while (q < this.rows.length && this.rows[q].depth > entry.depth) {
      const k = this.rows[q].row && this.rows[q].row.key;
      if (k) this.expandedKeys.delete(k);
      if (this.selected === this.rows[q]) { this.selected = entry; this.notifySelect(entry); }
      q++;
    }
    this.rows = this.rows.slice(0, p + 1).concat(this.rows.slice(q));
    entry.kids = null;
    if (entry.row) this.expandedKeys.delete(entry.row.key);
    this.hooks.onExpandChange();
    this.render();
  }

  toggle(entry) { if (entry.kids) this.collapse(entry); else this.expand(entry); }

  /** Expands along a path of keys (hot path, Find), loading pages until each key is found. */
  async revealPath(keys) {
    let entry = this.root;
    const gen = this.generation;
    for (const key of keys) {
      if (!entry.kids) {
        await this.expand(entry, gen);
        if (gen !== this.generation || !entry.kids) return null;
      }
      let found = entry.kids.find((k) => k.row && k.row.key === key);
      for (let off = 0; !found && off < entry.total; off += PAGE) {
        if (!entry.pages.has(off)) {
          await this.loadPage(entry, off, gen);
          found = entry.kids.find((k) => k.row && k.row.key === key);
        }
      }
      if (!found) return null;
      entry = found;
    }
    this.select(entry);
    this.reveal(entry);
    return entry;
  }

  async loadPage(entry, offset, gen) {
    entry.pages.add(offset);
    const res = await this.hooks.fetchChildren(entry.row.key, offset, PAGE);
    if (gen !== this.generation || !entry.kids) return;
    this.fillPage(entry, res.offset ?? offset, res.rows, gen);
    this.render();
  }

  select(entry) {
    this.selected = entry;
    this.selKey = entry.row ? entry.row.key : null;
    this.notifySelect(entry);
    this.render();
  }

  /** The owner hears of the selection (hooks.onSelect: main.js makes it the store's); what
   *  follows the selection subscribes to the store's "selection". */
  notifySelect(entry, restored = false) {
    this.hooks.onSelect(entry, restored);
  }

  /** New columns (order, names, hidden ones) over the rows already loaded: no refetch. */
  setColumns(columns) {
    this.columns = columns;
    this.renderHead();
    this.render();
  }

  /** Loads still under way are stale from now on (a reload of the view is coming). */
  invalidate() { this.generation++; }

  /** Scrolls to a row index (a scroll position in rows that came from another screen), the
   *  selection kept in view. */
  scrollToRow(rows) {
    this.scroller.scrollTop = rows * this.rowHeight;
    this.revealSelection();
  }

  /**
   * Scrolls so that the entry is drawn inside the rows in view (a third of the way down
   * when it was out of view). Every jump ends here: Find, the hot path, the Lines tab, the
   * flame graph, the trace, a link, a shared session's follow.
   *
   * The spacer takes the height of the current rows first: the rows a jump has just
   * expanded are not drawn yet (drawing waits for the next animation frame), and the
   * browser clamps scrollTop to the old, shorter spacer — the selection then lay below the
   * rows in view. The scroll position is the inverse of draw()'s mapping from scrollTop
   * to the first row, so that it holds for proportionally scrolled (very tall) trees too.
   */
  reveal(entry) {
    const i = this.indexOf(entry);
    if (i < 0) return;
    const { n, height } = this.geometry();
    this.spacer.style.height = `${height}px`;
    const viewH = Math.max(0, this.scroller.clientHeight - this.head.offsetHeight);
    const visible = viewH / this.rowHeight;
    const first = this.firstRowAt(this.scroller.scrollTop);
    if (i < first || i + 1 > first + Math.floor(visible)) {
      const want = Math.max(0, i - Math.floor(visible / 3));
      const maxTop = Math.max(0, height - viewH);
      const span = Math.max(1, n - visible);
      this.scroller.scrollTop = height <= viewH ? 0 : Math.min(maxTop, (want / span) * maxTop);
    }
    this.render();
  }

  /** Reveals the selected row, if any (after a scroll set from elsewhere: a shared session). */
  revealSelection() { if (this.selected) this.reveal(this.selected); }

  /** The (fractional) index of the first row drawn at a given scrollTop (see draw()). */
  firstRowAt(scrollTop) {
    const { n, height } = this.geometry();
    const viewH = Math.max(0, this.scroller.clientHeight - this.head.offsetHeight);
    if (height <= viewH) return 0;
    const frac = Math.min(1, scrollTop / Math.max(1, height - viewH));
    return frac * Math.max(0, n - viewH / this.rowHeight);
  }

  geometry() {
    const n = this.rows.length;
    const full = n * this.rowHeight;
    const height = Math.min(full, MAX_SPACER);
    return { n, height, scale: full > 0 ? height / full : 1 };
  }

  /** Draws the rows in view from the row pool, and asks for the pages they need. */
  render() {
    if (this.rendering) return;
    this.rendering = true;
    requestAnimationFrame(() => { this.rendering = false; this.draw(); });
  }

  /**
   * The Scope column's width: the grip's if the user dragged it, else what the metric
   * columns leave free in the pane (at least 360 px): labels are cut only when the pane
   * has no room left, never while its right part is empty.
   */
  layoutColumns() {
    const colW = parseFloat(getComputedStyle(this.host).getPropertyValue("--col-w")) || 170;
    const free = this.scroller.clientWidth - this.columns.length * colW - 2;
    const w = this.treeW ?? Math.max(360, Math.floor(free));
    if (w !== this.shownTreeW) {
      this.shownTreeW = w;
      this.host.style.setProperty("--tree-w", `${w}px`);
    }
  }

  draw() {
    this.layoutColumns();
    const { n, height } = this.geometry();
    const headH = this.head.offsetHeight;
    this.spacer.style.height = `${height}px`;
    const viewH = Math.max(0, this.scroller.clientHeight - headH);
    const visible = viewH / this.rowHeight;
    const maxTop = Math.max(1, height - viewH);
    const frac = Math.min(1, this.scroller.scrollTop / maxTop);
    const firstExact = height <= viewH ? 0 : frac * Math.max(0, n - visible);
    const first = Math.floor(firstExact);
    this.firstIndex = first;
    const count = Math.min(n - first, Math.ceil(visible) + 2);
    const offset = this.scroller.scrollTop - (firstExact - first) * this.rowHeight;
    this.body.style.transform = `translateY(${Math.max(0, Math.min(offset, height))}px)`;
    while (this.pool.length < count) {
      const r = this.makeRow();
      this.pool.push(r);
      this.body.appendChild(r);
    }
    const need = new Map();
    for (let i = 0; i < this.pool.length; i++) {
      const r = this.pool[i];
      if (i >= count) { r.hidden = true; continue; }
      r.hidden = false;
      const entry = this.rows[first + i];
      this.fillRow(r, entry, first + i);
      if (!entry.row && entry.parent) {
        const off = Math.floor(entry.idx / PAGE) * PAGE;
        if (!entry.parent.pages.has(off)) need.set(entry.parent, (need.get(entry.parent) || new Set()).add(off));
      }
    }
    for (const [parent, offs] of need) for (const off of offs) this.loadPage(parent, off, this.generation);
    publish("tree:drawn", { tree: this });
  }

  makeRow() {
    const r = el("div", "tv-row tv-grid");
    r.setAttribute("role", "row");
    const tree = el("div", "tv-cell tv-tree");
    tree.setAttribute("role", "gridcell");
    const tog = el("span", "tv-toggle");
    const label = el("span", "tv-label");
    tree.append(tog, label);
    r.appendChild(tree);
    r._tree = tree; r._tog = tog; r._label = label; r._cells = [];
    return r;
  }

  fillRow(r, entry, index) {
    r._entry = entry;
    r.dataset.index = String(index);
    while (r._cells.length < this.columns.length) {
      const c = el("div", "tv-cell tv-metric");
      c.setAttribute("role", "gridcell");
      r.appendChild(c); r._cells.push(c);
    }
    while (r._cells.length > this.columns.length) r._cells.pop().remove();
    r._tree.style.paddingLeft = `${4 + entry.depth * 16}px`;
    r.classList.toggle("selected", entry === this.selected);
    r.setAttribute("aria-selected", entry === this.selected ? "true" : "false");
    const row = entry.row;
    if (!row) {
      r._tog.textContent = "";
      r._label.textContent = "…";
      r._label.className = "tv-label loading";
      r.dataset.key = "";
      for (const c of r._cells) c.textContent = "";
      return;
    }
    r.dataset.key = row.key;
    r.setAttribute("aria-level", String(entry.depth + 1));
    if (row.has_children) {
      r._tog.textContent = entry.kids ? "▾" : "▸";
      r.setAttribute("aria-expanded", entry.kids ? "true" : "false");
    } else {
      r._tog.textContent = "";
      r.removeAttribute("aria-expanded");
    }
    r._label.textContent = row.label;
    r._label.title = `${row.label} (${row.type})`;
    r._label.className = `tv-label t-${row.type}${row.has_source ? " has-source" : ""}`;
    for (let i = 0; i < this.columns.length; i++) {
      const k = this.columns[i].key;
      const text = row.text ? row.text[k] : undefined;
      const v = row.values ? row.values[k] : undefined;
      r._cells[i].textContent = text ?? (v == null ? "" : String(v));
    }
  }

  entryAt(e) {
    const r = e.target.closest(".tv-row");
    return r ? r._entry : null;
  }

  onClick(e) {
    const entry = this.entryAt(e);
    if (!entry || !entry.row) return;
    this.scroller.focus({ preventScroll: true });
    if (e.target.closest(".tv-toggle")) { this.toggle(entry); return; }
    this.select(entry);
  }

  onKey(e) {
    const cur = this.selected;
    let i = cur ? this.indexOf(cur) : -1;
    const page = Math.max(1, Math.floor((this.scroller.clientHeight - this.head.offsetHeight) / this.rowHeight) - 1);
    const go = (j) => {
      j = Math.max(0, Math.min(this.rows.length - 1, j));
      const t = this.rows[j];
      if (t && t.row) { this.select(t); this.reveal(t); }
    };
    switch (e.key) {
      case "ArrowDown": go(i + 1); break;
      case "ArrowUp": go(i - 1); break;
      case "PageDown": go(i + page); break;
      case "PageUp": go(i - page); break;
      case "Home": go(0); break;
      case "End": go(this.rows.length - 1); break;
      case "ArrowRight": case "+":
        if (cur) { if (cur.row.has_children && !cur.kids) this.expand(cur); else if (cur.kids) go(i + 1); }
        break;
      case "ArrowLeft": case "-":
        if (cur) { if (cur.kids) this.collapse(cur); else if (cur.parent) { this.select(cur.parent); this.reveal(cur.parent); } }
        break;
      case "Enter":
        if (cur) { this.toggle(cur); this.hooks.onActivate(cur); }
        break;
      default: return;
    }
    e.preventDefault();
  }

  /** Expanded keys whose rows are shown (every ancestor expanded): what the CSV exports. */
  shownExpanded() {
    const out = [];
    for (const e of this.rows) if (e.kids && e.row) out.push(e.row.key);
    return out;
  }

  /** The text of a row as Copy puts it on the clipboard: label and the visible values. */
  rowText(entry) {
    if (!entry || !entry.row) return "";
    const vals = this.columns.map((c) => (entry.row.text && entry.row.text[c.key]) ?? "");
    return [entry.row.label, ...vals].join("\t");
  }
}

function el(tag, cls) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  return e;
}
