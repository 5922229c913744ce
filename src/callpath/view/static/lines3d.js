// lines3d.js — the 3-D profile of the detailed window (PerfVisS Figure 3): lines × contexts ×
// cost as a surface of quads on a 2-D canvas (no WebGL needed: a window is at most a few
// hundred lines by a few dozen context columns), drawn back to front with the heat map's
// colours. Drag rotates (yaw, pitch), the wheel zooms. Wide windows are reduced to at most
// MAX_COLS context columns by max, like the overview.

import { heat, NO_COST } from "./heat.js";

const MAX_COLS = 64;

export class Surface3D {
  constructor(canvas) {
    this.canvas = canvas;
    this.yaw = -0.6;
    this.pitch = 0.55;
    this.zoom = 1;
    this.rows = [];
    this.norm = 1;
    this.sel = [];
    this.zero = [];
    let drag = null;
    canvas.addEventListener("mousedown", (e) => { drag = { x: e.clientX, y: e.clientY, yaw: this.yaw, pitch: this.pitch }; e.preventDefault(); });
    window.addEventListener("mousemove", (e) => {
      if (!drag) return;
      this.yaw = drag.yaw + (e.clientX - drag.x) * 0.01;
      this.pitch = Math.max(-1.5, Math.min(1.5, drag.pitch + (e.clientY - drag.y) * 0.01));
      this.draw();
    });
    window.addEventListener("mouseup", () => { drag = null; });
    canvas.addEventListener("wheel", (e) => {
      e.preventDefault();
      this.zoom = Math.max(0.3, Math.min(6, this.zoom * (e.deltaY < 0 ? 1.15 : 1 / 1.15)));
      this.draw();
    }, { passive: false });
    new ResizeObserver(() => this.draw()).observe(canvas);
  }

  /** rows: values per line (one per context); norm: the value drawn at full height. */
  setData(rows, norm, sel, zero) {
    const n = rows.length ? rows[0].length : 0;
    const k = Math.max(1, Math.ceil(n / MAX_COLS));
    this.rows = k === 1 ? rows : rows.map((r) => {
      const out = [];
      for (let c = 0; c < n; c += k) out.push(Math.max(...r.slice(c, c + k)));
      return out;
    });
    this.norm = norm > 0 ? norm : 1;
    this.sel = sel;
    this.zero = zero;
    this.draw();
  }

  draw() {
    const cv = this.canvas;
    const W = Math.max(1, cv.clientWidth), H = Math.max(1, cv.clientHeight);
    if (cv.width !== W) cv.width = W;
    if (cv.height !== H) cv.height = H;
    const g = cv.getContext("2d");
    g.fillStyle = "#10131a"; g.fillRect(0, 0, W, H);
    const R = this.rows.length, C = R ? this.rows[0].length : 0;
    cv.dataset.view = `${this.yaw.toFixed(3)},${this.pitch.toFixed(3)},${this.zoom.toFixed(3)}`;
    if (!R || !C) return;
    const cy = Math.cos(this.yaw), sy = Math.sin(this.yaw), cp = Math.cos(this.pitch), sp = Math.sin(this.pitch);
    const scale = 0.62 * Math.min(W, H) * this.zoom;
    // world: x across contexts, z along lines, y up (cost); unit box centred at the origin
    const P = (i, j, h) => {
      const x = C > 1 ? j / (C - 1) - 0.5 : 0, z = R > 1 ? i / (R - 1) - 0.5 : 0, y = h * 0.5 - 0.15;
      const x1 = cy * x - sy * z, z1 = sy * x + cy * z;
      const y2 = cp * y - sp * z1, z2 = sp * y + cp * z1;
      const persp = 2.6 / (2.6 + z2);
      return [W / 2 + x1 * scale * persp, H / 2 - y2 * scale * persp, z2];
    };
    const h = (i, j) => Math.max(0, this.rows[i][j] / this.norm);
    const quads = [];
    if (R === 1 || C === 1) { // a single line or column: draw bars instead of a surface
      for (let i = 0; i < R; i++) for (let j = 0; j < C; j++) {
        const a = P(i, j, 0), b = P(i, j, h(i, j));
        quads.push({ pts: [a, b], depth: (a[2] + b[2]) / 2, t: h(i, j), zero: this.zero[i] });
      }
    } else {
      for (let i = 0; i < R - 1; i++) for (let j = 0; j < C - 1; j++) {
        const hs = [h(i, j), h(i, j + 1), h(i + 1, j + 1), h(i + 1, j)];
        const pts = [P(i, j, hs[0]), P(i, j + 1, hs[1]), P(i + 1, j + 1, hs[2]), P(i + 1, j, hs[3])];
        const depth = (pts[0][2] + pts[1][2] + pts[2][2] + pts[3][2]) / 4;
        quads.push({ pts, depth, t: Math.max(...hs), zero: this.zero[i] && this.zero[i + 1], sel: this.sel[i] });
      }
    }
    quads.sort((a, b) => b.depth - a.depth); // far first
    g.lineWidth = 0.5;
    for (const q of quads) {
      const col = q.zero ? NO_COST : heat(q.t);
      g.fillStyle = `rgb(${col[0]},${col[1]},${col[2]})`;
      g.strokeStyle = q.sel ? "#fff" : "rgba(0,0,0,0.45)";
      g.beginPath();
      g.moveTo(q.pts[0][0], q.pts[0][1]);
      for (let k = 1; k < q.pts.length; k++) g.lineTo(q.pts[k][0], q.pts[k][1]);
      if (q.pts.length > 2) { g.closePath(); g.fill(); } else { g.strokeStyle = g.fillStyle; g.lineWidth = 3; }
      g.stroke();
      g.lineWidth = 0.5;
    }
    // axes labels
    g.fillStyle = "#cfd6e4"; g.font = "11px system-ui, sans-serif";
    const a = P(0, 0, 0), b = P(0, C - 1, 0), c = P(R - 1, 0, 0);
    g.fillText("contexts →", (a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 14);
    g.fillText("lines →", (a[0] + c[0]) / 2 - 30, (a[1] + c[1]) / 2 + 14);
  }
}
