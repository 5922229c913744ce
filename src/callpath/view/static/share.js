// share.js — live shared sessions (server side: view/share.py; docs/view.md "Shared sessions").
//
// A page opened with ?session=ID is a participant. It sends every change of its own view
// state as small {t:"set", path, value} messages (sync.js computes them), its cursor
// (selection, trace point, Lines position) as {t:"cursor"}, and draws the other participants:
// a presence bar (name and colour), their selections in the tree, their points in the trace
// view. A participant either FOLLOWS the leader (applies the leader's changes) or EXPLORES
// alone; it can jump to anyone's current view, take the lead, hand it over (leader only),
// and offer its derived metrics and filters to all. Names and notes are always set with
// textContent: nothing a participant types becomes markup in another's page.
//
// Hook for other panes (the Lines tab): the page dispatches
//   document "callpath:remote-cursors" {detail: {cursors: [{id, name, colour, cursor}]}}
// whenever a remote cursor moves, and a pane reports its own position with
//   document.dispatchEvent(new CustomEvent("callpath:cursor", {detail: {part: "lines", value}}))
// (value: any small JSON object; it arrives as cursor[part] at the others).

import { api, shareSocketUrl } from "./api.js";
import { state, dbState, update, subscribe } from "./store.js";
import { snapshot, diff, asChanges, applyChanges, whenReady, setHooks } from "./sync.js";
import { startPopout } from "./popout.js";
import { startNotes } from "./notes.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const MAX_SEND = 60000;

const S = {
  ws: null, me: null, guest: params.has("guest"), leader: null, following: true,
  people: new Map(),   // id -> {id, name, colour, guest}
  states: new Map(),   // id -> Map(path -> value): each participant's current view state
  cursors: new Map(),  // id -> cursor object
  last: null,          // the snapshot last sent
  cursor: {},          // this participant's cursor
  links: null,         // the links returned by "Share" (the sharer's page only)
  ended: false,
  retries: 0,          // reconnection attempts since the socket last opened
  resume: null,        // the last welcome's resume key (see connect)
};
let hooks = null;

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function send(msg) {
  if (!S.ws || S.ws.readyState !== 1) return false;
  const text = JSON.stringify(msg);
  if (text.length > MAX_SEND) return false; // too big to share (a huge expanded list)
  S.ws.send(text);
  return true;
}

function myName() {
  const n = params.get("name") || localStorage.getItem("callpath-name") || "";
  return n.trim().slice(0, 40) || (S.guest ? "guest" : "participant");
}

// ---- sending -----------------------------------------------------------------------------

function pushState() {
  if (!S.ws || S.ws.readyState !== 1 || S.me === null) return;
  const cur = snapshot();
  const changes = S.last ? diff(S.last, cur) : asChanges(cur);
  S.last = cur;
  for (const [path, value] of changes) send({ t: "set", path, value });
  updateCursor({});
}

let cursorTimer = 0;
function updateCursor(parts) {
  const d = dbState(state.db);
  const v = d.views[d.view];
  const lineRow = d.lines && Number.isInteger(d.lines.row) ? d.lines.row : null;
  Object.assign(S.cursor, { db: state.db, mode: d.mode, view: d.view, key: v.sel || null,
                            lines: { row: lineRow } }, parts);
  if (cursorTimer) return;
  cursorTimer = setTimeout(() => { cursorTimer = 0; send({ t: "cursor", value: S.cursor }); }, 40);
}

// ---- receiving ---------------------------------------------------------------------------

function keep(id, path, value) {
  if (!S.states.has(id)) S.states.set(id, new Map());
  const m = S.states.get(id);
  for (const k of [...m.keys()]) if (k.startsWith(path + ".")) m.delete(k);
  m.delete(path);
  m.set(path, value);
}

/** Replaces this page's view by participant id's (following, or a one-off jump). */
function adopt(id) {
  const m = S.states.get(id);
  if (!m || !m.size) return;
  applyChanges([...m.entries()]);
}

function onMessage(ev) {
  let m;
  try { m = JSON.parse(ev.data); } catch (_) { return; }
  switch (m.t) {
    case "welcome":
      S.me = m.you; S.guest = m.guest; S.leader = m.leader; S.resume = m.resume || null;
      S.people = new Map(m.participants.map((p) => [p.id, p]));
      for (const [id, st] of Object.entries(m.states || {})) S.states.set(Number(id), new Map(Object.entries(st)));
      for (const [id, c] of Object.entries(m.cursors || {})) S.cursors.set(Number(id), c);
      document.body.classList.toggle("share-guest", S.guest);
      if (S.guest) for (const b of document.querySelectorAll("#dm-save")) b.disabled = true;
      S.last = null;
      whenReady().then(() => {
        if (S.following && S.leader !== null && S.leader !== S.me) adopt(S.leader);
        pushState();
      });
      break;
    case "join": S.people.set(m.id, { id: m.id, name: m.name, colour: m.colour, guest: m.guest }); break;
    case "leave": S.people.delete(m.id); S.states.delete(m.id); S.cursors.delete(m.id); drawCursors(); break;
    case "set":
      keep(m.from, m.path, m.value);
      if (S.following && m.from === S.leader && S.leader !== S.me) applyChanges([[m.path, m.value]]);
      break;
    case "lead":
      S.leader = m.leader;
      if (S.following && S.leader !== null && S.leader !== S.me) adopt(S.leader);
      break;
    case "cursor": S.cursors.set(m.from, m.value); drawCursors(); break;
    case "offer": showOffer(m); break;
    case "notes": document.dispatchEvent(new CustomEvent("callpath:notes-changed", { detail: { db: m.db } })); break;
  }
  if (m.t !== "cursor") drawBar();
}

function connect(sid) {
  const ws = new WebSocket(shareSocketUrl(sid));
  S.ws = ws;
  ws.onmessage = onMessage;
  // after a drop, the welcome's resume key makes this page its old participant again (same
  // id, colour, lead) if the server still holds the dead connection
  ws.onopen = () => {
    S.retries = 0;
    ws.send(JSON.stringify(S.resume ? { t: "hello", name: myName(), resume: S.resume }
                                    : { t: "hello", name: myName() }));
  };
  ws.onclose = (e) => {
    S.ws = null; S.me = null;
    S.people.clear(); S.cursors.clear();
    drawCursors();
    // no close frame (1006): the network dropped or the laptop slept; the server may still
    // be there: try again a few times before calling the session ended
    if (e.code === 1006 && S.retries < 5) {
      S.retries += 1;
      drawBar(null, `reconnecting (try ${S.retries} of 5)…`);
      setTimeout(() => connect(sid), 1000 * 2 ** (S.retries - 1));
      return;
    }
    S.ended = true;
    drawBar(e.reason || "the shared session ended");
  };
  if (!S.pinging) S.pinging = setInterval(() => send({ t: "ping" }), 25000);
}

// ---- the presence bar --------------------------------------------------------------------

function bar() {
  let b = $("share-bar");
  if (!b) {
    b = el("div", "share-bar");
    b.id = "share-bar";
    b.setAttribute("role", "region");
    b.setAttribute("aria-label", "shared session");
    const tabs = $("mode-tabs");
    (tabs || document.body).appendChild(b);
  }
  return b;
}

function button(id, text, title, onclick) {
  const b = el("button", "", text);
  b.type = "button"; b.id = id; b.title = title; b.onclick = onclick;
  return b;
}

function drawBar(endedReason, status) {
  const b = bar();
  b.innerHTML = "";
  if (status) { b.appendChild(el("span", "share-status", status)); return; }
  if (!S.ws || S.ws.readyState !== 1) {
    if (S.ws) return;  // connecting
    if (endedReason) b.appendChild(el("span", "share-ended", `Session ended: ${endedReason}`));
    else if (!params.get("session") && !params.get("popout")) {
      b.appendChild(button("share-start", "⇄ Share", "start a live session: colleagues open the link and see this view", startSession));
    }
    return;
  }
  const ul = el("ul", "share-people");
  ul.id = "share-people";
  ul.setAttribute("aria-label", "participants");
  for (const p of S.people.values()) {
    const li = el("li", "share-person");
    li.dataset.id = String(p.id);
    const sw = el("span", "share-swatch");
    sw.style.background = p.colour;
    const name = el("span", "share-name", p.name);  // text, never markup
    li.append(sw, name);
    if (p.id === S.leader) li.appendChild(el("span", "share-tag", "lead"));
    if (p.guest) li.appendChild(el("span", "share-tag", "guest"));
    if (p.id === S.me) {
      li.appendChild(el("span", "share-tag", "you"));
      li.title = "change your name";
      li.onclick = () => {
        const n = (window.prompt("Your name in this session", p.name) || "").trim().slice(0, 40);
        if (!n) return;
        localStorage.setItem("callpath-name", n);
        p.name = n;
        send({ t: "name", name: n });
        drawBar();
      };
    } else {
      li.title = `jump to ${p.name}'s view`;
      li.tabIndex = 0;
      li.onclick = () => jumpTo(p.id);
      if (S.leader === S.me && !p.guest) {
        const h = button(`share-handover-${p.id}`, "hand over", `make ${p.name} the leader`, (e) => { e.stopPropagation(); send({ t: "handover", to: p.id }); });
        h.className = "share-handover";
        li.appendChild(h);
      }
    }
    ul.appendChild(li);
  }
  b.appendChild(ul);
  if (S.leader !== S.me) {
    const f = button("share-follow", S.following ? "Following" : "Exploring alone",
      "follow the leader's view, or explore alone", () => {
        S.following = !S.following;
        if (S.following && S.leader !== null) adopt(S.leader);
        drawBar();
      });
    f.setAttribute("aria-pressed", S.following ? "true" : "false");
    b.appendChild(f);
    if (!S.guest) b.appendChild(button("share-lead", "Take the lead", "everyone following sees your view", () => send({ t: "lead" })));
  }
  if (!S.guest) b.appendChild(button("share-offer", "Offer metrics & filters", "offer your derived metrics and filters to everyone", offer));
  if (S.links) b.appendChild(button("share-links", "Links…", "the join link and the read-only guest link", showLinks));
}

function jumpTo(id) {
  S.following = false;
  adopt(id);
  drawBar();
}

async function startSession() {
  let res;
  try { res = await api.shareStart(); } catch (_) { return; }
  S.links = res;
  const q = new URLSearchParams(location.search);
  q.set("session", res.session);
  history.replaceState(null, "", `${location.pathname}?${q}${location.hash}`);
  params.set("session", res.session);
  connect(res.session);
  showLinks();
}

function showLinks() {
  let dlg = $("dlg-share");
  if (!dlg) {
    dlg = el("dialog", "dlg-share");
    dlg.id = "dlg-share";
    document.body.appendChild(dlg);
  }
  dlg.innerHTML = "";
  dlg.appendChild(el("h2", "", "Shared session"));
  const row = (label, value, id) => {
    const l = el("label", "", label);
    const i = el("input");
    i.readOnly = true; i.value = value; i.id = id; i.size = 60;
    const c = button(`${id}-copy`, "Copy", "copy the link", () => navigator.clipboard && navigator.clipboard.writeText(value));
    l.append(i, c);
    dlg.appendChild(l);
  };
  row("Join link (full access): ", S.links.link, "share-link");
  row("Read-only guest link: ", S.links.guest_link, "share-guest-link");
  dlg.appendChild(el("p", "muted", "Anyone with a link joins while this server runs; the guest link cannot save derived metrics or notes."));
  const ok = button("share-links-close", "Close", "", () => dlg.close());
  dlg.appendChild(ok);
  if (!dlg.open) dlg.showModal();
}

function offer() {
  const d = dbState(state.db);
  send({ t: "offer", kind: "derived", value: d.derived || [] });
  send({ t: "offer", kind: "filters", value: state.filters || [] });
}

function showOffer(m) {
  const who = S.people.get(m.from);
  const list = Array.isArray(m.value) ? m.value : [];
  if (!list.length) return;
  const box = el("div", "share-offer");
  box.setAttribute("role", "alert");
  box.dataset.kind = m.kind;
  const what = m.kind === "derived" ? `${list.length} derived metric${list.length > 1 ? "s" : ""}` : `${list.length} filter${list.length > 1 ? "s" : ""}`;
  box.appendChild(el("span", "", `${who ? who.name : "someone"} offers ${what}: ${list.map((x) => x.name || x.pattern).join(", ")} `));
  box.appendChild(button(`share-accept-${m.kind}`, "Accept", "use them in this view", () => {
    update((s, d) => {
      if (m.kind === "derived") d.derived = list;
      else s.filters = list;
    }, { show: true });
    box.remove();
  }));
  box.appendChild(button(`share-dismiss-${m.kind}`, "Dismiss", "", () => box.remove()));
  bar().after(box);
}

// ---- remote cursors ----------------------------------------------------------------------

function remote() {
  const out = [];
  for (const [id, c] of S.cursors) {
    const p = S.people.get(id);
    if (p && c && id !== S.me) out.push({ id, name: p.name, colour: p.colour, cursor: c });
  }
  return out;
}

/** Marks the rows other participants have selected (the tree's rows are pooled: every
 *  draw re-marks them). */
function markTree() {
  const { tree } = hooks;
  const d = dbState(state.db);
  const here = remote().filter((r) => r.cursor.db === state.db && r.cursor.view === d.view && r.cursor.key);
  for (const r of tree.body.children) {
    const old = r.querySelector(".remote-tag");
    if (old) old.remove();
    const who = here.filter((x) => x.cursor.key === r.dataset.key && !r.hidden);
    r.style.boxShadow = who.length ? `inset 4px 0 0 ${who[0].colour}` : "";
    if (!who.length) { delete r.dataset.remote; continue; }
    r.dataset.remote = who.map((x) => x.name).join(", ");
    const tag = el("span", "remote-tag", who.map((x) => x.name).join(", "));
    tag.style.background = who[0].colour;
    r._tree.appendChild(tag);
  }
}

function markTrace() {
  const { trace } = hooks;
  const wrap = trace.canvas.parentElement;
  let layer = wrap.querySelector(".remote-layer");
  if (!layer) { layer = el("div", "remote-layer"); wrap.appendChild(layer); }
  layer.innerHTML = "";
  if (!trace.frame || !trace.win || trace.db !== state.db) return;
  const w = trace.win, W = wrap.clientWidth, H = wrap.clientHeight;
  for (const r of remote()) {
    const t = r.cursor.trace;
    if (r.cursor.db !== state.db || !t || !Number.isFinite(t.t)) continue;
    if (t.t < w.t0 || t.t > w.t1) continue;
    const x = ((t.t - w.t0) / (w.t1 - w.t0)) * W;
    const line = el("div", "remote-vline");
    Object.assign(line.style, { left: `${x}px`, background: r.colour });
    line.dataset.id = String(r.id);
    const row = trace.frame.rows.indexOf(t.ctx);
    if (row >= 0) {
      const rh = H / trace.frame.rows.length;
      const band = el("div", "remote-band");
      Object.assign(band.style, { top: `${row * rh}px`, height: `${Math.max(2, rh)}px`, borderColor: r.colour });
      layer.appendChild(band);
    }
    const tag = el("span", "remote-tag", r.name);
    Object.assign(tag.style, { left: `${x + 3}px`, background: r.colour });
    layer.append(line, tag);
  }
}

/** Marks the Lines tab's rows (heat map, min/max, source: elements with data-row) where
 *  the others are; the tab re-renders its rows, so a MutationObserver re-marks them. */
function markLines() {
  const host = $("lines");
  if (!host) return;
  for (const e of host.querySelectorAll("[data-remote-line]")) {
    e.removeAttribute("data-remote-line"); e.removeAttribute("data-remote");
    e.style.boxShadow = ""; e.style.removeProperty("--remote");
  }
  for (const r of remote()) {
    const row = r.cursor.lines && r.cursor.lines.row;
    if (r.cursor.db !== state.db || r.cursor.mode !== "lines" || !Number.isInteger(row)) continue;
    const els = [...host.querySelectorAll(`[data-row="${row}"]`)]
      .filter((e) => e.tagName !== "CANVAS" && !e.querySelector("[data-row]"));  // rows, not panes
    els.forEach((e, i) => {
      e.dataset.remoteLine = String(r.id);
      e.style.boxShadow = `inset 0 0 0 2px ${r.colour}`;
      if (i === els.length - 1) { e.dataset.remote = r.name; e.style.setProperty("--remote", r.colour); }
    });
  }
}

function drawCursors() {
  if (!hooks) return;
  markTree();
  markTrace();
  markLines();
  document.dispatchEvent(new CustomEvent("callpath:remote-cursors", { detail: { cursors: remote() } }));
}

// ---- start -------------------------------------------------------------------------------

function injectCss() {
  if (document.querySelector("link[href='/static/share.css']")) return;
  const l = document.createElement("link");
  l.rel = "stylesheet"; l.href = "/static/share.css";
  document.head.appendChild(l);
}

/** main.js: links this page to sessions, pop-out windows and notes. ``h``: the panes they
 *  read and drive through their methods, {tree, trace, source, plot, showNode};
 *  ``started``: the promise of the page's first view. */
export function startLinks(h, started) {
  setHooks(h, started);
  startPopout(h);
  startNotes(h);
  startShare(h);
}

function startShare(h) {
  hooks = h;
  injectCss();
  const { tree } = h;
  // redraw the marks after every tree draw and trace repaint (the store's topics)
  subscribe("tree:drawn", markTree);  // the marks are drawn over the pooled rows after each draw
  subscribe("trace:painted", markTrace);
  // this participant's trace point: the pinned one, else the hovered one
  subscribe("trace:point", ({ ctx, t }) => { if (S.ws) updateCursor({ trace: { ctx, t } }); });
  document.addEventListener("callpath:cursor", (e) => {
    if (e.detail && typeof e.detail.part === "string") updateCursor({ [e.detail.part]: e.detail.value ?? null });
  });
  subscribe("state:saved", pushState);
  const linesHost = $("lines");
  if (linesHost) {
    let t = 0;
    new MutationObserver(() => { clearTimeout(t); t = setTimeout(markLines, 20); })
      .observe(linesHost, { childList: true, subtree: true });
  }
  let scrollT = 0;
  tree.scroller.addEventListener("scroll", () => {
    clearTimeout(scrollT);
    scrollT = setTimeout(pushState, 80);
  });
  window.__callpathShare = { S, send, jumpTo, drawCursors };
  const sid = params.get("session");
  if (sid && !params.get("popout")) connect(sid);
  drawBar();
}
