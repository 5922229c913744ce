// popout.js — any pane in its own browser window (PerfVisS's window migration: put the trace
// on the wall screen, the source on the laptop), linked both ways to the page it came from.
//
// A pop-out is the same viewer page opened with ?popout=PANE&link=ID, where PANE is source,
// tree, graph, trace or lines. The windows of one link group talk over a BroadcastChannel
// ("callpath-link-ID", same browser, same origin): each sends its view-state changes
// (sync.js), the others apply them. The per-database "mode" (profile/trace/lines) is each
// window's own, so the trace window stays a trace while the main page shows the tree; the
// selection, trace window, sort, filters, derived metrics and the rest are shared.

import { state, dbState, subscribe } from "./store.js";
import { snapshot, diff, applyChanges, whenReady } from "./sync.js";

const params = new URLSearchParams(location.search);
export const PANE = params.get("popout");
const MODE = { source: "profile", tree: "profile", graph: "profile", trace: "trace", lines: "lines" };
const linkId = params.get("link") || Math.random().toString(36).slice(2, 10);
const me = Math.random().toString(36).slice(2, 10);
let channel = null;
let last = null;
let hooks = null;

// A pop-out shows its own pane from the first paint: set the mode in the state it reads
// from the URL (this module is evaluated before main.js reads the URL).
if (PANE && MODE[PANE]) {
  const m = location.hash.match(/^#s=(.*)$/);
  try {
    const s = m ? JSON.parse(decodeURIComponent(m[1])) : { db: 0, dbs: {} };
    const db = Number.isInteger(s.db) ? s.db : 0;
    s.dbs = s.dbs || {};
    s.dbs[db] = { ...(s.dbs[db] || {}), mode: MODE[PANE] };
    history.replaceState(null, "", `${location.pathname}${location.search}#s=${encodeURIComponent(JSON.stringify(s))}`);
  } catch (_) { /* a malformed hash: the page starts from defaults */ }
  document.documentElement.classList.add("popout-page");
}

/** The shared part of the state: everything but each database's mode and the scroll. */
function shared() {
  const s = snapshot();
  delete s.ui;
  for (const d of Object.values(s.s.dbs || {})) delete d.mode;
  return s;
}

function open() {
  if (!channel) {
    channel = new BroadcastChannel(`callpath-link-${linkId}`);
    channel.onmessage = (e) => {
      const m = e.data;
      if (!m || m.from === me || !Array.isArray(m.changes)) return;
      applyChanges(m.changes, { keepMode: true });
      last = shared();
    };
  }
  return channel;
}

function pushState() {
  if (!channel) return;
  const cur = shared();
  const changes = last ? diff(last, cur) : [];
  last = cur;
  if (changes.length) channel.postMessage({ from: me, changes });
}

/** Opens PANE in a new window linked to this one. */
export function popOut(pane) {
  open();
  last = shared();
  const q = new URLSearchParams();
  if (params.get("token")) q.set("token", params.get("token"));
  q.set("popout", pane);
  q.set("link", linkId);
  const url = `${location.pathname}?${q}#s=${encodeURIComponent(JSON.stringify(state))}`;
  return window.open(url, `callpath-${pane}-${linkId}`, "popup,width=1000,height=650");
}

function addButton(where, pane, text, how = "append") {
  if (!where || PANE) return;
  const b = document.createElement("button");
  b.type = "button";
  b.id = `popout-${pane}`;
  b.className = "popout-button";
  b.textContent = text;
  b.title = `open the ${pane} pane in its own window (drag it to another screen); it stays linked to this page`;
  b.onclick = () => popOut(pane === "current" ? currentPane() : pane);
  if (how === "prepend") where.prepend(b); else where.appendChild(b);
}

function currentPane() {
  const d = dbState(state.db);
  return d.mode === "trace" ? "trace" : d.mode === "lines" ? "lines" : "tree";
}

export function startPopout(h) {
  hooks = h;
  const $ = (id) => document.getElementById(id);
  addButton(document.querySelector("#source-pane .pane-bar"), "source", "↗");
  addButton(document.querySelector("#trace .toolbar"), "trace", "↗ Pop out");
  addButton(document.querySelector("#dlg-plot .dlg-buttons"), "graph", "↗ Pop out", "prepend");
  addButton($("mode-tabs"), "current", "↗ Pop out view");
  subscribe("state:saved", pushState);
  if (PANE) {
    document.body.classList.add("popout", `popout-${PANE}`);
    document.title = `callpath view — ${PANE}`;
    open();
    whenReady().then(() => {
      last = shared();
      if (PANE === "graph") showGraph();
    });
    if (PANE === "graph") subscribe("state:applied", showGraph);
  }
}

/** The graph pop-out: the Graph of the selection, re-opened as the selection moves. */
function showGraph() {
  const { plot } = hooks;
  setTimeout(() => {
    if (plot && plot.dlg && plot.dlg.open) plot.dlg.close();
    document.getElementById("tb-plot").click();
  }, 150);
}
