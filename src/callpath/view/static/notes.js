// notes.js — notes pinned to a calling context, a source line or a trace interval, saved with
// the database by the server (view/notes.py) and shown in every view: a pin on the tree row,
// a marked line number in the source pane and in the Lines tab, a band over the trace
// interval, and the list in the Notes panel. Texts and names are set with textContent only (never markup).
// The Lines tab may draw them too: the page dispatches document "callpath:notes"
// {detail: {db, notes}} whenever the notes of the shown database change.
//
// The marks follow the panes through the store's topics (store.js): "tree:drawn",
// "trace:painted", "source:rendered" redraw them, "view:shown" loads another database's
// notes, "selection" refreshes the anchors the panel offers. Nothing polls.

import { api } from "./api.js";
import { state, dbState, update, subscribe } from "./store.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
let hooks = null;
let notes = [];
let loadedDb = null;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

const guest = () => params.has("guest") || document.body.classList.contains("share-guest");

async function load() {
  const db = state.db;
  let got;
  try { got = (await api.notes(db)).notes || []; } catch (_) { got = []; }
  if (db !== state.db) { load(); return; }  // another database came on screen meanwhile
  notes = got;
  loadedDb = db;
  drawAll();
  document.dispatchEvent(new CustomEvent("callpath:notes", { detail: { db, notes } }));
}

function anchorText(a) {
  if (a.kind === "node") return `${a.view}: ${a.label || a.key}`;
  if (a.kind === "line") return `${a.file}:${a.line}`;
  return `trace interval, contexts ${a.c0}–${a.c1 - 1}`;
}

/** The anchors this page can offer for a new note right now. */
function anchors() {
  const { tree, trace, source } = hooks;
  const d = dbState(state.db);
  const out = [];
  if (d.mode === "trace" && trace.win) {
    const w = trace.win;
    out.push({ kind: "interval", t0: Math.floor(w.t0), t1: Math.ceil(w.t1), c0: w.c0, c1: w.c1 });
  }
  const sel = tree.selected && tree.selected.row;
  if (sel && d.mode === "profile") out.push({ kind: "node", view: d.view, key: sel.key, label: sel.label });
  const file = source.body.dataset.file, line = Number(source.body.dataset.line);
  if (file && line > 0 && d.mode === "profile") out.push({ kind: "line", file, line });
  if (d.mode === "lines") {  // the line selected in the Lines tab
    const at = linesRowAt(document.querySelector("#lines .ln-srow.sel"));
    if (at) out.push({ kind: "line", file: at.file, line: at.line });
  }
  return out;
}

/** The file and line of a Lines-tab source row (its title is "FILE:LINE[  in PROC]"). */
function linesRowAt(row) {
  const m = row && /^(.*):(\d+)(?: {2}in .*)?$/s.exec(row.title || "");
  return m && Number(m[2]) > 0 ? { file: m[1], line: Number(m[2]) } : null;
}

const base = (f) => f.split("/").pop();

/** Marks the Lines tab's source rows that carry a note (re-marked as the tab re-renders). */
function markLines() {
  const host = document.getElementById("lines");
  if (!host) return;
  const here = loadedDb === state.db ? notes.filter((n) => n.anchor.kind === "line") : [];
  for (const row of host.querySelectorAll(".ln-srow")) {
    const at = linesRowAt(row);
    const mine = at ? here.filter((n) => n.anchor.line === at.line && base(n.anchor.file) === base(at.file)) : [];
    row.classList.toggle("noted", mine.length > 0);
    if (mine.length) row.dataset.notes = mine.map((n) => `${n.author}: ${n.text}`).join("\n");
    else delete row.dataset.notes;
  }
}

function panel() {
  let p = $("notes-panel");
  if (p) return p;
  p = el("section", "notes-panel");
  p.id = "notes-panel";
  p.hidden = true;
  p.setAttribute("aria-label", "notes");
  document.body.appendChild(p);
  return p;
}

function drawPanel() {
  const p = panel();
  if (p.hidden) return;
  const typed = $("note-text") ? $("note-text").value : "";
  p.innerHTML = "";
  const head = el("div", "row");
  head.appendChild(el("strong", "", `Notes on ${loadedDb === null ? "" : "this database"} (${notes.length})`));
  const close = el("button", "", "×");
  close.type = "button"; close.setAttribute("aria-label", "close the notes"); close.onclick = () => { p.hidden = true; };
  head.appendChild(close);
  p.appendChild(head);
  const ol = el("ol");
  ol.id = "notes-list";
  for (const n of notes) {
    const li = el("li", "note");
    li.dataset.id = n.id;
    li.appendChild(el("div", "note-meta", `${n.author} · ${n.created.replace("T", " ").replace("Z", "")} · ${anchorText(n.anchor)}`));
    li.appendChild(el("div", "note-text", n.text));
    const go = el("button", "", "Show");
    go.type = "button"; go.title = "go to what the note is pinned to"; go.onclick = () => goTo(n.anchor);
    li.appendChild(go);
    if (!guest()) {
      const del = el("button", "", "Delete");
      del.type = "button";
      del.onclick = async () => { await api.deleteNote(state.db, n.id).catch(() => {}); load(); };
      li.appendChild(del);
    }
    ol.appendChild(li);
  }
  p.appendChild(ol);
  const form = el("div", "note-form");
  const choices = anchors();
  const sel = el("select");
  sel.id = "note-anchor";
  sel.setAttribute("aria-label", "what the note is pinned to");
  choices.forEach((a, i) => { const o = el("option", "", anchorText(a)); o.value = String(i); sel.appendChild(o); });
  const who = el("input");
  who.id = "note-author"; who.placeholder = "your name"; who.setAttribute("aria-label", "your name");
  who.value = params.get("name") || localStorage.getItem("callpath-name") || "";
  const text = el("textarea");
  text.id = "note-text"; text.rows = 3; text.value = typed; text.placeholder = "note"; text.setAttribute("aria-label", "note text");
  const add = el("button", "", "Add note");
  add.type = "button"; add.id = "note-add";
  add.disabled = guest() || !choices.length;
  add.title = guest() ? "read-only guest link: notes cannot be saved" : "save the note with the database";
  add.onclick = async () => {
    const a = choices[Number(sel.value)];
    if (!a || !text.value.trim()) return;
    const author = who.value.trim() || "anonymous";
    localStorage.setItem("callpath-name", author);
    try {
      await api.saveNote(state.db, { author, text: text.value, anchor: a });
    } catch (_) { return; }
    text.value = "";
    load();
  };
  form.append(sel, who, text, add);
  p.appendChild(form);
}

async function goTo(a) {
  if (a.kind === "interval") {
    await update((s, d) => {
      d.mode = "trace";
      d.trace = { ...(d.trace || {}), t0: a.t0, t1: a.t1, c0: a.c0, c1: a.c1 };
      hooks.trace.adopt(d.trace, s.db, { depth: false });  // an open trace takes the window now
    }, { show: true });
  } else if (a.kind === "node") {
    if (a.view === "top-down") { await hooks.showNode(a.key); return; }
    await update((s, d) => { d.mode = "profile"; d.view = a.view; d.views[a.view].sel = a.key; }, { show: true });
  }
}

// ---- marks in the views --------------------------------------------------------------------

function markTree() {
  const d = dbState(state.db);
  const here = notes.filter((n) => n.anchor.kind === "node" && n.anchor.view === d.view && loadedDb === state.db);
  for (const r of hooks.tree.body.children) {
    const old = r.querySelector(".note-pin");
    if (old) old.remove();
    const mine = here.filter((n) => n.anchor.key === r.dataset.key);
    if (!mine.length || r.hidden) continue;
    const pin = el("span", "note-pin", "✎");
    pin.title = mine.map((n) => `${n.author}: ${n.text}`).join("\n");
    pin.setAttribute("aria-label", `${mine.length} note${mine.length > 1 ? "s" : ""}`);
    r._tree.appendChild(pin);
  }
}

function markSource() {
  const body = hooks.source.body;
  const file = body.dataset.file;
  for (const l of body.querySelectorAll(".src-line.noted")) { l.classList.remove("noted"); l.title = ""; }
  if (!file || loadedDb !== state.db) return;
  for (const n of notes) {
    if (n.anchor.kind !== "line" || n.anchor.file.split("/").pop() !== file) continue;
    const l = body.querySelector(`.src-line[data-line="${n.anchor.line}"]`);
    if (l) { l.classList.add("noted"); l.title = `${l.title ? l.title + "\n" : ""}${n.author}: ${n.text}`; }
  }
}

function markTrace() {
  const { trace } = hooks;
  const wrap = trace.canvas.parentElement;
  let layer = wrap.querySelector(".note-layer");
  if (!layer) { layer = el("div", "note-layer"); wrap.appendChild(layer); }
  layer.innerHTML = "";
  if (!trace.win || trace.db !== state.db || loadedDb !== state.db) return;
  const w = trace.win, W = wrap.clientWidth, H = wrap.clientHeight, n = w.c1 - w.c0;
  for (const note of notes) {
    const a = note.anchor;
    if (a.kind !== "interval" || a.t1 < w.t0 || a.t0 > w.t1 || a.c1 <= w.c0 || a.c0 >= w.c1) continue;
    const x0 = Math.max(0, ((a.t0 - w.t0) / (w.t1 - w.t0)) * W), x1 = Math.min(W, ((a.t1 - w.t0) / (w.t1 - w.t0)) * W);
    const y0 = Math.max(0, ((a.c0 - w.c0) / n) * H), y1 = Math.min(H, ((a.c1 - w.c0) / n) * H);
    const band = el("div", "note-band");
    Object.assign(band.style, { left: `${x0}px`, width: `${Math.max(2, x1 - x0)}px`, top: `${y0}px`, height: `${Math.max(2, y1 - y0)}px` });
    band.dataset.id = note.id;
    band.appendChild(el("span", "", `✎ ${note.author}: ${note.text}`));
    layer.appendChild(band);
  }
}

function drawAll() {
  if (!hooks) return;
  markTree();
  markSource();
  markTrace();
  markLines();
  drawPanel();
  const b = $("notes-toggle");
  if (b) b.textContent = `✎ Notes (${notes.length})`;
}

/** share.js: draws the notes in the panes it is handed ({tree, trace, source, showNode}),
 *  read only; they are redrawn on the store's topics. */
export function startNotes(h) {
  hooks = h;
  subscribe("tree:drawn", markTree);  // the marks are drawn over the pooled rows after each draw
  subscribe("trace:painted", markTrace);
  subscribe("source:rendered", markSource);
  const b = el("button", "", "✎ Notes");
  b.type = "button"; b.id = "notes-toggle"; b.title = "notes pinned to calling contexts, source lines and trace intervals";
  b.onclick = () => { const p = panel(); p.hidden = !p.hidden; drawPanel(); };
  const tabs = $("mode-tabs");
  if (tabs) tabs.appendChild(b);
  const linesHost = $("lines");
  if (linesHost) {
    let t = 0;
    new MutationObserver(() => { clearTimeout(t); t = setTimeout(markLines, 20); })
      .observe(linesHost, { childList: true, subtree: true });
  }
  document.addEventListener("callpath:notes-changed", (e) => { if (!e.detail || e.detail.db === state.db) load(); });
  // another database on screen (a tab, a link, a shared session, a comparison): its notes
  subscribe("view:shown", ({ db }) => { if (loadedDb !== null && loadedDb !== db) load(); });
  // the panel's anchors follow the selection
  subscribe("selection", () => { if (!panel().hidden) drawPanel(); });
  load();
}
