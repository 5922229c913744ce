// columns.js — which metric columns a view shows and in which order, and the hide/show dialog
// (check all / uncheck all, rename, edit a derived metric's formula, apply to all views).
//
// A column configuration is {order: [key...], hidden: [key...], names: {key: text}}, kept per
// view in the URL state; columns the server adds later (a new derived metric) are appended.

import { api } from "./api.js";
import { VIEWS } from "./store.js";

/**
 * The measured columns that are zero at every node, hidden while the view has no column
 * configuration of its own: a GPU database has ~100 columns, most of them all-zero, whose
 * headers ran into each other. The badge "N empty columns hidden" shows them in one click.
 */
export function emptyColumns(columns) {
  const empty = columns.filter((c) => c.empty && c.scope !== "derived").map((c) => c.key);
  return empty.length === columns.length ? [] : empty;
}

/** The visible columns, in the configured order, with their display names. */
export function arrange(columns, cfg) {
  const byKey = new Map(columns.map((c) => [c.key, c]));
  const order = [];
  if (cfg && Array.isArray(cfg.order)) for (const k of cfg.order) if (byKey.has(k)) order.push(k);
  // no configuration yet: the column the view opens on, then the time metrics, first (a
  // GPU database's time, GPUOP, came 41st of 53 metrics), the others after them
  const first = cfg ? [] : [...columns.filter((c) => c.open), ...columns.filter((c) => !c.open && c.time && c.scope !== "derived")];
  for (const c of first) if (!order.includes(c.key)) order.push(c.key);
  for (const c of columns) if (!order.includes(c.key)) order.push(c.key);
  const hidden = new Set(cfg ? (cfg.hidden || []) : emptyColumns(columns));
  const names = (cfg && cfg.names) || {};
  return order.filter((k) => !hidden.has(k)).map((k) => ({ ...byKey.get(k), display: names[k] || byKey.get(k).name }));
}

/** Moves column `from` before column `to` in the configured order. */
export function reorder(columns, cfg, from, to) {
  const out = cfg ? { ...cfg } : { order: [], hidden: [], names: {} };
  const order = arrange(columns, { ...out, hidden: [] }).map((c) => c.key);
  const i = order.indexOf(from);
  if (i < 0) return out;
  order.splice(i, 1);
  const j = order.indexOf(to);
  order.splice(j < 0 ? order.length : j, 0, from);
  out.order = order;
  return out;
}

/** The derived metric behind a derived column (matched by name, else by position). */
export function derivedOf(columns, derived, col) {
  if (col.scope !== "derived") return -1;
  let i = derived.findIndex((d) => d.name === col.name || col.name.startsWith(d.name + " "));
  if (i < 0) i = columns.filter((c) => c.scope === "derived").findIndex((c) => c.key === col.key);
  return i < derived.length ? i : -1;
}

/**
 * Opens the hide/show dialog. `ctx` gives {db, columns, dbState, viewName, onApply(dbState)}.
 */
export function openColumnsDialog(ctx) {
  const dlg = document.getElementById("dlg-columns");
  const list = document.getElementById("col-list");
  const err = document.getElementById("col-error");
  const d = ctx.dbState;
  const cfg = d.views[ctx.viewName].cols || { order: [], hidden: [], names: {} };
  const all = arrange(ctx.columns, { ...cfg, hidden: [] });
  const hidden = new Set(d.views[ctx.viewName].cols ? (cfg.hidden || []) : emptyColumns(ctx.columns));
  const derived = (d.derived || []).map((x) => ({ ...x }));
  err.textContent = "";
  list.innerHTML = "";
  for (const c of all) {
    const tr = document.createElement("tr");
    tr.dataset.key = c.key;
    const empty = c.aggregate === 0 || c.aggregate === null;
    if (empty && c.scope !== "derived") tr.classList.add("empty");
    const show = document.createElement("input");
    show.type = "checkbox";
    show.checked = !hidden.has(c.key);
    show.setAttribute("aria-label", `show ${c.name}`);
    const name = document.createElement("input");
    name.type = "text";
    name.value = (cfg.names || {})[c.key] || c.name;
    name.setAttribute("aria-label", `name of ${c.name}`);
    const formula = document.createElement("input");
    formula.type = "text";
    const di = derivedOf(ctx.columns, derived, c);
    if (di >= 0) { formula.value = derived[di].formula; formula.dataset.derived = String(di); }
    else { formula.disabled = true; formula.value = ""; formula.placeholder = "measured"; }
    formula.setAttribute("aria-label", `formula of ${c.name}`);
    const td = (x) => { const t = document.createElement("td"); t.appendChild(x); return t; };
    tr.append(td(show), td(name), td(formula));
    list.appendChild(tr);
  }
  const setAll = (v) => { for (const b of list.querySelectorAll("input[type=checkbox]")) b.checked = v; };
  document.getElementById("col-check-all").onclick = () => setAll(true);
  document.getElementById("col-uncheck-all").onclick = () => setAll(false);
  document.getElementById("col-cancel").onclick = () => dlg.close();
  document.getElementById("col-ok").onclick = async () => {
    const next = { order: all.map((c) => c.key), hidden: [], names: {} };
    let derivedChanged = false;
    for (const tr of list.querySelectorAll("tr")) {
      const [show, name, formula] = tr.querySelectorAll("input");
      const key = tr.dataset.key;
      const col = all.find((c) => c.key === key);
      if (!show.checked) next.hidden.push(key);
      if (name.value.trim() && name.value.trim() !== col.name) next.names[key] = name.value.trim();
      if (formula.dataset.derived !== undefined) {
        const i = Number(formula.dataset.derived);
        if (formula.value.trim() !== derived[i].formula) {
          const chk = await api.checkDerived(ctx.db, formula.value.trim(), ctx.vs).catch((e) => ({ ok: false, error: e.message }));
          if (!chk.ok) { err.textContent = `${col.name}: ${chk.error}`; formula.focus(); return; }
          derived[i].formula = formula.value.trim();
          derivedChanged = true;
        }
      }
    }
    const views = document.getElementById("col-all-views").checked ? VIEWS : [ctx.viewName];
    for (const v of views) d.views[v].cols = JSON.parse(JSON.stringify(next));
    if (derivedChanged) d.derived = derived;
    dlg.close();
    ctx.onApply(derivedChanged);
  };
  dlg.showModal();
}
