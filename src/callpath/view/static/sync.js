// sync.js — what shared sessions (share.js) and linked pop-out windows (popout.js) have in
// common: the view state as a snapshot, the difference between two snapshots as small
// (path, value) changes, and applying changes that came from elsewhere (store.js applyPaths) followed by ONE
// redraw of what they touch (a selection moves the selection, a trace window repaints the
// trace, anything else reloads the current view).
//
// Paths are dotted keys into {s: <store.js state without the font>, ui: {scroll}}, e.g.
// "s.dbs.0.views.top-down.exp". Objects are compared key by key down to a few levels; lists
// and scalars travel whole.

import { state, dbState, applyPaths, show, publish } from "./store.js";

let hooks = null;        // {tree, trace} from main.js (read, and driven through their methods)
let ready = null;        // resolves when the page has shown its first view

/** main.js hands over the panes a redraw drives. */
export function setHooks(h, started) { hooks = h; ready = started; }
export function whenReady() { return ready || Promise.resolve(); }

/** The tree's scroll position in rows (not pixels: fonts may differ between screens). */
function scrollRows() {
  const t = hooks && hooks.tree;
  return t && t.rowHeight ? Math.round(t.scroller.scrollTop / t.rowHeight) : 0;
}

export function snapshot() {
  return JSON.parse(JSON.stringify({
    s: { db: state.db, dbs: state.dbs, filters: state.filters },
    ui: { scroll: scrollRows() },
  }));
}

const isObj = (x) => x !== null && typeof x === "object" && !Array.isArray(x);
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

/** The changes from snapshot a to snapshot b: [[path, value], ...]. */
export function diff(a, b, path = [], out = [], depth = 0) {
  if (isObj(a) && isObj(b) && depth < 6) {
    for (const k of Object.keys(b)) {
      if (!same(a[k], b[k])) diff(a[k], b[k], [...path, k], out, depth + 1);
    }
    for (const k of Object.keys(a)) if (!(k in b)) out.push([[...path, k].join("."), null]);
    return out;
  }
  out.push([path.join("."), b === undefined ? null : b]);
  return out;
}

/** A whole snapshot as changes (what a late joiner or a new window needs). */
export function asChanges(snap) { return diff({}, snap); }

let batch = [];
let timer = 0;
let uiScroll = null;

/** Applies changes from elsewhere, then redraws once (debounced: a burst is one redraw).
 *  keepMode: the per-database "mode" (profile/trace/lines) stays this window's own. */
export function applyChanges(changes, { keepMode = false } = {}) {
  write(changes, keepMode);
  for (const [path] of changes) if (path === "s" || path.startsWith("s.")) batch.push(path);
  queued.push([changes, keepMode]);
  clearTimeout(timer);
  timer = setTimeout(redraw, 30);
}

let queued = [];   // changes applied but not drawn yet: written again just before the redraw

/** Writes changes into the state (the store keeps each database state complete). */
function write(changes, keepMode) {
  const sc = applyPaths(changes, keepMode);
  if (sc !== null) uiScroll = sc;
}

let drawing = Promise.resolve();

async function redraw() {
  const paths = batch;
  const changes = queued;
  batch = [];
  queued = [];
  await whenReady();
  drawing = drawing.then(async () => {
    // a load still under way when these changes arrived may have reported its own
    // selection or expanded nodes since (the tree reports them as rows arrive): the changes
    // win, and if such a report slipped in during this redraw, once more
    for (let attempt = 0; attempt < 3; attempt++) {
      for (const [c, keepMode] of changes) write(c, keepMode);
      await redrawNow(attempt ? ["s"] : paths);
      if (queued.length || batch.length) break;  // newer changes arrived: they redraw next
      if (changes.every(([c]) => c.every(([p, v]) => holds(p, v)))) break;
    }
  }).catch(() => {});
  await drawing;
}

const norm = (v) => (Array.isArray(v) && v.every((x) => typeof x === "string") ? [...v].sort() : v);

/** Whether the state still holds value at path (lists of keys compared as sets). */
function holds(path, value) {
  const parts = path.split(".");
  if (parts[0] !== "s" || parts.length < 2) return true;
  let obj = state;
  for (const k of parts.slice(1)) {
    if (obj === null || typeof obj !== "object") return false;
    obj = obj[k];
  }
  if (parts[parts.length - 1] === "mode") return true; // a pop-out keeps its own
  return isObj(value) || same(norm(obj), norm(value));
}

async function redrawNow(paths) {
  if (!hooks) return;
  const { tree, trace } = hooks;
  // a reload is coming: the tree's loads still under way are stale from now on, not only
  // once the new load starts (the page first fetches the columns; an old expansion that
  // completed meanwhile would report its expanded list, older than the one being applied)
  const showDb = () => { tree.invalidate(); return show(); };
  const d = dbState(state.db);
  const v = d.views[d.view];
  const onlySel = paths.length && paths.every((p) => p === `s.dbs.${state.db}.views.${d.view}.sel`);
  const onlyTrace = paths.length && paths.every((p) => p.startsWith(`s.dbs.${state.db}.trace`));
  if (!paths.length || (onlyTrace && d.mode !== "trace")) {
    // only the scroll position, or a trace window the page does not show
  } else if (onlySel && d.mode === "profile" && tree.rows && tree.rows.length) {
    const entry = tree.rows.find((e) => e.row && e.row.key === v.sel);
    if (entry) { tree.select(entry); tree.reveal(entry); } else await showDb();
  } else if (onlyTrace && d.mode === "trace" && trace.adopt(d.trace, state.db)) {
    await trace.refresh();
  } else {
    if (d.mode === "trace") trace.adopt(d.trace, state.db, { depth: false });
    await showDb();
  }
  if (uiScroll !== null && d.mode === "profile") {
    const rows = uiScroll;
    uiScroll = null;
    // after the tree's own reveal of the selection (one animation frame after a load)
    // ... and the follower's pane may be shorter than the leader's: the selection stays in view
    setTimeout(() => requestAnimationFrame(() => tree.scrollToRow(rows)), 60);
  }
  publish("state:applied", { paths });
}
