// heat.js — the heat-map colours of the Lines tab (PerfVisS): cold blue/green to hot red,
// black for lines without cost; shared by the heat map, the overview and the 3-D profile.

/** Cold blue → green → yellow → hot red for t in [0, 1] (the paper's heat map). */
export function heat(t) {
  t = Math.max(0, Math.min(1, t));
  const stops = [[0, [30, 60, 200]], [0.33, [20, 170, 170]], [0.55, [40, 180, 60]],
                 [0.78, [240, 210, 40]], [1, [230, 30, 20]]];
  for (let i = 1; i < stops.length; i++) {
    const [t1, c1] = stops[i];
    const [t0, c0] = stops[i - 1];
    if (t <= t1) {
      const f = (t - t0) / (t1 - t0);
      return [0, 1, 2].map((k) => Math.round(c0[k] + f * (c1[k] - c0[k])));
    }
  }
  return stops[stops.length - 1][1];
}
export const NO_COST = [0, 0, 0];  // lines without cost in any context: black
