// flame.js — the flame graph (Top-down) and icicle (Bottom-up, Flat) pane under the tree.
//
// The server lays the rectangles out for the canvas width (GET /api/db/{db}/flame): only
// what is at least a pixel wide travels. Clicking a rectangle zooms the graph to it and
// selects the same node in the tree (the keys are the tree's keys); selecting in the tree
// outlines the rectangle; Find highlights the rectangles whose name matches; on a comparison
// database (callpath diff) the rectangles are red where the delta is positive and blue where
// it is negative. Its state (shown or not, the zoom path) is dbState(db).flame, in the URL.

import { fmtNum } from "./numbers.js";
import { getJSON, stateQuery } from "./api.js";

const ROW = 17;

function warm(name) {
  let h = 2166136261;
  for (let i = 0; i < name.length; i++) { h ^= name.charCodeAt(i); h = Math.imul(h, 16777619); }
  const a = (h >>> 0) % 50, b = ((h >>> 8) & 255) / 255, c = ((h >>> 16) & 255) / 255;
  return `rgb(${205 + a},${Math.round(230 * b)},${Math.round(55 * c)})`;
}

function diffColor(v, scale) {
  if (v === null || v === undefined || !scale || v === 0) return "rgb(220,220,220)";
  const s = Math.min(1, Math.abs(v) / scale);
  const c = Math.round(220 - 190 * s);
  return v > 0 ? `rgb(235,${c},${c})` : `rgb(${c},${c},235)`;
}

export class FlamePane {
  /**
   * hooks: dbState() -> per-database state, save(), query() -> {db, vs, columns, sortKey},
   * reveal(keys) -> selects the node at the end of a key path in the tree.
   */
  constructor(host, hooks) {
    this.host = host;
    this.hooks = hooks;
    this.frame = null;
    this.selected = null;
    this.matches = null;
    this.seq = 0;
    host.innerHTML = `
      <div class="pane-bar flame-bar">
        <span class="flame-title"></span>
        <span class="spacer"></span>
        <input type="search" class="flame-find" placeholder="Find in graph" aria-label="find in the flame graph">
        <span class="flame-count muted"></span>
        <button type="button" class="flame-reset" title="show the whole view again">Reset zoom</button>
        <button type="button" class="flame-close" title="hide the flame graph" aria-label="close the flame graph">×</button>
      </div>
      <div class="flame-scroll"><canvas class="flame-canvas" aria-label="flame graph"></canvas><div class="flame-tip" hidden></div></div>`;
    this.canvas = host.querySelector("canvas");
    this.scroll = host.querySelector(".flame-scroll");
    this.tip = host.querySelector(".flame-tip");
    this.findBox = host.querySelector(".flame-find");
    host.dataset.pending = "0";
    this.findBox.addEventListener("input", () => { this.find(this.findBox.value); });
    host.querySelector(".flame-reset").onclick = () => { this.zoomTo([]); };
    host.querySelector(".flame-close").onclick = () => this.toggle(false);
    this.canvas.addEventListener("click", (e) => this.onClick(e));
    this.canvas.addEventListener("mousemove", (e) => this.onMove(e));
    this.canvas.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    new ResizeObserver(() => { if (this.shown() && this.frame && Math.abs(this.scroll.clientWidth - this.frame.width) > 8) this.refresh(); }).observe(this.scroll);
  }

  state() {
    const d = this.hooks.dbState();
    if (!d.flame || typeof d.flame !== "object") d.flame = { on: false, path: [] };
    const st = d.flame;
    if (!Array.isArray(st.path)) st.path = [];
    // the zoom of each view (node keys are a view's own: a Top-down key sent with
    // view=bottom-up was a 400, and the fallback dropped the Top-down zoom too); a link
    // with only "path" zooms the view it opens in
    if (!st.paths || typeof st.paths !== "object" || Array.isArray(st.paths)) {
      st.paths = {};
      if (st.path.length) st.paths[this.hooks.query().vs.view] = st.path;
    }
    return st;
  }

  /** The zoom path of the view shown. */
  zoomPath() {
    const p = this.state().paths[this.hooks.query().vs.view];
    return Array.isArray(p) ? p : [];
  }

  setZoomPath(path) {
    const st = this.state();
    st.paths[this.hooks.query().vs.view] = path;
    st.path = path;
  }

  shown() { return this.state().on && this.hooks.dbState().mode === "profile"; }

  toggle(on) {
    const st = this.state();
    st.on = on === undefined ? !st.on : on;
    this.hooks.save();
    this.refresh();
  }

  /** The width column: the sort column when it is a measured inclusive one other than the
   * first, else the "new" side of a comparison, else the first metric. */
  widthColumn(columns, sortKey) {
    const measured = columns.filter((c) => c.scope === "inclusive" && c.metric !== null);
    if (sortKey && sortKey !== "m0i" && measured.some((c) => c.key === sortKey)) return sortKey;
    const side = measured.find((c) => / \[new\] \(I\)$/.test(c.name));
    return side ? side.key : (measured[0] || {}).key || "m0i";
  }

  /** Draws the graph again (fetching it when the view changed); selected: the tree's
   *  selected key when it is known anew (a reload of the view). */
  async refresh(selected) {
    if (selected !== undefined) this.selected = selected;
    this.state();
    const btn = document.getElementById("tb-flame");
    if (btn) btn.setAttribute("aria-pressed", this.shown() ? "true" : "false");
    this.host.hidden = !this.shown();
    if (this.host.hidden) return;
    const q = this.hooks.query();
    const seq = ++this.seq;
    const width = Math.max(64, Math.floor(this.scroll.clientWidth || 800));
    const zoom = this.zoomPath();
    const root = zoom.length ? zoom[zoom.length - 1] : null;
    const column = this.widthColumn(q.columns, q.sortKey);
    this.host.dataset.pending = String(Number(this.host.dataset.pending) + 1);
    try {
      const query = stateQuery(q.vs, { width, column, node: root });
      let frame;
      try {
        frame = await getJSON(`/api/db/${q.db}/flame?${query}`, { quiet: !!root });
      } catch (e) {
        if (!root) throw e;
        this.setZoomPath([]);  // a stale zoom (another filter set): show the whole view
        this.hooks.save();
        frame = await getJSON(`/api/db/${q.db}/flame?${stateQuery(q.vs, { width, column })}`);
      }
      if (seq !== this.seq) return;
      this.frame = frame;
      this.view = q.vs.view;
      this.find(this.findBox.value);
    } catch (_) {
      /* the error bar shows it */
    } finally {
      this.host.dataset.pending = String(Number(this.host.dataset.pending) - 1);
    }
  }

  title() {
    const f = this.frame;
    const kind = this.view === "top-down" ? "Flame graph" : "Icicle";
    let t = `${kind} (${this.view}) — ${f.column_name}, ${f.key.length} rectangles`;
    if (f.color_name) t += ` — colour: ${f.color_name} (red more, blue less)`;
    return t;
  }

  /** Canvas geometry of rectangle i in CSS pixels. */
  box(i) {
    const f = this.frame;
    const depth = f.depth[i];
    const y = this.view === "top-down" ? (f.max_depth - depth) * ROW : depth * ROW;
    return { x: f.x[i] * f.width, y, w: Math.max(1, f.w[i] * f.width), h: ROW - 1 };
  }

  /** The rectangle of a node key in page coordinates (tests click through this). */
  rectOf(key) {
    if (!this.frame) return null;
    const i = this.frame.key.indexOf(key);
    if (i < 0) return null;
    const b = this.box(i);
    const r = this.canvas.getBoundingClientRect();
    return { x: r.left + b.x, y: r.top + b.y, w: b.w, h: b.h, index: i };
  }

  /**
   * The pane takes the graph's height, up to 65% of the profile area (at least 120 px): at
   * a fixed third of it, the deepest (hottest) frames of a deep graph lay beyond its top
   * edge while the tree above had empty rows.
   */
  fitHeight(h) {
    const area = this.host.parentElement ? this.host.parentElement.clientHeight : 0;
    if (!area) return;
    const title = this.host.querySelector(".flame-title");
    const want = h + (title ? title.parentElement.offsetHeight : 28) + 6;
    this.host.style.height = `${Math.max(120, Math.min(want, Math.floor(area * 0.65)))}px`;
  }

  draw() {
    const f = this.frame;
    if (!f) return;
    this.host.querySelector(".flame-title").textContent = this.title();
    const dpr = window.devicePixelRatio || 1;
    const h = (f.max_depth + 1) * ROW;
    this.canvas.style.width = `${f.width}px`;
    this.canvas.style.height = `${h}px`;
    this.canvas.width = Math.round(f.width * dpr);
    this.canvas.height = Math.round(h * dpr);
    this.fitHeight(h);
    const g = this.canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, f.width, h);
    g.font = "11px ui-monospace, 'DejaVu Sans Mono', monospace";
    g.textBaseline = "middle";
    let scale = 0;
    if (f.c) for (const v of f.c) if (v !== null) scale = Math.max(scale, Math.abs(v));
    const sel = this.selected ? f.key.indexOf(this.selected) : -1;
    for (let i = 0; i < f.key.length; i++) {
      const b = this.box(i);
      const hit = this.matches && this.matches.has(i);
      g.fillStyle = hit ? "rgb(230,0,230)" : f.c ? diffColor(f.c[i], scale) : warm(f.name[i]);
      if (this.matches && !hit) g.globalAlpha = 0.55;
      g.fillRect(b.x, b.y, b.w, b.h);
      g.globalAlpha = 1;
      if (b.w > 24) {
        g.fillStyle = "#000";
        const room = Math.floor((b.w - 6) / 6.6);
        const name = f.name[i];
        g.fillText(name.length <= room ? name : `${name.slice(0, Math.max(1, room - 2))}..`, b.x + 3, b.y + ROW / 2, b.w - 4);
      }
    }
    if (sel >= 0) {
      const b = this.box(sel);
      g.strokeStyle = "#000";
      g.lineWidth = 2;
      g.strokeRect(b.x + 1, b.y + 1, Math.max(1, b.w - 2), b.h - 2);
    }
    this.canvas.dataset.rects = String(f.key.length);
    this.canvas.dataset.root = f.node;
    this.canvas.dataset.selected = sel >= 0 ? f.key[sel] : "";
    if (this.view === "top-down") this.scroll.scrollTop = this.scroll.scrollHeight;
  }

  /** Highlights the rectangles whose name contains the text (case-insensitive). */
  find(text) {
    const f = this.frame;
    const count = this.host.querySelector(".flame-count");
    this.matches = null;
    count.textContent = "";
    if (f && text) {
      const t = text.toLowerCase();
      this.matches = new Set();
      for (let i = 0; i < f.name.length; i++) if (f.name[i].toLowerCase().includes(t)) this.matches.add(i);
      // the share of the whole: matched rectangles under no other matched one
      let share = 0;
      for (const i of this.matches) {
        let p = f.parent[i], covered = false;
        while (p >= 0 && !covered) { covered = this.matches.has(p); p = f.parent[p]; }
        if (!covered) share += f.w[i];
      }
      count.textContent = `${this.matches.size} match${this.matches.size === 1 ? "" : "es"} (${(100 * share).toFixed(1)}%)`;
      this.host.dataset.matches = String(this.matches.size);
    } else {
      this.host.dataset.matches = "0";
    }
    this.draw();
  }

  /** Outlines the tree's selected node. */
  highlight(key) {
    this.selected = key;
    if (this.shown() && this.frame) this.draw();
  }

  at(e) {
    const f = this.frame;
    if (!f) return -1;
    const r = this.canvas.getBoundingClientRect();
    const x = e.clientX - r.left, y = e.clientY - r.top;
    for (let i = f.key.length - 1; i >= 0; i--) {
      const b = this.box(i);
      if (x >= b.x && x < b.x + b.w && y >= b.y && y < b.y + ROW) return i;
    }
    return -1;
  }

  /** Keys from the frame's root (excluded) down to rectangle i. */
  chain(i) {
    const f = this.frame;
    const keys = [];
    for (let k = i; k > 0; k = f.parent[k]) keys.unshift(f.key[k]);
    return keys;
  }

  async zoomTo(path) {
    this.setZoomPath(path);
    this.hooks.save();
    await this.refresh();
  }

  async onClick(e) {
    const i = this.at(e);
    if (i < 0) return;
    const zoom = this.zoomPath();
    let path;
    if (i === 0) path = zoom.slice(0, -1);  // the root: one level out
    else path = [...zoom, ...this.chain(i)];
    const key = i === 0 ? null : this.frame.key[i];
    await this.zoomTo(path);
    if (key) {
      this.selected = key;
      await this.hooks.reveal(path);
      this.draw();
    }
  }

  onMove(e) {
    const i = this.at(e);
    if (i < 0) { this.tip.hidden = true; return; }
    const f = this.frame;
    const pct = f.total ? (100 * (f.value[i] || 0) / f.total).toFixed(2) : "0";
    let text = `${f.name[i]}\n${fmtNum(f.value[i] || 0)} (${pct}%)`;
    if (f.c) text += `\n${f.color_name}: ${fmtNum(f.c[i])}`;
    this.tip.textContent = text;
    this.tip.hidden = false;
    const r = this.scroll.getBoundingClientRect();
    this.tip.style.left = `${Math.min(e.clientX - r.left + 12, r.width - 260)}px`;
    this.tip.style.top = `${e.clientY - r.top + this.scroll.scrollTop + 14}px`;
  }
}
