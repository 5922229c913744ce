// trace.js — the time-centric view: execution contexts × time, each pixel coloured by the
// procedure at the chosen call-path depth. The server sends exactly one sample per (context
// row, pixel column), so a frame costs the same for any trace length; this module only asks
// for canvas-width × visible-rows samples and paints them.

import { api } from "./api.js";
import { publish } from "./store.js";
import { shortLabels } from "./plot.js";

const assigned = new Map();  // name -> colour, for the page's lifetime

/**
 * A colour per procedure name: an FNV-1a hash picks hue, saturation and lightness, so a
 * name keeps its colour across sessions as long as no other procedure seen first took a
 * near one; a colour too close to one already given (two procedures looked alike in the
 * trace) is moved round the hue circle by the golden angle until it stands apart. The
 * same name gets the same colour everywhere on the page (canvas, legends, call path).
 */
export function colourOf(name) {
  const hit = assigned.get(name);
  if (hit) return hit;
  let h = 0x811c9dc5;
  for (let i = 0; i < name.length; i++) { h ^= name.charCodeAt(i); h = Math.imul(h, 0x01000193) >>> 0; }
  let hue = h % 360;
  const sat = 55 + ((h >>> 9) % 30);
  const lig = 42 + ((h >>> 17) % 22);
  let rgb = hslToRgb(hue / 360, sat / 100, lig / 100);
  const near = (c) => { for (const o of assigned.values()) if (Math.hypot(c[0] - o[0], c[1] - o[1], c[2] - o[2]) < 48) return true; return false; };
  for (let k = 0; k < 16 && assigned.size < 200 && near(rgb); k++) {
    hue = (hue + 137.508) % 360;
    rgb = hslToRgb(hue / 360, sat / 100, lig / 100);
  }
  assigned.set(name, rgb);
  return rgb;
}

function hslToRgb(h, s, l) {
  const f = (n) => {
    const k = (n + h * 12) % 12;
    const a = s * Math.min(l, 1 - l);
    return Math.round(255 * (l - a * Math.max(-1, Math.min(k - 3, 9 - k, 1))));
  };
  return [f(0), f(8), f(4)];
}

const css = (rgb) => `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;

function decodeGrid(b64) {
  const bin = atob(b64);
  const buf = new ArrayBuffer(bin.length);
  const u8 = new Uint8Array(buf);
  for (let i = 0; i < bin.length; i++) u8[i] = bin.charCodeAt(i);
  return new Int32Array(buf); // little-endian on every browser platform in use
}

/** Sizes a canvas's backing store to its CSS size times the screen's pixel density, so that
 *  lines and text stay sharp on high-density screens; returns the 2-D context drawing in CSS
 *  pixels, and the CSS size. */
export function hiDpi(canvas) {
  const dpr = Math.max(1, window.devicePixelRatio || 1);
  const cw = Math.max(1, canvas.clientWidth), ch = Math.max(1, canvas.clientHeight);
  const bw = Math.round(cw * dpr), bh = Math.round(ch * dpr);
  if (canvas.width !== bw) canvas.width = bw;
  if (canvas.height !== bh) canvas.height = bh;
  const g = canvas.getContext("2d");
  g.setTransform(bw / cw, 0, 0, bh / ch, 0, 0);
  canvas.dataset.dpr = String(dpr);
  return { g, cw, ch };
}

/** "Nice" tick steps (1, 2, 5 × 10^k ns) for a time ruler. */
export function tickStep(span, maxTicks) {
  const raw = span / Math.max(1, maxTicks);
  const p = 10 ** Math.floor(Math.log10(Math.max(raw, 1e-9)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

/** A tick label in the unit of the step (so that all labels of a ruler share one unit). */
export function fmtTick(ns, step) {
  const units = [[1e9, "s"], [1e6, "ms"], [1e3, "µs"], [1, "ns"]];
  const [div, unit] = units.find(([d]) => step >= d) || units[3];
  const digits = Math.max(0, Math.ceil(-Math.log10(step / div) - 1e-9));
  return `${(ns / div).toFixed(Math.min(digits, 6))} ${unit}`;
}

/** Paints a procedure grid (H×W) into a canvas, stretched to its CSS size without smoothing. */
function paintGrid(canvas, grid, W, H, procs) {
  const { g, cw, ch } = hiDpi(canvas);
  g.fillStyle = "#fff"; g.fillRect(0, 0, cw, ch);
  if (!W || !H) return;
  const colours = procs.map(colourOf);
  const img = new ImageData(W, H);
  const px = img.data;
  for (let i = 0; i < W * H; i++) {
    const p = grid[i];
    const o = i * 4;
    if (p < 0 || p >= colours.length) { px[o] = px[o + 1] = px[o + 2] = 255; px[o + 3] = 255; continue; }
    const c = colours[p];
    px[o] = c[0]; px[o + 1] = c[1]; px[o + 2] = c[2]; px[o + 3] = 255;
  }
  const off = document.createElement("canvas");
  off.width = W; off.height = H;
  off.getContext("2d").putImageData(img, 0, 0);
  g.imageSmoothingEnabled = false;
  g.drawImage(off, 0, 0, cw, ch);
}

export class TraceView {
  /** onState(traceState) is called when the visible window changes (kept in the URL);
   *  onShowNode(key) opens the Top-down tree at a sample's calling context. The view
   *  publishes "trace:painted" after each frame and "trace:point" where the pointer rests
   *  (store.js): marks drawn over the trace (notes, shared sessions) subscribe to them. */
  constructor(onState, onShowNode) {
    this.onState = onState;
    this.onShowNode = onShowNode;
    this.canvas = document.getElementById("tr-canvas");
    this.depthCanvas = document.getElementById("tr-depthview");
    this.summaryCanvas = document.getElementById("tr-summary");
    this.mini = document.getElementById("tr-minimap");
    this.rubber = document.getElementById("tr-rubber");
    this.depthInput = document.getElementById("tr-depth");
    this.db = null;
    this.meta = null;
    this.win = null;       // {t0, t1, c0, c1}
    this.undo = [];
    this.frame = null;
    this.cursor = null;    // {ctx, t}
    this.aborts = {};
    // the time ruler above the trace (its units follow the zoom: s, ms, µs, ns)
    this.ruler = document.createElement("canvas");
    this.ruler.id = "tr-ruler";
    this.ruler.className = "tr-ruler";
    this.ruler.setAttribute("aria-label", "time ruler");
    this.canvas.parentElement.before(this.ruler);
    this.wire();
    new ResizeObserver(() => { if (this.meta && !document.getElementById("trace").hidden) this.refresh(); }).observe(this.canvas.parentElement);
  }

  wire() {
    const $ = (id) => document.getElementById(id);
    $("tr-home").onclick = () => { this.cursor = null; this.setWin(this.home()); };
    $("tr-undo").onclick = () => { const w = this.undo.pop(); if (w) this.setWin(w, false); };
    $("tr-zin").onclick = () => this.zoomTime(0.5);
    $("tr-zout").onclick = () => this.zoomTime(2);
    $("tr-left").onclick = () => this.panTime(-0.25);
    $("tr-right").onclick = () => this.panTime(0.25);
    $("tr-up").onclick = () => this.panCtx(-0.5);
    $("tr-down").onclick = () => this.panCtx(0.5);
    this.depthInput.onchange = () => {
      const d = Math.max(0, Math.min(this.meta ? this.meta.max_depth : 0, Number(this.depthInput.value) || 0));
      this.depthInput.value = String(d);
      this.depth = d;
      this.refresh();
    };
    let drag = null;
    this.canvas.addEventListener("mousedown", (e) => {
      const b = this.canvas.getBoundingClientRect();
      drag = { x: e.clientX - b.left, y: e.clientY - b.top, pan: e.shiftKey || e.button === 1, win: { ...this.win } };
      e.preventDefault();
    });
    window.addEventListener("mousemove", (e) => {
      const b = this.canvas.getBoundingClientRect();
      const x = e.clientX - b.left, y = e.clientY - b.top;
      if (!drag) { if (x >= 0 && y >= 0 && x < b.width && y < b.height) this.hover(x, y); return; }
      if (drag.pan) {
        const dt = ((drag.x - x) / b.width) * (drag.win.t1 - drag.win.t0);
        const dc = Math.round(((drag.y - y) / b.height) * (drag.win.c1 - drag.win.c0));
        this.win = this.clamp({ t0: drag.win.t0 + dt, t1: drag.win.t1 + dt, c0: drag.win.c0 + dc, c1: drag.win.c1 + dc });
        this.refreshSoon();
        return;
      }
      Object.assign(this.rubber.style, { left: `${Math.min(x, drag.x)}px`, top: `${Math.min(y, drag.y)}px`, width: `${Math.abs(x - drag.x)}px`, height: `${Math.abs(y - drag.y)}px` });
      this.rubber.hidden = false;
    });
    window.addEventListener("mouseup", (e) => {
      if (!drag) return;
      const d = drag; drag = null;
      this.rubber.hidden = true;
      const b = this.canvas.getBoundingClientRect();
      const x = e.clientX - b.left, y = e.clientY - b.top;
      if (d.pan) { this.undo.push(d.win); this.changed(); return; }
      if (Math.abs(x - d.x) < 4 && Math.abs(y - d.y) < 4) { this.pick(x, y); return; }
      const w = this.win;
      const tA = w.t0 + (Math.min(x, d.x) / b.width) * (w.t1 - w.t0);
      const tB = w.t0 + (Math.max(x, d.x) / b.width) * (w.t1 - w.t0);
      const n = w.c1 - w.c0;
      let cA = w.c0 + Math.floor((Math.min(y, d.y) / b.height) * n);
      let cB = w.c0 + Math.ceil((Math.max(y, d.y) / b.height) * n);
      if (Math.abs(y - d.y) < 4) { cA = w.c0; cB = w.c1; }
      this.setWin({ t0: tA, t1: Math.max(tB, tA + 1), c0: cA, c1: Math.max(cB, cA + 1) });
    });
    this.canvas.addEventListener("wheel", (e) => {
      e.preventDefault();
      const b = this.canvas.getBoundingClientRect();
      this.zoomTime(e.deltaY < 0 ? 0.8 : 1.25, (e.clientX - b.left) / b.width);
    }, { passive: false });
    this.mini.addEventListener("click", (e) => {
      if (!this.meta) return;
      const b = this.mini.getBoundingClientRect();
      const fx = (e.clientX - b.left) / b.width, fy = (e.clientY - b.top) / b.height;
      const w = this.win, h = this.home();
      const tc = h.t0 + fx * (h.t1 - h.t0), cc = h.c0 + fy * (h.c1 - h.c0);
      const dt = (w.t1 - w.t0) / 2, dc = (w.c1 - w.c0) / 2;
      this.setWin({ t0: tc - dt, t1: tc + dt, c0: Math.round(cc - dc), c1: Math.round(cc + dc) });
    });
  }

  home() { return { t0: this.meta.t0, t1: this.meta.t1, c0: 0, c1: this.meta.contexts.length }; }

  clamp(w) {
    const h = this.home();
    let { t0, t1, c0, c1 } = w;
    const span = Math.min(t1 - t0, h.t1 - h.t0);
    if (t0 < h.t0) { t0 = h.t0; t1 = t0 + span; }
    if (t1 > h.t1) { t1 = h.t1; t0 = t1 - span; }
    const n = Math.min(Math.max(1, c1 - c0), h.c1);
    c0 = Math.max(0, Math.min(c0, h.c1 - n));
    return { t0, t1: Math.max(t1, t0 + 1), c0, c1: c0 + n };
  }

  /** Takes a window (and, with depth, its depth) that came from elsewhere: a shared
   *  session, a linked window, a note. False when this database's trace is not open. */
  adopt(saved, db, { depth = true } = {}) {
    if (!this.meta || this.db !== db || !saved) return false;
    this.win = this.clamp({ ...this.home(), ...saved });
    if (depth && Number.isInteger(saved.depth)) {
      this.depth = Math.min(saved.depth, this.meta.max_depth);
      this.depthInput.value = String(this.depth);
    }
    return true;
  }

  setWin(w, push = true) {
    if (push && this.win) this.undo.push({ ...this.win });
    if (this.undo.length > 100) this.undo.shift();
    this.win = this.clamp(w);
    this.changed();
  }

  changed() {
    this.onState({ ...this.win, depth: this.depth });
    this.refresh();
  }

  zoomTime(f, at = 0.5) {
    const w = this.win;
    const tc = w.t0 + at * (w.t1 - w.t0);
    this.setWin({ ...w, t0: tc - (tc - w.t0) * f, t1: tc + (w.t1 - tc) * f });
  }

  panTime(f) { const w = this.win, d = (w.t1 - w.t0) * f; this.setWin({ ...w, t0: w.t0 + d, t1: w.t1 + d }); }
  panCtx(f) { const w = this.win, d = Math.max(1, Math.round((w.c1 - w.c0) * Math.abs(f))) * Math.sign(f); this.setWin({ ...w, c0: w.c0 + d, c1: w.c1 + d }); }

  /** Opens the trace of a database; `saved` is the window kept in the URL, if any. */
  async open(db, saved) {
    if (this.db !== db || !this.meta) {
      if (this.db !== db) {
        this.clearPoint();
        // the previous database's mini-map must not stay up while this one's is fetched
        this.miniFrame = null;
        this.miniSeq = (this.miniSeq || 0) + 1;
        this.mini.getContext("2d").clearRect(0, 0, this.mini.width, this.mini.height);
        delete this.mini.dataset.window;
      }
      this.db = db;
      this.meta = await api.traceMeta(db);
      this.undo = [];
      this.miniFrame = null;
      this.depth = 0;
      this.win = this.home();
      this.depthInput.max = String(this.meta.max_depth);
      if (saved) {
        this.win = this.clamp({ ...this.home(), ...saved });
        if (Number.isInteger(saved.depth)) this.depth = Math.min(saved.depth, this.meta.max_depth);
      }
      this.depthInput.value = String(this.depth);
    }
    await this.refresh();
  }

  /** Forgets the pinned point: the Call path and Depth panes showed the previous
   *  database's thread and frames after a switch of database tabs. */
  clearPoint() {
    this.cursor = null;
    this.lastCallpath = null;
    clearTimeout(this.hoverT);
    for (const k of ["callpath", "depth"]) if (this.aborts[k]) this.aborts[k].abort();
    document.getElementById("tr-callpath").innerHTML = "";
    document.getElementById("tr-depth-ctx").textContent = "";
    const { g, cw, ch } = hiDpi(this.depthCanvas);
    g.clearRect(0, 0, cw, ch);
  }

  refreshSoon() {
    if (this.soon) return;
    this.soon = requestAnimationFrame(() => { this.soon = 0; this.refresh(); });
  }

  abortable(name) {
    if (this.aborts[name]) this.aborts[name].abort();
    this.aborts[name] = new AbortController();
    return this.aborts[name].signal;
  }

  /** Fetches and paints the main canvas, the summary, the statistics and the mini-map, then
   *  tells the subscribers of "trace:painted" (also when there was nothing to paint). */
  async refresh() {
    const r = await this.paint();
    publish("trace:painted", { trace: this });
    return r;
  }

  async paint() {
    if (!this.meta) return;
    const w = this.win;
    const wrap = this.canvas.parentElement;
    const W = Math.max(1, Math.floor(wrap.clientWidth));
    const Hpx = Math.max(1, Math.floor(wrap.clientHeight));
    const H = Math.max(1, Math.min(w.c1 - w.c0, Hpx));
    const p = { t0: Math.floor(w.t0), t1: Math.ceil(w.t1), c0: w.c0, c1: w.c1, width: W, height: H, depth: this.depth };
    document.getElementById("tr-range").textContent =
      `time ${fmtNs(w.t0 - this.meta.t0)} – ${fmtNs(w.t1 - this.meta.t0)} · contexts ${w.c0}–${w.c1 - 1} of ${this.meta.contexts.length} · depth ${this.depth}/${this.meta.max_depth}`;
    try {
      const f = await api.traceFrame(this.db, p, this.abortable("frame"));
      this.frame = { ...f, W, H: f.rows.length, grid: decodeGrid(f.grid), params: p };
      paintGrid(this.canvas, this.frame.grid, W, this.frame.H, f.procedures);
      this.labelRows(f.rows);
      this.drawRuler();
      this.canvas.dataset.procedures = String(f.procedures.length);
      this.canvas.dataset.rows = String(f.rows.length);
      this.canvas.dataset.width = String(W);
      this.canvas.dataset.frame = `${p.t0},${p.t1},${p.c0},${p.c1},${p.depth}`; // what is painted
    } catch (e) { if (e.name !== "AbortError") throw e; return; }
    this.drawMini();
    this.summary(p);
    this.stats(p);
    if (this.cursor) this.depthView(this.cursor.ctx);
  }

  /** Execution-context labels on the rows: every row when rows are tall enough, else every
   *  k-th row (k chosen so that labels never overlap), each with a tick at its row. */
  labelRows(rows) {
    const cv = this.canvas, g = cv.getContext("2d");
    const ch = Math.max(1, cv.clientHeight);
    const rh = ch / Math.max(1, rows.length);
    const every = Math.max(1, Math.ceil(14 / rh));
    const names = shortLabels(this.meta.contexts);
    const gpu = this.meta.gpu || [];
    const counts = this.meta.row_samples || [];
    g.font = "11px system-ui, sans-serif";
    g.textBaseline = "middle";
    // GPU streams: a green stripe down the row's left edge, so that they read apart from
    // CPU threads whatever procedure colours fill them (HPCToolkit attributes a GPU
    // operation under the CPU calling context that launched it: same colours)
    for (let i = 0; i < rows.length; i++) {
      if (!gpu[rows[i]]) continue;
      g.fillStyle = "#1b9e4b";
      g.fillRect(0, i * rh, 4, Math.max(1, rh));
    }
    const shown = [];
    for (let i = 0; i < rows.length; i += every) {
      const ctx = rows[i];
      const empty = counts.length && counts[ctx] === 0;
      const text = (names[ctx] ?? String(ctx)) + (empty ? " — no trace samples" : "");
      const y = Math.round(i * rh);
      // the label's box (14 px) stays inside the canvas: the first row's was cut at the top
      const mid = Math.min(ch - 7, Math.max(7, rh >= 13 ? y + Math.min(rh, 16) / 2 : y + rh / 2));
      const w = g.measureText(text).width + 10;
      g.fillStyle = gpu[ctx] ? "rgba(225,246,232,0.92)" : "rgba(255,255,255,0.85)";
      g.fillRect(gpu[ctx] ? 4 : 0, mid - 7, w, 14);
      g.fillStyle = "#111";
      g.fillRect(0, mid - 0.5, 3, 1);
      g.fillText(text, gpu[ctx] ? 8 : 5, mid);
      if (rh >= 13 && i) { g.fillStyle = "rgba(255,255,255,0.9)"; g.fillRect(0, y, cv.clientWidth, 1); }
      shown.push(ctx);
    }
    cv.dataset.labels = shown.join(",");
  }

  /** The time ruler: ticks at 1-2-5 steps, labelled from the start of the trace in one unit. */
  drawRuler() {
    const rc = this.ruler;
    if (!rc || !this.meta || !this.win) return;
    const { g, cw, ch } = hiDpi(rc);
    g.fillStyle = "#f4f5f7"; g.fillRect(0, 0, cw, ch);
    g.fillStyle = "#888"; g.fillRect(0, ch - 1, cw, 1);
    const w = this.win;
    const a = w.t0 - this.meta.t0, b = w.t1 - this.meta.t0;
    const step = tickStep(b - a, Math.max(2, Math.floor(cw / 90)));
    g.font = "11px system-ui, sans-serif";
    g.textBaseline = "top";
    g.fillStyle = "#222";
    const ticks = [];
    for (let t = Math.ceil(a / step) * step; t <= b; t += step) {
      const x = Math.round(((t - a) / (b - a)) * cw) + 0.5;
      g.fillRect(x - 0.5, ch - 7, 1, 6);
      const label = fmtTick(t, step);
      const tw = g.measureText(label).width;
      g.fillText(label, Math.min(Math.max(0, x - tw / 2), cw - tw), 2);
      ticks.push(label);
      if (ticks.length > 200) break;
    }
    rc.dataset.ticks = ticks.join("|");
  }

  async summary(p) {
    const { c0, c1, t0, t1, width, depth } = p;
    let s;
    try { s = await api.traceSummary(this.db, { t0, t1, c0, c1, width, depth }, this.abortable("summary")); } catch (e) { return; }
    const cv = this.summaryCanvas;
    const { g, cw, ch } = hiDpi(cv);
    g.fillStyle = "#fff"; g.fillRect(0, 0, cw, ch);
    const procs = s.procedures || [];
    // shares: one list per procedure, one share per pixel column (procedure-major)
    const shares = s.shares || [];
    const Wd = s.width || width;
    const sx = cw / Wd;
    const colours = procs.map((n) => css(colourOf(n)));
    const y = new Float64Array(Wd).fill(ch);
    shares.forEach((row, k) => {
      g.fillStyle = colours[k] || "#ccc";
      for (let x = 0; x < Wd; x++) {
        const v = row[x];
        if (!v) continue;
        const h = v * ch;
        g.fillRect(x * sx, y[x] - h, Math.ceil(sx), Math.ceil(h));
        y[x] -= h;
      }
    });
  }

  async stats(p) {
    const { c0, c1, t0, t1, depth } = p;
    let s;
    try { s = await api.traceStats(this.db, { t0, t1, c0, c1, depth }, this.abortable("stats")); } catch (e) { return; }
    let rows = [];
    if (Array.isArray(s.procedures) && s.procedures.length && typeof s.procedures[0] === "object") rows = s.procedures.map((r) => [r.name, r.share ?? r.percent / 100]);
    else if (Array.isArray(s.procedures) && Array.isArray(s.shares)) rows = s.procedures.map((n, i) => [n, s.shares[i]]);
    else if (Array.isArray(s.stats)) rows = s.stats.map((r) => [r.name, r.share]);
    rows.sort((a, b) => b[1] - a[1]);
    const tb = document.querySelector("#tr-stats tbody");
    tb.innerHTML = "";
    for (const [name, share] of rows.slice(0, 40)) {
      const tr = document.createElement("tr");
      const sw = document.createElement("span"); sw.className = "swatch"; sw.style.background = css(colourOf(name));
      const a = document.createElement("td"); a.append(sw, name); a.title = name;
      const b = document.createElement("td"); b.className = "num"; b.textContent = `${(share * 100).toFixed(1)}%`;
      tr.append(a, b); tb.appendChild(tr);
    }
  }

  /** The mini-map: the whole run at the current depth (fetched once per depth), with the
   *  visible window outlined; a click centres the window there. */
  async drawMini() {
    const m = this.mini;
    const mw = m.clientWidth || 240, mh = m.clientHeight || 120;
    const seq = (this.miniSeq = (this.miniSeq || 0) + 1);
    if (!this.miniFrame || this.miniFrame.depth !== this.depth) {
      const h = this.home();
      const H = Math.min(mh, h.c1);
      const depth = this.depth;
      let f;
      try {
        f = await api.traceFrame(this.db, { t0: h.t0, t1: h.t1, c0: 0, c1: h.c1, width: mw, height: H, depth }, undefined);
      } catch (_) { return; }
      if (seq !== this.miniSeq) return; // a newer call (or another database) draws
      this.miniFrame = { ...f, depth, grid: decodeGrid(f.grid) };
    }
    const f = this.miniFrame;
    paintGrid(m, f.grid, f.width || mw, f.rows.length, f.procedures);
    const g = m.getContext("2d");
    const h = this.home(), w = this.win;
    const x0 = ((w.t0 - h.t0) / (h.t1 - h.t0)) * mw, x1 = ((w.t1 - h.t0) / (h.t1 - h.t0)) * mw;
    const y0 = (w.c0 / h.c1) * mh, y1 = (w.c1 / h.c1) * mh;
    g.strokeStyle = "#000"; g.lineWidth = 2;
    g.strokeRect(x0 + 1, y0 + 1, Math.max(3, x1 - x0 - 2), Math.max(3, y1 - y0 - 2));
    m.dataset.window = `${x0.toFixed(0)},${x1.toFixed(0)}`;
  }

  at(x, y) {
    if (!this.frame) return null;
    const b = this.canvas.getBoundingClientRect();
    const row = Math.min(this.frame.H - 1, Math.floor((y / b.height) * this.frame.H));
    const ctx = this.frame.rows[row];
    const t = this.win.t0 + (x / b.width) * (this.win.t1 - this.win.t0);
    return { ctx, t: Math.round(t), row };
  }

  hover(x, y) {
    const a = this.at(x, y);
    if (!a) return;
    this.canvas.title = this.tipAt(a);
    publish("trace:point", { ctx: a.ctx, t: a.t });
    if (this.cursor) return; // a click pinned the call path and the depth view
    clearTimeout(this.hoverT);
    this.hoverT = setTimeout(() => {
      if (this.cursor) return; // pinned meanwhile
      this.depthView(a.ctx);
      this.callpath(a.ctx, a.t);
    }, 60);
  }

  /** The canvas tooltip at a point: context and time, and why a spot is empty. */
  tipAt(a) {
    const name = this.meta.contexts[a.ctx] ?? a.ctx;
    const counts = this.meta.row_samples || [];
    if (counts.length && counts[a.ctx] === 0) return `no trace samples for ${name}`;
    const head = `${name} · ${fmtNs(a.t - this.meta.t0)}`;
    const f = this.frame;
    const col = Math.min(f.W - 1, Math.max(0, Math.floor(((a.t - this.win.t0) / (this.win.t1 - this.win.t0)) * f.W)));
    const p = f.grid[a.row * f.W + col];
    if (p < 0 || p >= f.procedures.length) return `${head}\nno sample here (before the first sample of this row, after its last, or outside any procedure)`;
    return `${head}\n${f.procedures[p]}`;
  }

  pick(x, y) {
    const a = this.at(x, y);
    if (!a) return;
    clearTimeout(this.hoverT);
    this.cursor = a;
    document.getElementById("tr-callpath").innerHTML = ""; // the new point's path replaces it
    this.depthView(a.ctx);
    this.callpath(a.ctx, a.t);
    publish("trace:point", { ctx: a.ctx, t: a.t });
  }

  async depthView(ctx) {
    const w = this.win;
    const width = Math.max(1, this.depthCanvas.clientWidth);
    let f;
    try { f = await api.traceDepth(this.db, { ctx, t0: Math.floor(w.t0), t1: Math.ceil(w.t1), width }, this.abortable("depth")); } catch (_) { return; }
    paintGrid(this.depthCanvas, decodeGrid(f.grid), width, f.rows.length, f.procedures);
    document.getElementById("tr-depth-ctx").textContent = `— ${this.meta.contexts[ctx] ?? ctx}`;
  }

  async callpath(ctx, t) {
    let r;
    try { r = await api.traceCallpath(this.db, { ctx, t }, this.abortable("callpath")); } catch (_) { return; }
    this.lastCallpath = r;
    const ol = document.getElementById("tr-callpath");
    ol.innerHTML = "";
    const head = document.createElement("div");
    head.className = "muted";
    head.textContent = `${this.meta.contexts[ctx] ?? ctx} at ${fmtNs(t - this.meta.t0)}`;
    ol.appendChild(head);
    if (r.node && this.onShowNode) {
      const b = document.createElement("button");
      b.type = "button";
      b.id = "tr-show-node";
      b.textContent = "Show in Top-down";
      b.title = "open the Top-down view at this sample's calling context";
      b.onclick = () => this.onShowNode(r.node);
      ol.appendChild(b);
    }
    for (const fr of r.frames || []) {
      const li = document.createElement("li");
      const sw = document.createElement("span"); sw.className = "swatch"; sw.style.background = css(colourOf(fr.name));
      li.append(sw, fr.name);
      if (fr.depth === Math.min(this.depth, (r.frames || []).length - 1)) li.classList.add("at");
      ol.appendChild(li);
    }
  }
}

export function fmtNs(ns) {
  const a = Math.abs(ns);
  if (a >= 1e9) return `${(ns / 1e9).toFixed(3)} s`;
  if (a >= 1e6) return `${(ns / 1e6).toFixed(3)} ms`;
  if (a >= 1e3) return `${(ns / 1e3).toFixed(2)} µs`;
  return `${Math.round(ns)} ns`;
}
