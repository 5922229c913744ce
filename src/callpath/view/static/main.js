// main.js — wires the panes together: database tabs, view tabs, the tree table, the source
// pane, the control panel, dialogs, the trace view. The state they show is the store's
// (store.js): the controls change it with actions, this module is the renderer that shows it
// ("view:show") and subscribes the panes that follow the selection.

import { api, clearError, download, showError } from "./api.js";
import { state, dbState, curView, loadFromUrl, saveToUrl, flushUrl, viewQueryState, VIEWS,
         update, show, select, subscribe, publish } from "./store.js";
import { TreeTable } from "./tree.js";
import { SourcePane, copyText } from "./source.js";
import { arrange, emptyColumns, reorder, openColumnsDialog } from "./columns.js";
import { openDerivedDialog, openFiltersDialog, openThreadsDialog, openFindDialog } from "./dialogs.js";
import { PlotDialog } from "./plot.js";
import { TraceView } from "./trace.js";
import { LinesView } from "./lines.js";
import { FlamePane } from "./flame.js";
import { installCompare, comparisonColumns, installDeltaBars } from "./compare.js";
import { startLinks } from "./share.js";

const $ = (id) => document.getElementById(id);
let databases = [];
let columns = [];        // all columns of the current view (server order)
let pending = 0;         // requests in flight for the tree (tests wait for 0)
let loadSeq = 0;

const source = new SourcePane();
const treeHost = $("tree");

function setPending(d) {
  pending += d;
  treeHost.dataset.pending = String(pending);
}

const tree = new TreeTable(treeHost, {
  fetchChildren: async (node, offset, limit) => {
    setPending(1);
    try {
      return await api.children(state.db, viewQueryState(state.db), node, tree.sortKey, tree.order, offset, limit);
    } finally { setPending(-1); }
  },
  onSelect: (entry, restored) => select(entry, restored),
  onActivate: (entry) => { if (entry.row) source.show(state.db, viewQueryState(state.db), entry.row); },
  onContext: (entry, x, y) => openMenu(entry, x, y),
  onSort: (key) => {
    const v = curView();
    if (tree.sortKey === key) v.order = tree.order === "desc" ? "asc" : "desc";
    else { v.sort = key; v.order = "desc"; }
    v.sort = key;
    saveToUrl();
    reloadTree();
  },
  onReorder: (from, to) => {
    const v = curView();
    v.cols = reorder(columns, v.cols, from, to);
    saveToUrl();
    tree.setColumns(arrange(columns, v.cols));
  },
  onExpandChange: () => { curView().exp = [...tree.expandedKeys]; saveToUrl(); },
});

const plot = new PlotDialog((ctx) => update((s, d) => {
  d.threads = [ctx];
  d.view = "top-down";
  d.mode = "profile";
}, { show: true }));

// from a trace sample (or a line of the Lines tab, a note) to its calling context in the
// Top-down tree: open the path when the server can give it, else zoom the Top-down view on
// that node
async function showNode(key) {
  const d = dbState(state.db);
  d.mode = "profile";
  d.view = "top-down";
  const v = d.views["top-down"];
  let path = null;
  try {
    path = (await api.path(state.db, { ...viewQueryState(state.db), zoom: null }, key)).path;
  } catch (_) { path = null; }
  if (path && path.length) {
    v.zoom = [];
    v.sel = null;
    saveToUrl();
    await showDb();
    await tree.revealPath(path); // loads the pages that hold each step
  } else {
    v.zoom = [key];
    v.sel = key;
    saveToUrl();
    await showDb();
  }
}
const trace = new TraceView((win) => { dbState(state.db).trace = win; saveToUrl(); }, showNode);

// the Lines tab (lines.js): its state is dbState(db).lines; from a line to its calling
// context in Top-down goes through the trace's path-revealing code above
const lines = new LinesView({ dbState, save: saveToUrl, info: (id) => databases.find((x) => x.id === id) || databases[0],
                              showTopDown: (key) => showNode(key) });
async function showInLines(entry) {
  const d = dbState(state.db);
  await lines.showNode(state.db, viewQueryState(state.db), entry.row.key);
  d.mode = "lines";
  saveToUrl();
  await showDb();
}
let shownDb = null;  // the database whose panes are on screen (the source pane follows it)
let shownView = null;  // ... and the view
// the flame graph / icicle pane under the tree (flame.js): follows the view, linked selection
const flame = new FlamePane($("flame-pane"), {
  dbState: () => dbState(state.db), save: saveToUrl,
  query: () => ({ db: state.db, vs: viewQueryState(state.db), columns, sortKey: tree.sortKey }),
  reveal: (keys) => tree.revealPath(keys),
});
$("tb-flame").onclick = () => flame.toggle();
installDeltaBars(treeHost);  // red/blue bars in the delta columns of a comparison
// two open databases compared (compare.js): the comparison opens as a new tab with its flame graph
installCompare($("tb-compare"), {
  current: () => state.db, databases: () => databases,
  opened: async (entry) => {
    databases = await api.databases();
    await update((s) => {
      s.db = entry.id;
      const d = dbState(entry.id);
      for (const vn of VIEWS) d.views[vn].cols = comparisonColumns();
      d.flame = { on: true, path: [] };
    }, { show: true });
  },
});

// the panes that follow the tree's selection: the flame graph outlines it, the source pane
// shows its file (after a short pause: arrow keys run through rows), the Lines tab's cursor
// goes to its line when the tab is next shown
let sourceTimer = 0;
subscribe("selection", ({ row, key }) => {
  flame.highlight(key);
  clearTimeout(sourceTimer);
  sourceTimer = setTimeout(() => { if (row) source.show(state.db, viewQueryState(state.db), row); }, 80);
  if (row) lines.follow(state.db, viewQueryState(state.db), row);
});

function dbInfo() { return databases.find((x) => x.id === state.db) || databases[0]; }

// ---- database and view tabs ------------------------------------------------------------

function drawDbTabs() {
  const nav = $("db-tabs");
  nav.innerHTML = "";
  for (const db of databases) {
    const b = document.createElement("button");
    b.type = "button";
    b.setAttribute("role", "tab");
    b.dataset.db = String(db.id);
    b.textContent = db.name;
    b.title = `${db.title || db.name}\n${db.path}\n${db.contexts} execution contexts`;
    b.setAttribute("aria-selected", db.id === state.db ? "true" : "false");
    b.onclick = () => update((s) => { s.db = db.id; }, { show: true });
    nav.appendChild(b);
  }
}

function drawViewTabs() {
  const d = dbState(state.db);
  $("trace-tab").hidden = !dbInfo().has_traces;
  for (const b of document.querySelectorAll("#view-tabs [role=tab]")) {
    const on = d.mode === "trace" || d.mode === "lines" ? b.dataset.view === d.mode : b.dataset.view === d.view;
    b.setAttribute("aria-selected", on ? "true" : "false");
  }
  const flat = d.view === "flat";
  $("tb-flatten").disabled = !flat;
  $("tb-unflatten").disabled = !flat || !d.flatten;
  $("tb-zoom-out").disabled = !curView().zoom.length;
  $("tb-hot-threshold").value = String(d.hot ?? 50);
}

function drawBadges() {
  const d = dbState(state.db);
  const host = $("badges");
  host.innerHTML = "";
  const badge = (text, clear, title) => {
    const s = document.createElement("span");
    s.className = "badge";
    s.textContent = text;
    if (title) s.title = title;
    if (clear) {
      const x = document.createElement("button");
      x.type = "button"; x.textContent = "×"; x.setAttribute("aria-label", `clear: ${text}`);
      x.onclick = clear;
      s.appendChild(x);
    }
    host.appendChild(s);
  };
  if (d.threads.length) badge(`Thread view: ${d.threads.length} context${d.threads.length > 1 ? "s" : ""}`, () => update(() => { d.threads = []; }, { show: true }), `contexts ${d.threads.join(", ")}`);
  const on = state.filters.filter((f) => f.enabled !== false);
  const kind = { self: "self", descendants: "descendants", all: "self and descendants" };
  if (on.length) badge(`Filters: ${on.map((f) => `${f.pattern} (${kind[f.type] || f.type})`).join(", ")}`, null);
  const v = curView();
  if (v.zoom.length) badge(`Zoomed in (${v.zoom.length})`, () => update(() => { v.zoom = []; }, { show: true }));
  if (d.view === "flat" && d.flatten) badge(`Flattened ×${d.flatten}`, () => update(() => { d.flatten = 0; }, { show: true }));
  drawEmptyBadge();
}

/** "N empty columns hidden — show": one click shows the all-zero columns arrange() hid. */
function drawEmptyBadge() {
  const old = $("empty-cols");
  if (old) old.remove();
  const v = curView();
  const n = v.cols ? 0 : emptyColumns(columns).length;
  if (!n || dbState(state.db).mode !== "profile") return;
  const b = document.createElement("button");
  b.type = "button";
  b.id = "empty-cols";
  b.className = "badge";
  b.textContent = `${n} all-zero column${n > 1 ? "s" : ""} hidden · show`;
  b.title = "these metrics are zero at every scope of this view; Columns… hides them again";
  b.onclick = () => {
    v.cols = { order: [], hidden: [], names: {} };
    saveToUrl();
    tree.setColumns(arrange(columns, v.cols));
    drawEmptyBadge();
  };
  $("badges").appendChild(b);
}

document.getElementById("view-tabs").addEventListener("click", (e) => {
  const b = e.target.closest("[role=tab]");
  if (!b) return;
  update((s, d) => {
    if (b.dataset.view === "trace" || b.dataset.view === "lines") d.mode = b.dataset.view;
    else { d.mode = "profile"; d.view = b.dataset.view; }
  }, { show: true });
});

/** Shows the current database in its current view (profile, trace or lines): the renderer,
 *  run on every "view:show" (store.js show()). */
async function showDb() {
  drawDbTabs();
  const d = dbState(state.db);
  if (d.derived === null) d.derived = dbInfo().derived || [];
  if (d.mode === "trace" && !dbInfo().has_traces) d.mode = "profile";
  drawViewTabs();
  drawBadges();
  publish("view:shown", { db: state.db, mode: d.mode, view: d.view });
  const traceMode = d.mode === "trace";
  if (shownDb !== state.db || shownView !== d.view) {
    // another database or view: no pane may keep the previous one's file or message (the
    // view's own selection shows its source again once its row arrives)
    shownDb = state.db;
    shownView = d.view;
    source.clear();
  }
  $("profile").hidden = traceMode || d.mode === "lines";
  $("trace").hidden = !traceMode;
  $("lines").hidden = d.mode !== "lines";
  if (d.mode === "lines") {
    await lines.open(state.db);
    return;
  }
  if (traceMode) {
    await trace.open(state.db, d.trace);
    return;
  }
  await reloadTree();
}

/** Fetches the columns and reloads the tree with the current state. */
async function reloadTree() {
  const seq = ++loadSeq;
  const d = dbState(state.db);
  const v = d.views[d.view];
  setPending(1);
  try {
    const cols = await api.columns(state.db, viewQueryState(state.db));
    if (seq !== loadSeq) return;
    columns = cols;
    const visible = arrange(columns, v.cols);
    let sort = v.sort;
    // no sort chosen yet: the column that holds the time (the server's "open" column)
    // (a view with its own column configuration, a comparison's, sorts by its first column)
    const opening = v.cols ? null : columns.find((c) => c.open && visible.some((x) => x.key === c.key));
    if (!columns.some((c) => c.key === sort)) sort = (opening || visible[0] || columns[0] || {}).key || null;
    drawEmptyBadge();
    await tree.load(visible, sort, v.order || "desc", v.exp, v.sel);
    flame.refresh(v.sel);
  } catch (e) {
    if (e && e.status === 400 && (v.zoom.length || v.sel)) {
      // a stale key (another filter set, a changed database): start this view afresh
      v.zoom = []; v.sel = null; v.exp = [];
      saveToUrl();
      drawViewTabs();
      if (seq === loadSeq) await reloadTree();
    }
  } finally {
    setPending(-1);
  }
  drawViewTabs();
}

// ---- control panel ----------------------------------------------------------------------

function selected() { return tree.selected && tree.selected.row ? tree.selected : null; }

function pathKeys(entry) {
  const keys = [];
  for (let e = entry; e && e.parent; e = e.parent) keys.unshift(e.row.key);
  return keys;
}

async function hotPath(from) {
  const entry = from || selected() || tree.root;
  if (!entry || !entry.row) return;
  const d = dbState(state.db);
  const thr = Number($("tb-hot-threshold").value);
  d.hot = Number.isFinite(thr) ? Math.max(0, Math.min(100, thr)) : 50;
  saveToUrl();
  const res = await api.hotpath(state.db, viewQueryState(state.db), entry.row.key, tree.sortKey, d.hot);
  let path = res.path || [];
  if (path.length && path[0] === entry.row.key) path = path.slice(1);
  await tree.revealPath([...pathKeys(entry), ...path]);
}

$("tb-hot").onclick = () => hotPath();
$("tb-hot-threshold").onchange = () => { dbState(state.db).hot = Number($("tb-hot-threshold").value); saveToUrl(); };
$("tb-zoom-in").onclick = () => zoomIn();
function zoomIn(entry) {
  entry = entry || selected();
  if (!entry || !entry.parent) return;
  update(() => {
    const v = curView();
    v.zoom.push(entry.row.key);
    v.sel = entry.row.key;
  }, { show: true });
}
$("tb-zoom-out").onclick = () => {
  const v = curView();
  if (!v.zoom.length) return;
  update(() => { v.sel = v.zoom.pop(); }, { show: true });
};
$("tb-flatten").onclick = () => {
  const d = dbState(state.db);
  if (d.view !== "flat") return;
  update(() => { d.flatten += 1; d.views.flat.exp = []; d.views.flat.sel = null; }, { show: true });
};
$("tb-unflatten").onclick = () => {
  const d = dbState(state.db);
  if (d.view !== "flat" || !d.flatten) return;
  update(() => { d.flatten -= 1; d.views.flat.exp = []; d.views.flat.sel = null; }, { show: true });
};
$("tb-derived").onclick = () => {
  const d = dbState(state.db);
  openDerivedDialog({
    db: state.db, columns, derived: d.derived || [], vs: viewQueryState(state.db),
    onAdd: async (list, save) => {
      d.derived = list;
      if (save) await api.saveDerived(state.db, list).catch(() => {});
      saveToUrl();
      showDb();
    },
  });
};
$("tb-columns").onclick = () => {
  const d = dbState(state.db);
  openColumnsDialog({
    db: state.db, columns, dbState: d, viewName: d.view, vs: viewQueryState(state.db),
    onApply: (derivedChanged) => {
      saveToUrl();
      if (derivedChanged) { showDb(); return; }
      tree.setColumns(arrange(columns, curView().cols));
    },
  });
};
$("tb-csv").onclick = async () => {
  const d = dbState(state.db);
  const url = api.csvUrl(state.db, viewQueryState(state.db), tree.shownExpanded(), tree.sortKey, tree.order, tree.columns.map((c) => c.key));
  const name = `${dbInfo().name.replace(/[^\w.-]+/g, "_")}-${d.view}.csv`;
  await download(url, name);
};
function setFont(px) {
  update((s) => { s.font = Math.max(8, Math.min(32, px)); });
  tree.setFont(state.font);
  document.documentElement.style.setProperty("--font", `${state.font}px`);
}
$("tb-font-up").onclick = () => setFont(state.font + 1);
$("tb-font-down").onclick = () => setFont(state.font - 1);
$("tb-plot").onclick = () => openPlot();
function openPlot(entry) {
  entry = entry || selected() || tree.root;
  if (!entry || !entry.row) return;
  const measured = tree.columns.filter((c) => c.scope !== "derived");
  const cols = measured.length ? measured : columns.filter((c) => c.scope !== "derived");
  const col = cols.find((c) => c.key === tree.sortKey) || cols[0];
  if (!col) return;
  plot.open({ db: state.db, vs: viewQueryState(state.db), node: entry.row.key, label: entry.row.label, columns: cols, column: col.key });
}
$("tb-threads").onclick = () => {
  const d = dbState(state.db);
  openThreadsDialog({ db: state.db, threads: d.threads, onApply: (t) => update(() => { d.threads = t; }, { show: true }) });
};
$("tb-filters").onclick = () => {
  openFiltersDialog({ filters: state.filters, onApply: (f) => update((s) => {
    s.filters = f;
    for (const id of Object.keys(s.dbs)) for (const vn of VIEWS) { s.dbs[id].views[vn].zoom = []; }
  }, { show: true }) });
};
function openFind(initial) {
  openFindDialog({ db: state.db, vs: () => viewQueryState(state.db), initial, reveal: (keys) => tree.revealPath(keys) });
}
$("tb-find").onclick = () => openFind();

// ---- context menu --------------------------------------------------------------------------

const menu = $("ctx-menu");
let menuEntry = null;
function openMenu(entry, x, y) {
  menuEntry = entry;
  menu.hidden = false;
  menu.style.left = `${Math.min(x, innerWidth - 180)}px`;
  menu.style.top = `${Math.min(y, innerHeight - 200)}px`;
  menu.querySelector("button").focus();
}
function closeMenu() { menu.hidden = true; }
document.addEventListener("click", (e) => { if (!menu.contains(e.target)) closeMenu(); });
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape") closeMenu();
  if ((e.ctrlKey || e.metaKey) && e.key === "f" && document.activeElement === tree.scroller) { e.preventDefault(); openFind(); }
  if ((e.ctrlKey || e.metaKey) && e.key === "c" && document.activeElement === tree.scroller && selected()) { copyText(tree.rowText(selected())); }
});
menu.addEventListener("keydown", (e) => {
  const items = [...menu.querySelectorAll("button")];
  const i = items.indexOf(document.activeElement);
  if (e.key === "ArrowDown") { items[(i + 1) % items.length].focus(); e.preventDefault(); }
  if (e.key === "ArrowUp") { items[(i - 1 + items.length) % items.length].focus(); e.preventDefault(); }
});
menu.addEventListener("click", (e) => {
  const b = e.target.closest("button[data-act]");
  if (!b || !menuEntry) return;
  closeMenu();
  const entry = menuEntry;
  switch (b.dataset.act) {
    case "copy": copyText(tree.rowText(entry)); break;
    case "find": openFind(entry.row.name || ""); break;
    case "source": source.show(state.db, viewQueryState(state.db), entry.row); break;
    case "hot": hotPath(entry); break;
    case "zoom": zoomIn(entry); break;
    case "plot": openPlot(entry); break;
    case "lines": showInLines(entry); break;
  }
});

// ---- misc ------------------------------------------------------------------------------------

$("error-close").onclick = () => clearError();

(function splitter() {
  const pane = $("source-pane");
  const bar = $("splitter");
  let startY = 0, startH = 0;
  const move = (e) => { pane.style.height = `${Math.max(28, startH + e.clientY - startY)}px`; };
  bar.addEventListener("mousedown", (e) => {
    startY = e.clientY; startH = pane.offsetHeight;
    window.addEventListener("mousemove", move);
    window.addEventListener("mouseup", () => window.removeEventListener("mousemove", move), { once: true });
    e.preventDefault();
  });
})();

window.addEventListener("hashchange", () => {
  // a pasted link: take its state
  if (loadFromUrl()) { setFont(state.font); showDb(); }
});

async function start() {
  const fromUrl = loadFromUrl();
  if (!fromUrl) {
    // no state in the link: start from the saved filter set (global and persistent, as in
    // hpcviewer; `callpath filters` manages it)
    let filters = [];
    try { filters = await api.filters(); } catch (_) { filters = []; }
    update((s) => { s.filters = filters; });
  }
  try {
    databases = await api.databases();
  } catch (e) {
    return;
  }
  if (!databases.length) { showError("the server has no database open"); return; }
  if (!databases.some((d) => d.id === state.db)) update((s) => { s.db = databases[0].id; });
  setFont(state.font);
  await showDb();
  // the keyboard works at once (arrows, Enter, Ctrl+F) without a click into the tree first
  if (document.activeElement === document.body && !$("profile").hidden) tree.scroller.focus({ preventScroll: true });
  flushUrl();
}

// for tests and for debugging in the console
window.__callpath = { state, tree, flushUrl, get columns() { return columns; }, trace, plot, source };
window.__callpath.lines = lines;
window.__callpath.flame = flame;
subscribe("view:show", showDb);
// shared sessions, linked pop-out windows and notes (share.js, popout.js, notes.js)
startLinks({ tree, trace, source, plot, showNode }, start());
