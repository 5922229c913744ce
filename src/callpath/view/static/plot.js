// plot.js — per-context graphs of one node's metric: plot (by context), sorted plot and
// histogram, drawn on a canvas with axis ranges, zoom, PNG export, a tooltip on hover, and a
// click on a point that opens that context's Thread view.

import { api, saveBlob } from "./api.js";
import { fmtNum, niceTicks } from "./numbers.js";

const PAD = { l: 74, r: 16, t: 24, b: 44 };

export class PlotDialog {
  constructor(onThread) {
    this.onThread = onThread;
    this.dlg = document.getElementById("dlg-plot");
    this.canvas = document.getElementById("pl-canvas");
    this.tip = document.getElementById("pl-tip");
    this.colSel = document.getElementById("pl-column");
    this.data = null;
    this.kind = "plot";
    this.range = null;
    this.points = [];
    for (const r of this.dlg.querySelectorAll("input[name=pl-kind]")) {
      r.addEventListener("change", () => { this.kind = r.value; this.range = null; this.draw(); });
    }
    this.colSel.addEventListener("change", () => this.load(this.colSel.value));
    document.getElementById("pl-close").onclick = () => this.dlg.close();
    document.getElementById("pl-apply").onclick = () => {
      const v = ["pl-x0", "pl-x1", "pl-y0", "pl-y1"].map((id) => Number(document.getElementById(id).value));
      if (v.every(Number.isFinite) && v[1] > v[0] && v[3] > v[2]) { this.range = { x0: v[0], x1: v[1], y0: v[2], y1: v[3] }; this.draw(); }
    };
    document.getElementById("pl-reset").onclick = () => { this.range = null; this.draw(); };
    document.getElementById("pl-zin").onclick = () => this.zoom(0.5);
    document.getElementById("pl-zout").onclick = () => this.zoom(2);
    document.getElementById("pl-png").onclick = () => {
      this.canvas.toBlob((b) => { if (b) saveBlob(b, `callpath-${this.kind}.png`); }, "image/png");
    };
    this.canvas.addEventListener("wheel", (e) => { e.preventDefault(); this.zoom(e.deltaY < 0 ? 0.8 : 1.25, e); }, { passive: false });
    this.canvas.addEventListener("mousemove", (e) => this.hover(e));
    this.canvas.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    this.canvas.addEventListener("click", (e) => {
      const p = this.nearest(e);
      if (p && p.ctx !== undefined) { this.dlg.close(); this.onThread(p.ctx, p.label); }
    });
  }

  /** ctx: {db, vs, node, label, columns, column} */
  async open(ctx) {
    this.ctx = ctx;
    this.colSel.innerHTML = "";
    for (const c of ctx.columns) {
      const o = document.createElement("option");
      o.value = c.key; o.textContent = c.display || c.name;
      this.colSel.appendChild(o);
    }
    this.colSel.value = ctx.column;
    document.getElementById("dlg-plot-h").textContent = `Graph: ${ctx.label}`;
    this.range = null;
    if (!this.dlg.open) this.dlg.showModal();
    await this.load(ctx.column);
  }

  async load(column) {
    const { db, vs, node } = this.ctx;
    this.data = null;
    this.draw();
    try {
      this.data = await api.plot(db, vs, node, column);
    } catch (e) {
      document.getElementById("pl-stats").textContent = e.message;
      return;
    }
    const s = this.data.stats || {};
    const f = fmtNum;
    document.getElementById("pl-stats").textContent =
      `${this.data.values.length} contexts · sum ${f(s.sum)} · mean ${f(s.mean)} · min ${f(s.min)} · max ${f(s.max)} · stdev ${f(s.stdev)} · cv ${f(s.cv)}`;
    this.range = null;
    this.draw();
  }

  series() {
    const d = this.data;
    if (!d) return { pts: [], bars: null };
    const n = d.values.length;
    if (this.kind === "plot") {
      return { pts: d.values.map((v, i) => ({ x: i, y: v ?? 0, ctx: d.contexts[i], label: d.labels[i] })) };
    }
    if (this.kind === "sorted") {
      const idx = [...Array(n).keys()].sort((a, b) => (d.values[a] ?? 0) - (d.values[b] ?? 0));
      return { pts: idx.map((j, i) => ({ x: i, y: d.values[j] ?? 0, ctx: d.contexts[j], label: d.labels[j] })) };
    }
    const vals = d.values.map((v) => v ?? 0);
    let lo = Math.min(...vals, 0 + Infinity);
    const hi = Math.max(...vals, -Infinity);
    const bins = Math.max(1, Math.min(20, Math.ceil(Math.sqrt(n))));
    // one value (a single context, or all equal): one bar centred on it, a tenth of it wide
    const w = hi > lo ? (hi - lo) / bins : (Math.abs(lo) / 10 || 1) / bins;
    if (!(hi > lo)) lo -= (w * bins) / 2;
    const counts = new Array(bins).fill(0);
    for (const v of vals) counts[Math.min(bins - 1, Math.floor((v - lo) / w))]++;
    return { pts: [], bars: { lo, w, counts } };
  }

  defaultRange(s) {
    if (s.bars) {
      const { lo, w, counts } = s.bars;
      return { x0: lo, x1: lo + w * counts.length, y0: 0, y1: Math.max(1, ...counts) + 1 };
    }
    const ys = s.pts.map((p) => p.y);
    const ymax = Math.max(0, ...ys), ymin = Math.min(0, ...ys);
    return { x0: -0.5, x1: Math.max(0.5, s.pts.length - 0.5), y0: ymin, y1: ymax > ymin ? ymax * 1.08 : 1 };
  }

  zoom(f, e) {
    const s = this.series();
    const r = this.range || this.defaultRange(s);
    let cx = (r.x0 + r.x1) / 2, cy = (r.y0 + r.y1) / 2;
    if (e) { const p = this.toData(e); cx = p.x; cy = p.y; }
    this.range = { x0: cx - (cx - r.x0) * f, x1: cx + (r.x1 - cx) * f, y0: cy - (cy - r.y0) * f, y1: cy + (r.y1 - cy) * f };
    this.draw();
  }

  toData(e) {
    const b = this.canvas.getBoundingClientRect();
    const r = this.cur;
    const px = (e.clientX - b.left) * (this.canvas.width / b.width);
    const py = (e.clientY - b.top) * (this.canvas.height / b.height);
    const W = this.canvas.width - PAD.l - PAD.r, H = this.canvas.height - PAD.t - PAD.b;
    return { x: r.x0 + ((px - PAD.l) / W) * (r.x1 - r.x0), y: r.y1 - ((py - PAD.t) / H) * (r.y1 - r.y0), px, py };
  }

  nearest(e) {
    if (!this.points.length) return null;
    const p = this.toData(e);
    let best = null, bd = 64;
    for (const q of this.points) {
      const d = (q.px - p.px) ** 2 + (q.py - p.py) ** 2;
      if (d < bd) { bd = d; best = q; }
    }
    return best;
  }

  hover(e) {
    const q = this.nearest(e);
    if (!q) { this.tip.hidden = true; return; }
    this.tip.hidden = false;
    this.tip.textContent = `${q.label}: ${fmtNum(q.y)}`;
    this.tip.style.left = `${e.clientX + 12}px`;
    this.tip.style.top = `${e.clientY + 12}px`;
  }

  draw() {
    const c = this.canvas, g = c.getContext("2d");
    g.fillStyle = "#fff"; g.fillRect(0, 0, c.width, c.height);
    this.points = [];
    this.ticks = [];
    if (!this.data) { g.fillStyle = "#888"; g.font = "13px sans-serif"; g.fillText("loading…", 20, 30); return; }
    const s = this.series();
    const r = this.range || this.defaultRange(s);
    this.cur = r;
    for (const [id, v] of [["pl-x0", r.x0], ["pl-x1", r.x1], ["pl-y0", r.y0], ["pl-y1", r.y1]]) document.getElementById(id).value = String(Number(v.toPrecision(6)));
    const W = c.width - PAD.l - PAD.r, H = c.height - PAD.t - PAD.b;
    const X = (x) => PAD.l + ((x - r.x0) / (r.x1 - r.x0)) * W;
    const Y = (y) => PAD.t + (1 - (y - r.y0) / (r.y1 - r.y0)) * H;
    // axes and ticks
    g.strokeStyle = "#999"; g.lineWidth = 1; g.font = "11px sans-serif"; g.fillStyle = "#333";
    g.beginPath(); g.moveTo(PAD.l, PAD.t); g.lineTo(PAD.l, PAD.t + H); g.lineTo(PAD.l + W, PAD.t + H); g.stroke();
    // ticks at round values (a histogram's counts are whole numbers)
    this.yTicks = [];
    for (const y of niceTicks(r.y0, r.y1, 5, !!s.bars)) {
      const py = Y(y);
      g.strokeStyle = "#eee"; g.beginPath(); g.moveTo(PAD.l, py); g.lineTo(PAD.l + W, py); g.stroke();
      const text = fmtNum(y);
      g.fillStyle = "#333"; g.textAlign = "right"; g.fillText(text, PAD.l - 4, py + 4);
      this.yTicks.push(text);
    }
    this.xTicks = [];
    if (s.bars) {
      for (const x of niceTicks(r.x0, r.x1, 6)) {
        const text = fmtNum(x);
        g.textAlign = "center"; g.fillText(text, X(x), PAD.t + H + 14);
        this.xTicks.push(text);
      }
    }
    if (!s.bars) {
      // contexts are whole numbers: one tick per context when they fit, with its short label
      const lo = Math.ceil(r.x0), hi = Math.floor(r.x1);
      const step = Math.max(1, Math.ceil((hi - lo + 1) / 12));
      const xs = [];
      for (let x = lo; x <= hi; x += step) if (x >= 0 && x < s.pts.length) xs.push(x);
      // the labels that fit between two ticks: the short labels, then without the thread
      // names ("THREAD 1 (ThreadPoolExecutor-0_0)" -> "THREAD 1"), then the context numbers;
      // long names used to run into each other
      const room = (xs.length > 1 ? X(xs[1]) - X(xs[0]) : W) - 6;
      const forms = [];
      if (this.kind === "plot" && hi - lo < 12) {
        const short = shortLabels(s.pts.map((p) => p.label));
        forms.push(short, short.map((t) => t.replace(/ \(.*\)$/, "")));
      }
      // then the dotted ids ("RANK 3 THREAD 1" -> "3.1"), named by the axis title
      const dotted = dottedLabels(s.pts.map((p) => p.label));
      if (dotted) forms.push(dotted.labels);
      const form = forms.find((f) => xs.every((x) => g.measureText(f[x]).width <= room));
      g.textAlign = "center"; g.fillStyle = "#333";
      this.ticks = [];  // what was written under the axis (tests check that none overlap)
      for (const x of xs) {
        const text = form ? form[x] : String(x);
        const w = g.measureText(text).width;
        g.fillText(text, X(x), PAD.t + H + 14);
        this.ticks.push({ x, text, left: X(x) - w / 2, right: X(x) + w / 2 });
      }
    }
    const col = this.ctx.columns.find((k) => k.key === this.colSel.value);
    g.textAlign = "center";
    const kinds = (this.data && dottedLabels(this.data.labels)) ? ` (${dottedLabels(this.data.labels).kinds})` : "";
    g.fillText(s.bars ? `value of ${col ? col.display || col.name : ""}` : this.kind === "sorted" ? `execution contexts${kinds}, sorted by value` : `execution context${kinds}`, PAD.l + W / 2, c.height - 8);
    g.save(); g.translate(14, PAD.t + H / 2); g.rotate(-Math.PI / 2);
    g.fillText(s.bars ? "number of contexts" : col ? col.display || col.name : "value", 0, 0); g.restore();
    g.save(); g.beginPath(); g.rect(PAD.l, PAD.t, W, H); g.clip();
    if (s.bars) {
      g.fillStyle = "#4a7bd0";
      s.bars.counts.forEach((n, i) => {
        const x0 = X(s.bars.lo + i * s.bars.w), x1 = X(s.bars.lo + (i + 1) * s.bars.w);
        g.fillRect(x0 + 1, Y(n), Math.max(1, x1 - x0 - 2), Y(0) - Y(n));
      });
    } else {
      g.fillStyle = "#d0452f";
      for (const p of s.pts) {
        const px = X(p.x), py = Y(p.y);
        g.beginPath(); g.arc(px, py, 3.5, 0, 2 * Math.PI); g.fill();
        this.points.push({ ...p, px, py });
      }
    }
    g.restore();
  }
}

/**
 * Context labels as their dotted ids, with the kinds they stand for: ["RANK 3 THREAD 1", ...]
 * -> {labels: ["3.1", ...], kinds: "RANK.THREAD"}; NODE and CORE (placement) are left out.
 * Null when the labels do not all have the same kinds.
 */
export function dottedLabels(labels) {
  if (!labels || !labels.length) return null;
  const parse = (l) => {
    const w = String(l).replace(/ \(.*\)$/, "").split(" ");
    const kinds = [], ids = [];
    for (let i = 0; i + 1 < w.length; i += 2) {
      if (!/^-?\d+$/.test(w[i + 1])) return null;
      if (w[i] === "NODE" || w[i] === "CORE") continue;
      kinds.push(w[i]); ids.push(w[i + 1]);
    }
    return kinds.length ? { kinds: kinds.join("."), id: ids.join(".") } : null;
  };
  const parsed = labels.map(parse);
  if (parsed.some((p) => !p || p.kinds !== parsed[0].kinds)) return null;
  return { labels: parsed.map((p) => p.id), kinds: parsed[0].kinds };
}

/** Labels without the words every label shares ("NODE 0 CORE 0 THREAD 3" -> "THREAD 3"). */
export function shortLabels(labels) {
  if (labels.length < 2) return labels;
  const words = labels.map((l) => String(l).split(" "));
  let k = 0;
  while (k < words[0].length - 1 && words.every((w) => w[k] === words[0][k])) k++;
  // keep a kind word with its number: back up to an even split
  if (k % 2 === 1) k--;
  return words.map((w) => w.slice(k).join(" "));
}
