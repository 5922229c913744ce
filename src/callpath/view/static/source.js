// source.js — the source pane: the file of the selected scope with line numbers, its line
// highlighted and scrolled into view; for a procedure activation both the call site (in the
// caller) and the callee; find within the file and copy of the highlighted line.

import { api, ApiError } from "./api.js";
import { publish } from "./store.js";

const ACTIVATION = new Set(["activation", "procedure", "call", "function", "inlined", "caller"]);

export class SourcePane {
  constructor() {
    this.body = document.getElementById("src-body");
    this.fileEl = document.getElementById("src-file");
    this.which = document.getElementById("src-which");
    this.findInput = document.getElementById("src-find");
    this.findCount = document.getElementById("src-find-count");
    this.current = null;   // {db, vs, node, which}
    this.lines = [];
    this.line = 0;
    this.matches = [];
    this.matchAt = -1;
    this.req = 0;
    this.which.addEventListener("click", (e) => {
      const b = e.target.closest("button[data-which]");
      if (b && this.current) this.show(this.current.db, this.current.vs, this.current.row, b.dataset.which);
    });
    this.findInput.addEventListener("input", () => this.find(false));
    this.findInput.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); this.find(true); } });
    document.getElementById("src-find-next").addEventListener("click", () => this.find(true));
    document.getElementById("src-copy").addEventListener("click", () => this.copyLine());
    const pane = document.getElementById("source-pane");
    const tog = document.getElementById("src-toggle");
    tog.addEventListener("click", () => {
      const c = pane.classList.toggle("collapsed");
      tog.setAttribute("aria-expanded", c ? "false" : "true");
    });
    this.body.addEventListener("keydown", (e) => {
      if ((e.ctrlKey || e.metaKey) && e.key === "f") { e.preventDefault(); this.findInput.focus(); }
    });
  }

  /** Shows the source of a row: `which` is "self" (the scope, or the callee) or "callsite". */
  async show(db, vs, row, which) {
    const activation = ACTIVATION.has(row.type) && /[»«]/.test(row.label);
    const callsite = !!row.has_callsite_source;
    if (!which) which = activation && callsite ? "callsite" : "self";
    this.current = { db, vs, row, which };
    this.which.hidden = !activation;
    for (const b of this.which.querySelectorAll("button")) {
      b.setAttribute("aria-pressed", b.dataset.which === which ? "true" : "false");
      b.disabled = b.dataset.which === "callsite" ? !callsite : !row.has_source;
    }
    if (which === "self" ? !row.has_source : !callsite) {
      this.empty(`No source recorded for ${row.label}`);
      return;
    }
    const req = ++this.req;
    let doc;
    try {
      doc = await api.source(db, vs, row.key, which);
    } catch (e) {
      if (req !== this.req) return;
      // a call site may lack a line while the callee has one (and vice versa): try the other
      if (activation && e instanceof ApiError && e.status === 404) {
        const other = which === "callsite" ? "self" : "callsite";
        try {
          doc = await api.source(db, vs, row.key, other);
          which = other;
          this.current.which = other;
          for (const b of this.which.querySelectorAll("button")) b.setAttribute("aria-pressed", b.dataset.which === which ? "true" : "false");
        } catch (_) { /* fall through */ }
      }
      if (!doc) { this.empty(e.message); return; }
    }
    if (req !== this.req) return;
    this.render(doc);
  }

  /** Forgets the file shown (another database was opened: its files are not this one's). */
  clear() {
    this.current = null;
    this.req++;  // a request still in flight for the previous database is dropped
    this.which.hidden = true;
    this.empty("Select a scope to see its source.");
  }

  empty(msg) {
    this.lines = [];
    this.body.dataset.line = "";
    this.body.dataset.file = "";
    this.fileEl.textContent = "No source";
    this.fileEl.title = "";
    this.body.innerHTML = "";
    const d = document.createElement("div");
    d.className = "src-empty";
    d.textContent = msg;
    this.body.appendChild(d);
  }

  render(doc) {
    this.lines = doc.lines || [];
    this.line = doc.line || 0;
    this.fileEl.textContent = `${doc.file}${this.line ? ":" + this.line : ""}`;
    this.body.dataset.line = String(this.line);
    this.body.dataset.file = doc.file;
    this.fileEl.title = doc.path || doc.file;
    const frag = document.createDocumentFragment();
    for (let i = 0; i < this.lines.length; i++) {
      const div = document.createElement("div");
      div.className = "src-line";
      div.dataset.line = String(i + 1);
      const ln = document.createElement("span");
      ln.className = "ln";
      ln.textContent = String(i + 1);
      const tx = document.createElement("span");
      tx.className = "tx";
      tx.textContent = this.lines[i] || " ";
      div.append(ln, tx);
      if (i + 1 === this.line) div.classList.add("hl");
      frag.appendChild(div);
    }
    this.body.innerHTML = "";
    this.body.appendChild(frag);
    this.scrollToLine(this.line);
    if (this.findInput.value) this.find(false);
    publish("source:rendered", { source: this });  // marks over the lines (notes) follow
  }

  scrollToLine(n) {
    const div = this.body.querySelector(`.src-line[data-line="${n}"]`);
    if (!div) return;
    const top = div.offsetTop - this.body.clientHeight / 3;
    this.body.scrollTop = Math.max(0, top);
  }

  /** Highlights every match of the find text; `next` moves to the following one. */
  find(next) {
    const q = this.findInput.value;
    for (const m of this.body.querySelectorAll("mark")) m.replaceWith(document.createTextNode(m.textContent));
    this.body.normalize();
    this.matches = [];
    if (!q) { this.findCount.textContent = ""; return; }
    const lower = q.toLowerCase();
    for (const tx of this.body.querySelectorAll(".src-line .tx")) {
      const text = tx.textContent;
      const lt = text.toLowerCase();
      let at = lt.indexOf(lower);
      if (at < 0) continue;
      const frag = document.createDocumentFragment();
      let prev = 0;
      while (at >= 0) {
        frag.appendChild(document.createTextNode(text.slice(prev, at)));
        const m = document.createElement("mark");
        m.textContent = text.slice(at, at + q.length);
        frag.appendChild(m);
        this.matches.push(m);
        prev = at + q.length;
        at = lt.indexOf(lower, prev);
      }
      frag.appendChild(document.createTextNode(text.slice(prev)));
      tx.textContent = "";
      tx.appendChild(frag);
    }
    if (!this.matches.length) { this.findCount.textContent = "no match"; return; }
    this.matchAt = next ? (this.matchAt + 1) % this.matches.length : 0;
    const m = this.matches[this.matchAt];
    m.classList.add("cur");
    m.scrollIntoView({ block: "center" });
    this.findCount.textContent = `${this.matchAt + 1}/${this.matches.length}`;
  }

  async copyLine() {
    const sel = window.getSelection().toString();
    const text = sel || (this.line ? this.lines[this.line - 1] || "" : "");
    await copyText(text);
  }
}

/** Clipboard write with a fallback for pages not served from a secure context. */
export async function copyText(text) {
  window.__callpathClipboard = text; // the last copied text, for tests and debugging
  try {
    await navigator.clipboard.writeText(text);
  } catch (_) {
    const ta = document.createElement("textarea");
    ta.value = text;
    document.body.appendChild(ta);
    ta.select();
    try { document.execCommand("copy"); } catch (_) { /* nothing more to try */ }
    ta.remove();
  }
}
