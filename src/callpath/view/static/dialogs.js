// dialogs.js — the derived-metric dialog, the filter window, the execution-context (Thread
// view) selection and Find. Each dialog edits a copy of the state and hands it back on OK, so
// Cancel leaves the view untouched.

import { api } from "./api.js";

const FUNCTIONS = [
  ["avg($1, $2)", "average of the arguments"], ["sum($1, $2)", "sum"], ["min($1, $2)", "minimum"],
  ["max($1, $2)", "maximum"], ["stdev($1, $2)", "sample standard deviation"],
  ["sqrt($1)", "square root"], ["abs($1)", "absolute value"], ["exp($1)", "e to the power"],
  ["ln($1)", "natural logarithm"], ["log($1, 10)", "logarithm in a base"], ["lg($1)", "log base 2"],
  ["pow($1, 2)", "power"], ["mod($1, 2)", "remainder"], ["round($1)", "round"],
  ["floor($1)", "floor"], ["ceil($1)", "ceiling"], ["sign($1)", "sign"], ["pi()", "π"], ["e()", "e"],
];

/** The formula number ($n / @n) of a column: the server's number when given, else its place. */
export function columnNumber(columns, c) {
  if (Number.isInteger(c.number)) return c.number;
  if (c.scope === "inclusive" && Number.isInteger(c.metric)) return 2 * c.metric;
  if (c.scope === "exclusive" && Number.isInteger(c.metric)) return 2 * c.metric + 1;
  return columns.indexOf(c);
}

function insertAt(input, text) {
  const s = input.selectionStart ?? input.value.length;
  const e = input.selectionEnd ?? input.value.length;
  input.value = input.value.slice(0, s) + text + input.value.slice(e);
  input.focus();
  input.setSelectionRange(s + text.length, s + text.length);
}

const HISTORY_KEY = "callpath.derived.history";

/** ctx: {db, columns, derived, onAdd(derivedList, save)} */
export function openDerivedDialog(ctx) {
  const dlg = document.getElementById("dlg-derived");
  const name = document.getElementById("dm-name");
  const formula = document.getElementById("dm-formula");
  const err = document.getElementById("dm-error");
  const metrics = document.getElementById("dm-metrics");
  const funcs = document.getElementById("dm-funcs");
  const custom = document.getElementById("dm-custom");
  err.textContent = "";
  const n = ctx.derived.length + 1;
  let nm = `Derived ${n}`;
  while (ctx.derived.some((d) => d.name === nm)) nm += "'";
  name.value = nm;
  formula.value = "";
  // remembered names and formulas, as hpcviewer's combo boxes
  let history = [];
  try { history = JSON.parse(localStorage.getItem(HISTORY_KEY) || "[]"); } catch (_) { history = []; }
  const dn = document.getElementById("dm-names");
  const df = document.getElementById("dm-formulas");
  dn.innerHTML = ""; df.innerHTML = "";
  for (const h of history) {
    const a = document.createElement("option"); a.value = h.name; dn.appendChild(a);
    const b = document.createElement("option"); b.value = h.formula; df.appendChild(b);
  }
  metrics.innerHTML = "";
  for (const c of ctx.columns) {
    const o = document.createElement("option");
    o.value = String(columnNumber(ctx.columns, c));
    o.textContent = `$${o.value}  ${c.name}`;
    metrics.appendChild(o);
  }
  if (metrics.options.length) metrics.selectedIndex = 0;
  funcs.innerHTML = "";
  for (const [f, what] of FUNCTIONS) {
    const o = document.createElement("option");
    o.value = f; o.textContent = `${f} — ${what}`;
    funcs.appendChild(o);
  }
  funcs.selectedIndex = 0;
  document.getElementById("dm-point").onclick = () => { if (metrics.value) insertAt(formula, `$${metrics.value}`); };
  document.getElementById("dm-agg").onclick = () => { if (metrics.value) insertAt(formula, `@${metrics.value}`); };
  metrics.ondblclick = () => { if (metrics.value) insertAt(formula, `$${metrics.value}`); };
  document.getElementById("dm-insert-func").onclick = () => { if (funcs.value) insertAt(formula, funcs.value); };
  funcs.ondblclick = () => { if (funcs.value) insertAt(formula, funcs.value); };
  document.getElementById("dm-cancel").onclick = () => dlg.close();
  custom.onfocus = () => { dlg.querySelector("input[name=dm-format][value=custom]").checked = true; };

  const submit = async (save) => {
    const nameV = name.value.trim();
    const formulaV = formula.value.trim();
    if (!nameV) { err.textContent = "the metric needs a name"; name.focus(); return; }
    if (ctx.derived.some((d) => d.name === nameV)) { err.textContent = `a derived metric named '${nameV}' exists: choose another name`; name.focus(); return; }
    if (!formulaV) { err.textContent = "the formula is empty: e.g. $0/@0*100"; formula.focus(); return; }
    let res;
    try { res = await api.checkDerived(ctx.db, formulaV, ctx.vs); } catch (e) { err.textContent = e.message; return; }
    if (!res.ok) {
      err.textContent = res.error + (Number.isInteger(res.column) ? ` (at character ${res.column})` : "");
      formula.focus();
      if (Number.isInteger(res.column)) formula.setSelectionRange(Math.max(0, res.column - 1), res.column);
      return;
    }
    let fmt = dlg.querySelector("input[name=dm-format]:checked").value;
    if (fmt === "custom") {
      fmt = custom.value.trim();
      if (!/%[-+ 0#]*\d*(\.\d+)?[diouxXeEfFgG]/.test(fmt)) { err.textContent = `custom format '${fmt}': expected a printf format such as %6.2f`; custom.focus(); return; }
    }
    const d = { name: nameV, formula: formulaV, format: fmt, percent_annotation: document.getElementById("dm-percent").checked };
    history = [{ name: nameV, formula: formulaV }, ...history.filter((h) => h.formula !== formulaV)].slice(0, 20);
    try { localStorage.setItem(HISTORY_KEY, JSON.stringify(history)); } catch (_) { /* private mode */ }
    dlg.close();
    ctx.onAdd([...ctx.derived, d], save);
  };
  document.getElementById("dm-ok").onclick = () => submit(false);
  document.getElementById("dm-save").onclick = () => submit(true);
  formula.onkeydown = (e) => { if (e.key === "Enter") { e.preventDefault(); submit(false); } };
  dlg.showModal();
  formula.focus();
}

const TYPE_NAMES = { self: "Self only", descendants: "Descendants only", all: "Self and descendants" };

/** ctx: {filters, onApply(filters)} */
export function openFiltersDialog(ctx) {
  const dlg = document.getElementById("dlg-filters");
  const list = document.getElementById("flt-list");
  const pattern = document.getElementById("flt-pattern");
  const type = document.getElementById("flt-type");
  const filters = ctx.filters.map((f) => ({ enabled: true, type: "self", ...f }));
  let chosen = -1;
  const draw = () => {
    list.innerHTML = "";
    filters.forEach((f, i) => {
      const tr = document.createElement("tr");
      if (i === chosen) tr.classList.add("chosen");
      const en = document.createElement("input");
      en.type = "checkbox"; en.checked = f.enabled;
      en.setAttribute("aria-label", `enable filter ${f.pattern}`);
      en.onchange = () => { f.enabled = en.checked; };
      const td0 = document.createElement("td"); td0.append(en);
      const td1 = document.createElement("td"); td1.textContent = f.pattern;
      const td2 = document.createElement("td"); td2.textContent = TYPE_NAMES[f.type] || f.type;
      tr.append(td0, td1, td2);
      tr.onclick = (e) => {
        if (e.target === en) return;
        chosen = i; pattern.value = f.pattern; type.value = f.type; draw();
      };
      list.appendChild(tr);
    });
    if (!filters.length) list.innerHTML = '<tr><td colspan="3" class="muted">No filters</td></tr>';
  };
  draw();
  pattern.value = "";
  document.getElementById("flt-add").onclick = () => {
    const p = pattern.value.trim();
    if (!p) { pattern.focus(); return; }
    filters.push({ pattern: p, type: type.value, enabled: true });
    chosen = filters.length - 1; draw();
  };
  pattern.onkeydown = (e) => { if (e.key === "Enter") { e.preventDefault(); document.getElementById("flt-add").click(); } };
  document.getElementById("flt-edit").onclick = () => {
    if (chosen < 0 || !pattern.value.trim()) return;
    filters[chosen] = { ...filters[chosen], pattern: pattern.value.trim(), type: type.value };
    draw();
  };
  document.getElementById("flt-delete").onclick = () => {
    if (chosen < 0) return;
    filters.splice(chosen, 1); chosen = -1; draw();
  };
  document.getElementById("flt-cancel").onclick = () => dlg.close();
  document.getElementById("flt-ok").onclick = () => { dlg.close(); ctx.onApply(filters); };
  dlg.showModal();
}

/** ctx: {db, threads, onApply(threads)} — checkboxes, text or regular-expression filter. */
export async function openThreadsDialog(ctx) {
  const dlg = document.getElementById("dlg-threads");
  const list = document.getElementById("th-list");
  const filter = document.getElementById("th-filter");
  const regex = document.getElementById("th-regex");
  const count = document.getElementById("th-count");
  const err = document.getElementById("th-error");
  const contexts = await api.contexts(ctx.db);
  const chosen = new Set(ctx.threads);
  const matches = (label) => {
    const q = filter.value.trim();
    if (!q) return true;
    if (regex.checked) {
      try { err.textContent = ""; return new RegExp(q).test(label); } catch (e) { err.textContent = `regular expression: ${e.message}`; return false; }
    }
    // a whole-token match, so that "THREAD 1" does not select THREAD 10
    const esc = q.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    return new RegExp(`(^|[^\\w])${esc}($|[^\\w])`, "i").test(label);
  };
  const draw = () => {
    list.innerHTML = "";
    let shown = 0;
    for (const c of contexts) {
      if (!matches(c.label)) continue;
      shown++;
      const lab = document.createElement("label");
      const cb = document.createElement("input");
      cb.type = "checkbox"; cb.checked = chosen.has(c.index); cb.dataset.index = String(c.index);
      cb.onchange = () => { if (cb.checked) chosen.add(c.index); else chosen.delete(c.index); count.textContent = `${chosen.size} chosen`; };
      lab.append(cb, ` ${c.label}`);
      list.appendChild(lab);
    }
    count.textContent = `${shown} of ${contexts.length} shown, ${chosen.size} chosen`;
  };
  filter.value = ""; regex.checked = false; err.textContent = "";
  filter.oninput = draw; regex.onchange = draw;
  document.getElementById("th-check").onclick = () => { for (const cb of list.querySelectorAll("input")) { cb.checked = true; chosen.add(Number(cb.dataset.index)); } count.textContent = `${chosen.size} chosen`; };
  document.getElementById("th-uncheck").onclick = () => { for (const cb of list.querySelectorAll("input")) { cb.checked = false; chosen.delete(Number(cb.dataset.index)); } count.textContent = `${chosen.size} chosen`; };
  document.getElementById("th-cancel").onclick = () => dlg.close();
  document.getElementById("th-all").onclick = () => { dlg.close(); ctx.onApply([]); };
  document.getElementById("th-ok").onclick = () => {
    if (!chosen.size) { err.textContent = "choose at least one execution context (or All)"; return; }
    dlg.close();
    ctx.onApply([...chosen].sort((a, b) => a - b));
  };
  draw();
  dlg.showModal();
  filter.focus();
}

/** ctx: {db, vs, initial, reveal(pathKeys)} */
export function openFindDialog(ctx) {
  const dlg = document.getElementById("dlg-find");
  const text = document.getElementById("fd-text");
  const status = document.getElementById("fd-status");
  const results = document.getElementById("fd-results");
  let matches = [];
  let at = -1;
  if (ctx.initial) text.value = ctx.initial;
  const go = (i) => {
    if (!matches.length) return;
    at = (i + matches.length) % matches.length;
    results.querySelectorAll("li").forEach((li, j) => li.classList.toggle("cur", j === at));
    ctx.reveal(matches[at].keys);
  };
  const run = async () => {
    const q = text.value;
    if (!q) return;
    status.textContent = "searching…";
    const o = { case: document.getElementById("fd-case").checked, word: document.getElementById("fd-word").checked, regex: document.getElementById("fd-regex").checked };
    let res;
    try { res = await api.find(ctx.db, ctx.vs(), q, o); } catch (e) { status.textContent = e.message; return; }
    const raw = res.matches || [];
    matches = raw.map((m) => (Array.isArray(m) ? { keys: m } : { keys: m.path || m.keys, label: m.label }));
    results.innerHTML = "";
    matches.forEach((m, j) => {
      const li = document.createElement("li");
      li.textContent = m.label || (res.labels && res.labels[j]) || m.keys[m.keys.length - 1];
      li.onclick = () => go(j);
      results.appendChild(li);
    });
    status.textContent = matches.length ? `${matches.length} match${matches.length > 1 ? "es" : ""}` : "no match";
    if (matches.length) go(0);
  };
  document.getElementById("fd-go").onclick = run;
  text.onkeydown = (e) => { if (e.key === "Enter") { e.preventDefault(); run(); } };
  document.getElementById("fd-next").onclick = () => go(at + 1);
  document.getElementById("fd-prev").onclick = () => go(at - 1);
  document.getElementById("fd-close").onclick = () => dlg.close();
  dlg.show(); // non-modal: the tree stays usable while stepping through matches
  text.focus();
}
