// numbers.js — how the viewer prints a number a person reads (tooltips, graph axes): rounded
// to 4 significant digits ("1.55", never "1.5499999999999998"), and axis ticks at round
// steps (1, 2, 2.5 or 5 × 10^k; whole numbers where the quantity counts things).

/** A number for a tooltip or a label: 4 significant digits, scientific when very large or
 *  very small, "0" for zero. */
export function fmtNum(v) {
  if (v === null || v === undefined || Number.isNaN(Number(v))) return "–";
  const x = Number(v);
  if (x === 0) return "0";
  if (!Number.isFinite(x)) return String(x);
  const a = Math.abs(x);
  if (a >= 1e6 || a < 1e-3) return x.toExponential(3).replace(/\.?0+e/, "e");
  return String(Number(x.toPrecision(4)));
}

/** A round step for about `maxTicks` ticks over `span` (integer: never below 1). */
export function niceStep(span, maxTicks, integer = false) {
  const raw = Math.abs(span) / Math.max(1, maxTicks);
  if (!(raw > 0) || !Number.isFinite(raw)) return 1;
  const p = 10 ** Math.floor(Math.log10(raw));
  let step = 10 * p;
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) { step = m * p; break; }
  if (integer) step = Math.max(1, Math.round(step));
  return step;
}

/** Round tick values from lo to hi (both included when they fall on a step). */
export function niceTicks(lo, hi, maxTicks = 5, integer = false) {
  if (!(hi > lo)) return [lo];
  const step = niceStep(hi - lo, maxTicks, integer);
  const out = [];
  for (let k = Math.ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k++) {
    out.push(Number((k * step).toPrecision(12)));
    if (out.length > 100) break;
  }
  return out;
}
