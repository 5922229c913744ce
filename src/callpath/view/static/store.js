// store.js — the page's one store: the view state, the actions that change it, and the topics
// panes and features subscribe to (docs/view.md "Front end").
//
// The state lives in the page URL (the hash), so that a reload or a link sent to a colleague
// reopens the same database tab, view, expanded nodes, selection, sort, columns, derived
// metrics, filters, thread selection, flatten level, zoom, trace window, flame graph and Lines
// position. Layout of the hash: "#s=" + encodeURIComponent(JSON). One JSON document rather than
// many parameters because most of the state is lists (expanded keys, filters, derived metrics).
//
// Every module reads `state`; only this module assigns to it. A change is an action:
// update((s, d) => { ...change s or d, the shown database's state... }, {show}) writes the
// URL and, with show, asks the renderer (main.js) to show the result. Panes and features learn
// of changes through subscribe(topic, fn); the topics are listed at TOPICS below.

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

export function dbState(id = state.db) {
  if (!state.dbs[id]) state.dbs[id] = freshDb();
  const d = state.dbs[id];
  for (const v of VIEWS) if (!d.views[v]) d.views[v] = freshView();
  return d;
}

/** The state of the view shown for a database (its tree's expansion, selection, sort...). */
export function curView(id = state.db) {
  const d = dbState(id);
  return d.views[d.view];
}

/** The server's view-state parameters for one database and view. */
export function viewQueryState(dbId = state.db) {
  const d = dbState(dbId);
  const v = d.views[d.view];
  return {
    view: d.view,
    filters: state.filters,
    derived: d.derived || [],
    threads: d.threads,
    flatten: d.flatten,
    zoom: v.zoom.length ? v.zoom[v.zoom.length - 1] : null,
  };
}

// ---- topics ------------------------------------------------------------------------------

/**
 * TOPICS (subscribe(topic, fn); fn(detail)):
 *   "state:saved"     the state was written to the URL (shared sessions and pop-outs send it on)
 *   "state:applied"   {paths}: changes from another window or participant were applied and drawn
 *   "view:show"       the renderer (main.js) shows state.db in its mode and view; show() awaits it
 *   "view:shown"      {db, mode, view}: the renderer began to show a database (its panes load)
 *   "selection"       {entry, key, row, restored}: the tree's selection changed (restored: a
 *                     wanted selection whose row just arrived)
 *   "tree:drawn"      {tree}: the tree drew its rows (marks go over the pooled rows again)
 *   "trace:painted"   {trace}: the trace view painted a frame
 *   "trace:point"     {ctx, t}: the pointer rests on (or pinned) a trace sample
 *   "source:rendered" {source}: the source pane drew a file
 */
const topics = new Map();

/** Calls fn(detail) on every publication of topic; returns the function that stops it. */
export function subscribe(topic, fn) {
  if (!topics.has(topic)) topics.set(topic, []);
  topics.get(topic).push(fn);
  return () => {
    const list = topics.get(topic);
    const i = list.indexOf(fn);
    if (i >= 0) list.splice(i, 1);
  };
}

/** Calls the subscribers of topic in the order they subscribed; resolves when all have
 *  (a subscriber may be async: show() awaits the renderer). */
export function publish(topic, detail) {
  const out = [];
  for (const fn of [...(topics.get(topic) || [])]) out.push(fn(detail));
  return Promise.all(out);
}

// ---- actions -----------------------------------------------------------------------------

/** The one way to change the state: change(state, dbState()) changes it; the URL follows;
 *  show: the renderer shows the result (the promise resolves once it has). */
export function update(change, { show: andShow = false } = {}) {
  if (change) change(state, dbState(state.db));
  saveToUrl();
  return andShow ? show() : Promise.resolve();
}

/** Shows state.db in its current mode and view (the renderer subscribes to "view:show"). */
export function show() { return publish("view:show"); }

/** The tree selected an entry: the view remembers its key, and the panes that follow the
 *  selection (flame graph, source, Lines, notes) hear of it. */
export function select(entry, restored = false) {
  const key = entry && entry.row ? entry.row.key : null;
  curView().sel = key;
  saveToUrl();
  publish("selection", { entry, key, row: entry ? entry.row : null, restored });
}

// ---- the URL -----------------------------------------------------------------------------

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

function writeUrl() {
  const url = `${location.pathname}${location.search}#s=${encodeURIComponent(JSON.stringify(state))}`;
  history.replaceState(null, "", url);
  publish("state:saved");
}

/** Writes the state into the URL (replaceState: no history entry per click), debounced. */
export function saveToUrl() {
  if (pending) return;
  pending = setTimeout(() => { pending = null; writeUrl(); }, 50);
}

/** Writes the URL at once (tests and "copy link" want it now). */
export function flushUrl() {
  if (pending) { clearTimeout(pending); pending = null; }
  writeUrl();
}

// ---- changes from elsewhere (sync.js: shared sessions and pop-out windows) ----------------

const isObj = (x) => x !== null && typeof x === "object" && !Array.isArray(x);

/**
 * Writes changes that came from another window or participant into the state: [[path,
 * value], ...], paths being dotted keys into {s: state, ui: {scroll}} (sync.js). Returns the
 * scroll position (in rows) among them, or null. keepMode: each database's "mode"
 * (profile/trace/lines) stays this window's own. Each database state stays complete
 * whatever arrived.
 */
export function applyPaths(changes, keepMode = false) {
  let scroll = null;
  const modes = {};
  for (const [id, d] of Object.entries(state.dbs)) modes[id] = d.mode;
  for (const [path, value] of changes) {
    const parts = path.split(".");
    if (parts[0] === "ui") {
      const sc = parts.length === 1 ? (isObj(value) ? value.scroll : null) : parts[1] === "scroll" ? value : null;
      if (Number.isFinite(sc)) scroll = sc;
      continue;
    }
    if (parts[0] !== "s") continue;
    if (parts.length === 1) {  // the whole state
      if (!isObj(value)) continue;
      for (const k of ["db", "dbs", "filters"]) if (k in value) state[k] = JSON.parse(JSON.stringify(value[k]));
      continue;
    }
    if (keepMode && parts[parts.length - 1] === "mode") continue;
    let obj = state;
    for (let i = 1; i < parts.length - 1; i++) {
      if (!isObj(obj[parts[i]])) obj[parts[i]] = {};
      obj = obj[parts[i]];
    }
    obj[parts[parts.length - 1]] = JSON.parse(JSON.stringify(value));
  }
  if (!isObj(state.dbs)) state.dbs = {};
  for (const [id, d] of Object.entries(state.dbs)) {
    const full = Object.assign(freshDb(), isObj(d) ? d : {});
    if (!isObj(full.views)) full.views = {};
    for (const vn of VIEWS) full.views[vn] = Object.assign(freshView(), full.views[vn] || {});
    if (keepMode && modes[id]) full.mode = modes[id];
    state.dbs[id] = full;
  }
  if (!Array.isArray(state.filters)) state.filters = [];
  if (!Number.isInteger(state.db)) state.db = 0;
  return scroll;
}
