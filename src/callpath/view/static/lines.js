// lines.js — the Lines tab (PerfVisS, seeds/003): the cost of every source line in every
// execution context, in linked panes: the compressed overview with its two rectangles, the
// ranked procedures, the detailed heat map beside the source listing and the sorted
// processor view (min/max bars), the 3-D profile (lines3d.js) and the assembler pane.
//
// The server aggregates everything (/api/db/{db}/lines/...); the page only draws the window on
// screen. One cursor — (row of the line axis, context) plus the selected procedure — lives in
// the per-database state (state.dbs[db].lines, kept in the URL) and every pane follows it.

import { fmtNum } from "./numbers.js";
import { getJSON } from "./api.js";
import { Surface3D } from "./lines3d.js";
import { heat, NO_COST } from "./heat.js";

export const LINE_DEFAULTS = {
  metric: 0, group: "none", start: 0, count: 40, norm: "program", skip: 50, bin: 4,
  reduce: "max", strip: 80, cbins: 32, ctop: false, n: 10, around: 2, row: null, ctx: null,
  proc: null, all: false,
};

/** The lines state of a database state object, with defaults filled in. */
export function linesState(d) {
  if (!d.lines || typeof d.lines !== "object") d.lines = {};
  for (const [k, v] of Object.entries(LINE_DEFAULTS)) if (!(k in d.lines)) d.lines[k] = v;
  return d.lines;
}

const css = (c) => `rgb(${c[0]},${c[1]},${c[2]})`;
const ink = (c) => (0.3 * c[0] + 0.59 * c[1] + 0.11 * c[2] > 140 ? "#000" : "#fff");

/** Short numbers for cells: 3 significant digits. */
export function fmt(v) {
  if (v === null || v === undefined) return "";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e5 || a < 1e-2) return v.toExponential(a < 1e-2 ? 1 : 2);
  return String(Number(v.toPrecision(3)));
}

function decodeU8(b64) {
  const bin = atob(b64);
  const u8 = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) u8[i] = bin.charCodeAt(i);
  return u8;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

const ROW_H = 18;

export class LinesView {
  /**
   * @param {object} hooks  dbState(db) -> the per-database state, save() (URL), info(db) ->
   *   the /api/databases entry, showTopDown(key) (opens the Top-down tree at a node key)
   */
  constructor(hooks) {
    this.hooks = hooks;
    this.host = document.getElementById("lines");
    this.db = null;
    this.meta = null;
    this.win = null;       // the last window document
    this.ov = null;        // the last overview document
    this.ranked = null;
    this.seq = 0;
    this.pending = 0;
    this.build();
    this.surface = new Surface3D(this.q("#ln-3d"));
    new ResizeObserver(() => { if (!this.host.hidden && this.ov) this.drawOverview(); }).observe(this.q("#ln-ov-wrap"));
  }

  q(sel) { return this.host.querySelector(sel); }
  get st() { return linesState(this.hooks.dbState(this.db)); }

  setPending(d) { this.pending += d; this.host.dataset.pending = String(this.pending); }

  async get(path, params, quiet = false) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined) q.set(k, String(v));
    this.setPending(1);
    try {
      return await getJSON(`/api/db/${this.db}/lines/${path}?${q}`, { quiet });
    } finally { this.setPending(-1); }
  }

  /** The matrix's parameters: metric, grouping and the Thread view's contexts (if any). */
  base() {
    const s = this.st;
    const threads = this.hooks.dbState(this.db).threads || [];
    return { metric: s.metric, group: s.group, threads: threads.length ? JSON.stringify(threads) : null };
  }
  ovParams() {
    const s = this.st;
    return { ...this.base(), skip: s.skip, bin: s.bin, reduce: s.reduce, strip: s.strip, cbins: s.cbins, ctop: s.ctop ? 1 : 0 };
  }

  // ---- DOM ---------------------------------------------------------------------------------

  build() {
    const h = this.host;
    h.innerHTML = `
<div class="toolbar" role="toolbar" aria-label="lines controls">
  <label class="inline">Metric <select id="ln-metric" aria-label="metric"></select></label>
  <label class="inline">Contexts <select id="ln-group" aria-label="grouping of contexts">
    <option value="none">each</option><option value="rank">threads of a rank summed</option>
    <option value="node">ranks of a node summed</option></select></label>
  <span class="sep"></span>
  <label class="inline" title="lines in the detailed view">Lines <input id="ln-count" type="number" min="1" max="400" aria-label="lines in the detailed view"></label>
  <label class="inline" title="normalise the colours to the hottest cell of the program or of the window">Normalise <select id="ln-norm" aria-label="normalise to">
    <option value="program">program</option><option value="window">window</option></select></label>
  <button type="button" id="ln-up" title="previous lines">▲</button>
  <button type="button" id="ln-down" title="next lines">▼</button>
  <span class="sep"></span>
  <span class="muted">Overview:</span>
  <label class="inline" title="skip runs of more than N lines without cost">skip &gt;<input id="ln-skip" type="number" min="0" aria-label="skip runs longer than"></label>
  <label class="inline" title="lines per bin">bin <input id="ln-bin" type="number" min="1" aria-label="lines per bin"></label>
  <label class="inline">by <select id="ln-reduce" aria-label="bin reduction"><option value="max">max</option><option value="sum">sum</option></select></label>
  <label class="inline" title="bins per strip">strip <input id="ln-strip" type="number" min="1" aria-label="bins per strip"></label>
  <label class="inline" title="at most this many context columns (contexts binned by max, or the highest contexts of each row)">cols ≤<input id="ln-cbins" type="number" min="1" aria-label="context columns in the overview"></label>
  <select id="ln-cmode" aria-label="how the overview compresses contexts" title="contexts beyond cols: binned by max, or the highest of each row ranked"><option value="bins">binned</option><option value="top">top</option></select>
  <span class="sep"></span>
  <label class="inline">Top <input id="ln-n" type="number" min="1" max="1000" aria-label="procedures ranked"></label>
  <label class="inline" title="assembler: lines around the selected one">asm ±<input id="ln-around" type="number" min="0" max="50" aria-label="assembler lines around"></label>
  <span id="ln-where" class="muted"></span>
</div>
<div class="ln-grid">
  <section class="ln-left" aria-label="overview and ranked procedures">
    <div class="ln-title">Overview <span id="ln-ov-info" class="muted"></span></div>
    <div id="ln-ov-wrap" class="ln-ov-wrap"><canvas id="ln-overview" aria-label="overview of every line"></canvas></div>
    <div class="ln-title">Ranked procedures</div>
    <div class="ln-ranked-wrap"><table id="ln-ranked" class="ln-ranked" aria-label="ranked procedures">
      <thead><tr id="ln-ranked-title" title="outline every listed procedure in the overview"><th>#</th><th>Procedure</th><th>File</th><th>Sum</th><th title="percent of the metric's total over all source lines (the Lines tab's total: costs without a line are not in it, so it can differ from a tree's % of the root)">% lines</th></tr></thead>
      <tbody></tbody></table></div>
  </section>
  <section class="ln-center" aria-label="detailed view">
    <div class="ln-title">Detail <span id="ln-win-info" class="muted"></span>
      <span class="spacer"></span><button type="button" id="ln-topdown" title="open the Top-down tree at the selected line's hottest calling context">Calling contexts ▸ Top-down</button></div>
    <div id="ln-detail" class="ln-detail" tabindex="0">
      <div class="ln-heads">
        <div class="ln-h-heat" id="ln-h-heat"></div><div class="ln-h-mm">min · max</div><div class="ln-h-src">Source</div>
      </div>
      <div class="ln-cols">
        <div id="ln-heat" class="ln-heat" role="grid" aria-label="heat map: lines by contexts"></div>
        <div id="ln-mm" class="ln-mm" aria-label="sorted processor view: minimum and maximum per line"></div>
        <div id="ln-src" class="ln-src" aria-label="source listing"></div>
      </div>
    </div>
  </section>
  <section class="ln-right" aria-label="3-D profile, assembler and calling contexts">
    <div class="ln-title">3-D profile <span class="muted">(drag to rotate, wheel to zoom)</span></div>
    <canvas id="ln-3d" class="ln-3d" aria-label="3-D profile of the window"></canvas>
    <div class="ln-title">Assembler <span id="ln-asm-info" class="muted"></span></div>
    <div id="ln-asm" class="ln-asm" aria-label="assembler"></div>
    <div class="ln-title">Calling contexts of the line</div>
    <ol id="ln-ctxs" class="ln-ctxs"></ol>
  </section>
</div>`;
    const num = (id, key, lo, hi) => {
      const inp = this.q(`#${id}`);
      inp.onchange = () => {
        let v = Math.round(Number(inp.value));
        if (!Number.isFinite(v)) v = LINE_DEFAULTS[key];
        v = Math.max(lo, Math.min(hi, v));
        inp.value = String(v);
        this.st[key] = v;
        this.hooks.save();
        if (key === "count") this.refreshWindow();
        else if (key === "n") this.refreshRanked();
        else if (key === "around") this.refreshAsm();
        else if (key === "cbins") { this.refreshOverview(); this.refreshWindow(); }
        else this.refreshOverview();
      };
    };
    num("ln-count", "count", 1, 400);
    num("ln-skip", "skip", 0, 1e9);
    num("ln-bin", "bin", 1, 1e6);
    num("ln-strip", "strip", 1, 1e6);
    num("ln-cbins", "cbins", 1, 4096);
    num("ln-n", "n", 1, 1000);
    num("ln-around", "around", 0, 50);
    this.q("#ln-cmode").onchange = (e) => { this.st.ctop = e.target.value === "top"; this.hooks.save(); this.refreshOverview(); };
    this.q("#ln-reduce").onchange = (e) => { this.st.reduce = e.target.value; this.hooks.save(); this.refreshOverview(); };
    this.q("#ln-norm").onchange = (e) => { this.st.norm = e.target.value; this.hooks.save(); this.drawWindow(); };
    const reopen = () => { const s = this.st; s.row = null; s.ctx = null; s.proc = null; s.all = false; s.start = 0; this.hooks.save(); this.open(this.db); };
    this.q("#ln-metric").onchange = (e) => { this.st.metric = Number(e.target.value); reopen(); };
    this.q("#ln-group").onchange = (e) => { this.st.group = e.target.value; reopen(); };
    this.q("#ln-up").onclick = () => this.moveWindow(this.st.start - this.st.count);
    this.q("#ln-down").onclick = () => this.moveWindow(this.st.start + this.st.count);
    this.q("#ln-topdown").onclick = () => this.toTopDown();
    this.q("#ln-ranked-title").onclick = () => { const s = this.st; s.all = !s.all; s.proc = null; this.hooks.save(); this.refreshRects(); this.drawRanked(); };
    this.q("#ln-ranked tbody").addEventListener("click", (e) => {
      const tr = e.target.closest("tr[data-start]");
      if (tr) this.selectProcedure(Number(tr.dataset.start), Number(tr.dataset.end), Number(tr.dataset.hot));
    });
    const pick = (e) => {
      const r = e.target.closest("[data-row]");
      if (!r) return;
      const c = e.target.closest("[data-ctx]");
      this.select(Number(r.dataset.row), c ? Number(c.dataset.ctx) : this.st.ctx);
    };
    for (const id of ["#ln-heat", "#ln-mm", "#ln-src"]) this.q(id).addEventListener("click", pick);
    // a double click on a cell: the Thread view of that column's contexts, in the Top-down
    // tree at the line's hottest calling context there (the selection's context, followed)
    this.q("#ln-heat").addEventListener("dblclick", (e) => {
      const r = e.target.closest("[data-row]");
      const c = e.target.closest("[data-ctx]");
      if (r && c) this.threadView(Number(r.dataset.row), Number(c.dataset.ctx), Number(c.dataset.ctxLast));
    });
    this.q("#ln-detail").addEventListener("keydown", (e) => {
      const s = this.st;
      if (s.row === null || !this.meta) return;
      if (e.key === "ArrowDown" || e.key === "ArrowUp") {
        e.preventDefault();
        const r = Math.max(0, Math.min(this.meta.rows - 1, s.row + (e.key === "ArrowDown" ? 1 : -1)));
        this.select(r, s.ctx, true);
      }
      if (e.key === "ArrowLeft" || e.key === "ArrowRight") {  // the cursor's context
        e.preventDefault();
        const n = this.meta.contexts.length;
        const c = s.ctx === null ? 0 : Math.max(0, Math.min(n - 1, s.ctx + (e.key === "ArrowRight" ? 1 : -1)));
        this.select(s.row, c);
      }
    });
    const ov = this.q("#ln-overview");
    ov.addEventListener("click", (e) => {
      const b = ov.getBoundingClientRect();
      const row = this.overviewRowAt(e.clientX - b.left, e.clientY - b.top);
      if (row !== null) this.jumpTo(row);
    });
    this.q("#ln-ctxs").addEventListener("click", (e) => {
      const li = e.target.closest("li[data-key]");
      if (li) this.hooks.showTopDown(li.dataset.key);
    });
  }

  syncInputs() {
    const s = this.st;
    const set = (id, v) => { this.q(`#${id}`).value = String(v); };
    set("ln-count", s.count); set("ln-skip", s.skip); set("ln-bin", s.bin); set("ln-strip", s.strip);
    set("ln-cbins", s.cbins); set("ln-n", s.n); set("ln-around", s.around);
    set("ln-reduce", s.reduce); set("ln-cmode", s.ctop ? "top" : "bins"); set("ln-norm", s.norm); set("ln-group", s.group);
    const sel = this.q("#ln-metric");
    const info = this.hooks.info(this.db);
    sel.innerHTML = "";
    for (const m of info.metrics) {
      const o = el("option", null, m.name);
      o.value = String(m.index);
      sel.appendChild(o);
    }
    sel.value = String(s.metric);
  }

  // ---- loading -----------------------------------------------------------------------------

  /** Shows database `db` at its saved lines state. */
  async open(db) {
    this.db = db;
    const seq = ++this.seq;
    const follow = this.pendingNode && this.pendingNode.db === db ? this.pendingNode : null;
    this.pendingNode = null;
    if (follow) {
      try { await this.showNode(db, follow.vs, follow.key, true); } catch (_) { /* no place on the axis */ }
      if (seq !== this.seq) return;
    }
    const fresh = !this.hooks.dbState(db).lines;  // a first visit: no saved lines state
    const s = this.st;
    const info = this.hooks.info(db);
    // a first visit opens on the metric that holds the time (GPUOP, CPUTIME...), not on
    // metric 0 (a GPU database's first metric is zero everywhere)
    if (fresh && Number.isInteger(info.open_metric)) s.metric = info.open_metric;
    if (!info.metrics.some((m) => m.index === s.metric)) s.metric = 0;
    this.syncInputs();
    let meta;
    try {
      meta = await this.get("meta", this.base());
    } catch (e) {
      if (seq === this.seq) this.clearPanes(e.message);
      return;
    }
    if (seq !== this.seq) return;
    this.meta = meta;
    this.host.dataset.db = String(db);
    s.start = Math.max(0, Math.min(s.start, Math.max(0, meta.rows - 1)));
    if (s.row !== null && s.row >= meta.rows) s.row = null;
    if (fresh && meta.hottest_row !== null && meta.hottest_row !== undefined) {
      s.row = meta.hottest_row;  // a first visit: start where the cost is
      s.start = Math.max(0, s.row - Math.floor(s.count / 3));
    }
    this.hooks.save();
    await Promise.all([this.refreshOverview(), this.refreshWindow(), this.refreshRanked(), this.refreshAsm(), this.refreshContexts()]);
  }

  clearPanes(msg) {
    for (const id of ["#ln-heat", "#ln-mm", "#ln-src", "#ln-asm", "#ln-ctxs"]) this.q(id).innerHTML = "";
    this.q("#ln-ranked tbody").innerHTML = "";
    this.q("#ln-asm").textContent = msg || "";
  }

  moveWindow(start) {
    if (!this.meta) return;
    const s = this.st;
    s.start = Math.max(0, Math.min(start, Math.max(0, this.meta.rows - s.count)));
    this.hooks.save();
    this.refreshWindow();
    this.refreshRects();
  }

  /** Moves the detailed view to show `row` (a third from its top) and selects it. */
  jumpTo(row) {
    const s = this.st;
    s.start = Math.max(0, Math.min(row - Math.floor(s.count / 3), Math.max(0, this.meta.rows - s.count)));
    this.select(row, s.ctx, false);
    this.refreshWindow();
  }

  /** The one cursor: a line (and a context); every pane follows. */
  select(row, ctx, follow = false) {
    const s = this.st;
    s.row = row;
    s.ctx = ctx === undefined ? null : ctx;
    s.proc = null;
    s.all = false;
    this.hooks.save();
    if (follow && (row < s.start || row >= s.start + s.count)) {
      s.start = Math.max(0, row < s.start ? row : row - s.count + 1);
      this.refreshWindow();
    } else {
      this.markSelection();
    }
    this.refreshRanked();
    this.refreshAsm();
    this.refreshContexts();
  }

  /** Moves the cursor's marks in the drawn window without rebuilding it (the cells under
   * the pointer stay the same elements: a double click still reaches its cell). */
  markSelection() {
    const s = this.st;
    if (!this.win) return;
    for (const box of ["#ln-heat", "#ln-mm", "#ln-src"]) {
      for (const r of this.q(box).children) {
        const on = Number(r.dataset.row) === s.row;
        r.classList.toggle("sel", on);
        if (r.classList.contains("ln-row")) {
          r.setAttribute("aria-selected", on ? "true" : "false");
          for (const c of r.children) {
            c.classList.toggle("cur", on && s.ctx !== null && Number(c.dataset.ctx) <= s.ctx && s.ctx <= Number(c.dataset.ctxLast));
          }
        }
      }
    }
    const d = this.q("#ln-detail");
    d.dataset.row = s.row === null ? "" : String(s.row);
    const selRow = this.win.rows.find((r) => r.row === s.row);
    this.q("#ln-where").textContent = selRow ? `${selRow.file_name}:${selRow.line}${s.ctx !== null && s.ctx !== undefined ? " · " + this.meta.contexts[s.ctx] : ""}` : "";
    this.surface.setData(this.win.rows.map((r) => r.values), this.surface.norm, this.win.rows.map((r) => r.row === s.row), this.win.rows.map((r) => r.sum === 0));
  }

  selectProcedure(start, end, hot) {
    const s = this.st;
    s.proc = [start, end];
    s.all = false;
    const row = Number.isFinite(hot) && hot >= start && hot <= end ? hot : start;
    s.row = row;
    s.start = Math.max(0, Math.min(start, Math.max(0, this.meta.rows - s.count)));
    this.hooks.save();
    this.refreshWindow();
    this.drawRanked();
    this.refreshAsm();
    this.refreshContexts();
  }

  async refreshWindow() {
    const s = this.st;
    const seq = this.seq;
    const doc = await this.get("window", { ...this.base(), start: s.start, count: s.count, cbins: s.cbins });
    if (seq !== this.seq) return;
    this.win = doc;
    this.drawWindow();
    this.refreshRects();
  }

  async refreshOverview() {
    const seq = this.seq;
    const doc = await this.get("overview", this.ovParams());
    if (seq !== this.seq) return;
    doc.grid = decodeU8(doc.levels);  // colour levels 0..255 (0: no cost)
    this.ov = doc;
    this.ov.rects = this.ov.rects || { window: [], procedures: [] };
    await this.refreshRects();
  }

  /** The rectangles: the detail window and the selected procedure(s), wrapped by the server
   * exactly as the overview's data. */
  async refreshRects() {
    if (!this.ov) return;
    const s = this.st;
    const segs = [[s.start, Math.min(this.meta.rows, s.start + s.count) - 1]];
    let procs = [];
    if (s.all && this.ranked) procs = this.ranked.procedures.map((p) => [p.first_row, p.last_row]);
    else if (s.proc) procs = [s.proc];
    else if (this.ranked && this.ranked.selected !== null && this.ranked.selected !== undefined) {
      const p = this.rankedList()[this.ranked.selected];
      if (p) procs = [[p.first_row, p.last_row]];
    }
    const seq = this.seq;
    // Calls overlap (a selection, then the ranked list's answer): only the latest draws, or a
    // late answer computed without the selected procedure would take its outline away.
    const mine = (this.rectsSeq = (this.rectsSeq || 0) + 1);
    const doc = await this.get("rects", { ...this.ovParams(), segments: JSON.stringify([...segs, ...procs]) });
    if (seq !== this.seq || mine !== this.rectsSeq || !this.ov) return;
    this.ov.rects = { window: doc.rects[0], procedures: doc.rects.slice(1) };
    this.drawOverview();
  }

  async refreshRanked() {
    const s = this.st;
    const seq = this.seq;
    const doc = await this.get("ranked", { ...this.base(), n: s.n, row: s.row });
    if (seq !== this.seq) return;
    this.ranked = doc;
    this.drawRanked();
    this.refreshRects();
  }

  async refreshAsm() {
    const s = this.st;
    const box = this.q("#ln-asm");
    const info = this.q("#ln-asm-info");
    if (s.row === null) { box.textContent = "Select a line to see its instructions."; info.textContent = ""; return; }
    const seq = this.seq;
    let doc;
    try {
      doc = await this.get("asm", { ...this.base(), row: s.row, around: s.around }, true);
    } catch (e) {
      if (seq === this.seq) { box.textContent = e.message; box.dataset.state = "error"; }
      return;
    }
    if (seq !== this.seq) return;
    this.drawAsm(doc);
  }

  async refreshContexts() {
    const s = this.st;
    const list = this.q("#ln-ctxs");
    if (s.row === null) { list.innerHTML = ""; return; }
    const seq = this.seq;
    let doc;
    try { doc = await this.get("contexts", { ...this.base(), row: s.row }, true); } catch (_) { return; }
    if (seq !== this.seq) return;
    this.ctxNodes = doc.nodes;
    list.innerHTML = "";
    for (const n of doc.nodes.slice(0, 20)) {
      const li = el("li", null, `${n.path} — ${fmt(n.value)}`);
      li.dataset.key = n.key;
      li.title = "open in the Top-down tree";
      list.appendChild(li);
    }
    if (!doc.nodes.length) list.appendChild(el("li", "muted", "no calling context has cost on this line"));
  }

  async threadView(row, first, last) {
    const idx = [];
    for (let c = first; c <= last; c++) idx.push(...(this.meta.context_index[c] || []));
    if (!idx.length) return;
    const d = this.hooks.dbState(this.db);
    d.threads = [...new Set(idx)].sort((a, b) => a - b);
    this.hooks.save();
    let doc = null;
    try { doc = await this.get("contexts", { ...this.base(), row }, true); } catch (_) { doc = null; }
    if (doc && doc.nodes.length) this.hooks.showTopDown(doc.nodes[0].key);
    else this.open(this.db);  // no calling context of the line: the Lines tab, restricted
  }

  toTopDown() {
    const nodes = this.ctxNodes || [];
    if (nodes.length) this.hooks.showTopDown(nodes[0].key);
  }

  /** A scope selected in a tree: the Lines tab goes there when it is next shown (the one
   * cursor every pane follows). Scopes without a source file leave it where it is. */
  follow(db, vs, row) {
    if (!row || !row.file || row.key === "r") return;
    this.pendingNode = { db, vs, key: row.key };
  }

  /** From a scope of any tree (its key in that view) to the Lines tab at its line. */
  async showNode(db, vs, key, quiet = false) {
    this.db = db;
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(vs)) {
      if (v === null || v === undefined) continue;
      if (Array.isArray(v) && !v.length) continue;
      q.set(k, typeof v === "string" ? v : typeof v === "number" ? String(v) : JSON.stringify(v));
    }
    const s = this.st;
    q.set("metric", String(s.metric)); q.set("group", s.group); q.set("node", key);
    const doc = await getJSON(`/api/db/${db}/lines/locate?${q}`, { quiet });
    s.row = doc.row;
    s.ctx = null;
    s.all = false;
    s.proc = doc.procedure ? [doc.procedure.first_row, doc.procedure.last_row] : null;
    s.start = Math.max(0, doc.row - Math.floor(s.count / 3));
    return doc;
  }

  // ---- drawing -------------------------------------------------------------------------------

  drawWindow() {
    const doc = this.win;
    if (!doc || !this.meta) return;
    const s = this.st;
    const heatBox = this.q("#ln-heat"), mmBox = this.q("#ln-mm"), srcBox = this.q("#ln-src");
    const norm = s.norm === "window" ? doc.max_window : this.meta.max;
    const cols = doc.columns;
    const n = cols.length;
    // columns as wide as the pane allows beside the min/max bars and the listing (6..52 px);
    // values printed where they fit, else in the cell's tooltip
    const avail = this.q("#ln-detail").clientWidth - 250 - 360;  // the listing keeps 360 px
    const cw = Math.max(6, Math.min(52, Math.floor(avail / Math.max(1, n))));
    const head = this.q("#ln-h-heat");
    // narrow columns (32+ contexts) cannot each hold a heading: one heading every `every`
    // columns, drawn over the empty headings to its right, so that the axis stays readable
    // (about 6.5 px a character at the headings' 10 px; a heading that would run past the
    // last column into "min · max" is left out)
    const longest = Math.max(1, ...cols.map((c) => String(c.short).length));
    const need = longest * 6.5 + 8;
    const every = cw < 34 ? Math.max(1, Math.ceil(need / cw)) : 1;
    head.replaceChildren(...cols.map((c, i) => {
      const fits = every === 1 || (i % every === 0 && i * cw + need <= n * cw);
      const d = el("div", "ln-hcell", fits ? c.short : "");
      d.title = c.label;
      return d;
    }));
    for (const box of [head, heatBox]) {
      box.style.setProperty("--nctx", String(n));
      box.style.setProperty("--cw", `${cw}px`);
      box.classList.toggle("narrow", cw < 34);
    }
    const fh = document.createDocumentFragment(), fm = document.createDocumentFragment(), fs = document.createDocumentFragment();
    let mmMax = 0;
    for (const r of doc.rows) mmMax = Math.max(mmMax, r.max || 0);
    let prevFile = null;
    let firstRow = true;
    for (const r of doc.rows) {
      const selRow = r.row === s.row;
      const newFile = prevFile !== null && r.file !== prevFile;  // a file boundary inside the window
      prevFile = r.file;
      const hr = el("div", "ln-row" + (selRow ? " sel" : "") + (r.sum === 0 ? " zero" : "") + (newFile ? " newfile" : ""));
      hr.dataset.row = String(r.row);
      hr.setAttribute("role", "row");
      hr.setAttribute("aria-selected", selRow ? "true" : "false");
      for (let c = 0; c < n; c++) {
        const v = r.values[c];
        const col = r.sum === 0 ? NO_COST : heat(norm > 0 ? v / norm : 0);
        const cell = el("div", "ln-cell" + (selRow && s.ctx !== null && cols[c].first <= s.ctx && s.ctx <= cols[c].last ? " cur" : ""), fmt(v));
        cell.setAttribute("role", "gridcell");
        cell.style.background = css(col);
        cell.style.color = ink(col);
        cell.dataset.ctx = String(cols[c].first);
        cell.dataset.ctxLast = String(cols[c].last);
        cell.title = `${cols[c].label}${doc.binned ? " (max)" : ""}: ${Number.isInteger(v) ? v : fmtNum(v)}`;
        cell.dataset.value = String(v);  // the exact value (the tooltip is rounded)
        hr.appendChild(cell);
      }
      fh.appendChild(hr);
      // sorted processor view: dark bar = min, light bar = max - min, labels of both
      const mr = el("div", "ln-mmrow" + (selRow ? " sel" : "") + (newFile ? " newfile" : ""));
      mr.dataset.row = String(r.row);
      if (r.sum !== 0) {
        const bar = el("div", "ln-bar");
        const w = (v) => `${mmMax > 0 ? (100 * v) / mmMax : 0}%`;
        const dark = el("span", "ln-bar-min"); dark.style.width = w(r.min);
        const light = el("span", "ln-bar-span"); light.style.width = w(r.max - r.min);
        bar.append(dark, light);
        const lab = el("span", "ln-mmtext", `min ${fmt(r.min)}(${r.min_short}) max ${fmt(r.max)}(${r.max_short}) μ ${fmt(r.mean)} σ ${fmt(r.stdev)}`);
        lab.title = `min ${fmtNum(r.min)} in ${r.min_context}, max ${fmtNum(r.max)} in ${r.max_context}, mean ${fmtNum(r.mean)}, stdev ${fmtNum(r.stdev)}`;
        mr.append(bar, lab);
        mr.dataset.min = String(r.min); mr.dataset.max = String(r.max);
        mr.dataset.minContext = r.min_context; mr.dataset.maxContext = r.max_context;
        mr.dataset.mean = String(r.mean); mr.dataset.stdev = String(r.stdev);
      }
      fm.appendChild(mr);
      const noText = r.text === null || r.text === undefined;
      const sr = el("div", "ln-srow" + (selRow ? " sel" : "") + (noText ? " gap" : "") + (newFile ? " newfile" : ""));
      sr.dataset.row = String(r.row);
      sr.append(el("span", "ln-ln", r.line ? String(r.line) : ""),
                el("span", "ln-tx", !noText ? r.text : (r.gap_before ? `(source not available; ${r.gap_before} line${r.gap_before > 1 ? "s" : ""} not in the database before)` : "(source not available)")));
      sr.title = `${r.file}:${r.line}${r.procedure ? "  in " + r.procedure : ""}\n${sr.lastChild.textContent}`;
      if (newFile) sr.dataset.file = r.file_name;
      sr.firstChild.title = r.file;
      // the file's name where the listing enters a file (and on its first row): rows that
      // jump between files showed line numbers of no visible file
      if ((newFile || firstRow) && r.file_name) {
        const f = el("span", "ln-fname", r.file_name);
        f.title = r.file;
        sr.insertBefore(f, sr.lastChild);
      }
      if (r.launch) {  // GPU time has no line of its own: it is counted where it was launched
        const g = el("span", "ln-launch", "launch line");
        g.title = "GPU kernels and copies launched here: their GPU time, which has no source line of its own, is counted on this line";
        sr.insertBefore(g, sr.lastChild);
        sr.title += "\n(launch line: the GPU time of what this line launched is counted on it)";
      }
      firstRow = false;
      fs.appendChild(sr);
    }
    heatBox.replaceChildren(fh); mmBox.replaceChildren(fm); srcBox.replaceChildren(fs);
    const first = doc.rows[0], last = doc.rows[doc.rows.length - 1];
    this.q("#ln-win-info").textContent = first
      ? `${first.file_name}:${first.line} … ${last.file_name}:${last.line}  (rows ${doc.start}–${doc.start + doc.rows.length - 1} of ${this.meta.rows}; colours: hottest of the ${s.norm} = ${fmt(norm)})`
      : "";
    const d = this.q("#ln-detail");
    d.dataset.start = String(doc.start);
    d.dataset.count = String(doc.rows.length);
    d.dataset.norm = s.norm;
    d.dataset.row = s.row === null ? "" : String(s.row);
    const selRow = doc.rows.find((r) => r.row === s.row);
    this.q("#ln-where").textContent = selRow ? `${selRow.file_name}:${selRow.line}${s.ctx !== null && s.ctx !== undefined ? " · " + this.meta.contexts[s.ctx] : ""}` : "";
    this.surface.setData(doc.rows.map((r) => r.values), norm, doc.rows.map((r) => r.row === s.row), doc.rows.map((r) => r.sum === 0));
  }

  rankedList() {
    if (!this.ranked) return [];
    const list = [...this.ranked.procedures];
    if (this.ranked.extra) list.push(this.ranked.extra);
    return list;
  }

  drawRanked() {
    const body = this.q("#ln-ranked tbody");
    body.innerHTML = "";
    const s = this.st;
    const list = this.rankedList();
    this.q("#ln-ranked").classList.toggle("all", !!s.all);
    list.forEach((p, i) => {
      const tr = el("tr");
      tr.dataset.start = String(p.first_row);
      tr.dataset.end = String(p.last_row);
      tr.dataset.hot = String(p.hot_row ?? p.first_row);
      tr.dataset.procedure = p.procedure;
      const chosen = s.proc ? (s.proc[0] === p.first_row && s.proc[1] === p.last_row)
        : (this.ranked.selected === i);
      if (chosen) tr.classList.add("sel");
      tr.setAttribute("aria-selected", chosen ? "true" : "false");
      if (this.ranked.extra && i === list.length - 1) tr.classList.add("appended");
      // ranks count from 1 as a person counts; the name and file cells are narrow: their
      // whole text is in their tooltips
      const rank = Number.isInteger(p.rank) ? p.rank + 1 : p.rank;
      for (const t of [rank, p.procedure, p.file_name || p.file, fmt(p.sum), p.percent.toFixed(1)]) {
        const td = el("td", null, String(t));
        td.title = String(t);
        tr.appendChild(td);
      }
      tr.title = `${p.file}: rows ${p.first_row}–${p.last_row}`;
      body.appendChild(tr);
    });
  }

  /** Overview geometry: strips side by side, `cols` context columns each, L bins high. */
  geometry() {
    const ov = this.ov;
    const canvas = this.q("#ln-overview");
    const wrap = this.q("#ln-ov-wrap");
    const S = Math.max(1, ov.strips), C = Math.max(1, ov.columns), L = ov.strip;
    const gap = 3;
    const avail = Math.max(60, wrap.clientWidth - 4);
    const cw = Math.max(1, Math.floor((avail - gap * (S - 1)) / (S * C)));
    const sw = cw * C;
    const width = S * sw + gap * (S - 1);
    const height = Math.max(60, wrap.clientHeight - 4);
    const bh = height / Math.max(1, Math.min(L, ov.bins));  // one short strip fills the height
    return { canvas, S, C, L, gap, cw, sw, width, height, bh };
  }

  drawOverview() {
    const ov = this.ov;
    if (!ov) return;
    const g = this.geometry();
    const { canvas, C, L, gap, cw, sw, bh } = g;
    canvas.width = g.width; canvas.height = Math.ceil(g.height);
    canvas.style.width = `${g.width}px`; canvas.style.height = `${Math.ceil(g.height)}px`;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    // the data as one image (a pixel per bin and column, strips side by side), built once per
    // overview; each strip is then scaled into place without smoothing
    const img = this.overviewImage(C, L);
    ctx.imageSmoothingEnabled = false;
    for (let strip = 0; strip < g.S; strip++) {
      ctx.drawImage(img, strip * C, 0, C, L, strip * (sw + gap), 0, sw, L * bh);
    }
    // a rectangle per piece (the server cut it at strip ends): a dark halo under the colour
    // keeps it visible over any heat colour
    const rect = (pieces, colour, width) => {
      for (const [w, c] of [[width + 2, "rgba(0,0,0,0.85)"], [width, colour]]) {
        ctx.strokeStyle = c; ctx.lineWidth = w;
        for (const [strip, first, rows] of pieces) {
          ctx.strokeRect(strip * (sw + gap) + 1, first * bh + 1, sw - 2, Math.max(2, rows * bh - 2));
        }
      }
    };
    for (const p of ov.rects.procedures) rect(p, "#ffee00", 2);
    rect(ov.rects.window || [], "#c8961e", 2);
    canvas.dataset.bins = String(ov.bins);
    canvas.dataset.strips = String(ov.strips);
    canvas.dataset.window = JSON.stringify(ov.rects.window || []);
    canvas.dataset.procedures = JSON.stringify(ov.rects.procedures);
    canvas.dataset.geometry = JSON.stringify({ sw, gap, bh, cw });
    this.q("#ln-ov-info").textContent = `${ov.rows} lines → ${ov.kept} kept → ${ov.bins} bins of ${ov.bin} (${ov.reduce}) in ${ov.strips} strips of ${L}; ${ov.contexts} contexts in ${C} columns${ov.top ? " (the highest of each row, ranked)" : ""}`;
  }

  /** The overview's colours as a canvas of (strips × columns) × L pixels, cached. */
  overviewImage(C, L) {
    const ov = this.ov;
    if (ov.image) return ov.image;
    const S = Math.max(1, ov.strips);
    const off = document.createElement("canvas");
    off.width = S * C; off.height = L;
    const data = new ImageData(S * C, L);
    const px = data.data;
    const lut = [];
    for (let k = 0; k <= 255; k++) lut.push(heat(k / 255));
    const grid = ov.grid;
    for (let b = 0; b < ov.bins; b++) {
      const strip = Math.floor(b / L), y = b % L;
      let any = false;
      for (let c = 0; c < C; c++) if (grid[b * C + c] !== 0) { any = true; break; }
      for (let c = 0; c < C; c++) {
        const col = any ? lut[grid[b * C + c]] : NO_COST;
        const o = 4 * (y * S * C + strip * C + c);
        px[o] = col[0]; px[o + 1] = col[1]; px[o + 2] = col[2]; px[o + 3] = 255;
      }
    }
    off.getContext("2d").putImageData(data, 0, 0);
    ov.image = off;
    return off;
  }

  /** Pixel → original line: the inverse map the server sent (first row of each bin). */
  overviewRowAt(x, y) {
    const ov = this.ov;
    if (!ov) return null;
    const g = this.geometry();
    const strip = Math.floor(x / (g.sw + g.gap));
    if (x - strip * (g.sw + g.gap) >= g.sw) return null;  // in the gap
    const b = strip * g.L + Math.floor(y / g.bh);
    if (strip < 0 || b < 0 || b >= ov.bins || Math.floor(y / g.bh) >= g.L) return null;
    return ov.bin_row[b];
  }

  drawAsm(doc) {
    const box = this.q("#ln-asm");
    const info = this.q("#ln-asm-info");
    box.innerHTML = "";
    info.textContent = doc.file ? `${doc.file_name}:${doc.line} ±${doc.around}` : "";
    if (doc.error) {
      box.dataset.state = "unavailable";
      box.appendChild(el("div", "ln-asm-msg", doc.error));
      return;
    }
    box.dataset.state = doc.instructions.length ? "ok" : "empty";
    if (!doc.instructions.length) { box.appendChild(el("div", "ln-asm-msg", "no instruction of the load module maps to these lines")); return; }
    if (doc.note) box.appendChild(el("div", "ln-asm-msg", doc.note));
    const t = el("table", "ln-asm-table");
    let last = null;
    for (const ins of doc.instructions) {
      if (ins.line !== last) {
        const tr = el("tr", "ln-asm-line" + (ins.line === doc.line ? " sel" : ""));
        const td = el("td", null, `line ${ins.line}${ins.function ? "  " + ins.function : ""}`);
        td.colSpan = 3;
        tr.appendChild(td);
        t.appendChild(tr);
        last = ins.line;
      }
      const tr = el("tr", "ln-ins" + (ins.line === doc.line ? " sel" : ""));
      tr.dataset.address = ins.address;
      tr.append(el("td", "ln-addr", ins.address), el("td", "ln-code", ins.text), el("td", "ln-cost", ins.cost === null ? "" : fmt(ins.cost)));
      t.appendChild(tr);
    }
    box.appendChild(t);
  }
}
