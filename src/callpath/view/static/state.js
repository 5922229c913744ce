// state.js — the whole view state lives in the page URL (the hash), so that a reload or a link
// sent to a colleague reopens the same database tab, view, expanded nodes, selection, sort,
// columns, derived metrics, filters, thread selection, flatten level and zoom.
//
// Layout of the hash: "#s=" + encodeURIComponent(JSON). One JSON document rather than many
// parameters because most of the state is lists (expanded keys, filters, derived metrics).

export const VIEWS = ["top-down", "bottom-up", "flat"];

/** A fresh per-view state: what the navigation tree of one view shows. */
export function freshView() {
  return { exp: [], sel: null, sort: null, order: "desc", zoom: [], cols: null };
}

/** A fresh per-database state. */
export function freshDb() {
  const views = {};
  for (const v of VIEWS) views[v] = freshView();
  return { view: "top-down", views, derived: null, threads: [], flatten: 0, mode: "profile",
           trace: null, hot: 50,
           lines: null };  // the Lines tab: metric, grouping, window, overview (lines.js LINE_DEFAULTS)
}

export const state = {
  db: 0,            // the database tab shown
  dbs: {},          // db id -> per-database state
  filters: [],      // global, as in hpcviewer: they apply to every open database
  font: 13,
};

export function dbState(id) {
  if (!state.dbs[id]) state.dbs[id] = freshDb();
  const d = state.dbs[id];
  for (const v of VIEWS) if (!d.views[v]) d.views[v] = freshView();
  return d;
}

/** Reads the state from the URL; silently ignores a malformed hash (keeps the defaults). */
export function loadFromUrl() {
  const m = location.hash.match(/^#s=(.*)$/);
  if (!m) return false;
  try {
    const s = JSON.parse(decodeURIComponent(m[1]));
    if (typeof s !== "object" || s === null) return false;
    if (Number.isInteger(s.db)) state.db = s.db;
    if (Array.isArray(s.filters)) state.filters = s.filters;
    if (Number.isFinite(s.font)) state.font = Math.min(32, Math.max(8, s.font));
    if (s.dbs && typeof s.dbs === "object") {
      for (const [k, v] of Object.entries(s.dbs)) {
        const d = freshDb();
        Object.assign(d, v);
        for (const vn of VIEWS) d.views[vn] = Object.assign(freshView(), (v.views || {})[vn] || {});
        state.dbs[k] = d;
      }
    }
    return true;
  } catch (_) {
    return false;
  }
}

let pending = null;

/** Writes the state into the URL (replaceState: no history entry per click), debounced. */
export function saveToUrl() {
  if (pending) return;
  pending = setTimeout(() => {
    pending = null;
    const url = `${location.pathname}${location.search}#s=${encodeURIComponent(JSON.stringify(state))}`;
    history.replaceState(null, "", url);
    for (const fn of savedListeners) fn();
  }, 50);
}

// Called after each write of the state (shared sessions and pop-out windows send the change
// on: share.js, popout.js, sync.js).
const savedListeners = [];
export function onStateSaved(fn) { savedListeners.push(fn); }

/** Writes the URL at once (tests and "copy link" want it now). */
export function flushUrl() {
  if (pending) { clearTimeout(pending); pending = null; }
  const url = `${location.pathname}${location.search}#s=${encodeURIComponent(JSON.stringify(state))}`;
  history.replaceState(null, "", url);
  for (const fn of savedListeners) fn();
}

/** The server's view-state parameters for one database and view. */
export function viewQueryState(dbId) {
  const d = dbState(dbId);
  const v = d.views[d.view];
  return {
    view: d.view,
    filters: state.filters,
    derived: d.derived || [],
    threads: d.view === "top-down" ? d.threads : d.threads,
    flatten: d.flatten,
    zoom: v.zoom.length ? v.zoom[v.zoom.length - 1] : null,
  };
}
