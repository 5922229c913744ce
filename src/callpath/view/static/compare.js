// compare.js — compare two open databases directly (POST /api/compare): the server builds the
// comparison as `callpath diff` does and opens it as one more database tab, whose every view
// shows base, new, delta and ratio columns and whose flame graph is coloured by the delta.

import { api, showError } from "./api.js";

/**
 * hooks: current() -> the shown database id, databases() -> the list of /api/databases,
 * opened(entry) -> called with the new database's entry once the server has made it.
 */
export function installCompare(button, hooks) {
  const dlg = document.createElement("dialog");
  dlg.id = "dlg-compare";
  dlg.setAttribute("aria-labelledby", "dlg-compare-h");
  dlg.innerHTML = `
    <h2 id="dlg-compare-h">Compare with another database</h2>
    <p class="muted">Contexts are matched by what they are (procedure, load module, call and
    statement lines along the path), as <code>callpath diff</code> does; the comparison opens
    in a new tab.</p>
    <label>Base <select id="cmp-base" aria-label="base database"></select></label>
    <label>New <select id="cmp-new" aria-label="new database"></select></label>
    <div id="cmp-status" class="muted" aria-live="polite"></div>
    <div class="dlg-buttons"><button type="button" id="cmp-cancel">Cancel</button><button type="button" id="cmp-ok" class="primary">Compare</button></div>`;
  document.body.appendChild(dlg);
  const base = dlg.querySelector("#cmp-base");
  const news = dlg.querySelector("#cmp-new");
  const status = dlg.querySelector("#cmp-status");
  dlg.querySelector("#cmp-cancel").onclick = () => dlg.close();
  button.onclick = () => {
    const dbs = hooks.databases().filter((d) => !d.compare);
    if (dbs.length < 2) { showError("compare: open two databases (callpath view A.d B.d)"); return; }
    for (const sel of [base, news]) {
      sel.innerHTML = "";
      for (const d of dbs) {
        const o = document.createElement("option");
        o.value = String(d.id);
        o.textContent = d.name;
        sel.appendChild(o);
      }
    }
    const cur = hooks.current();
    news.value = String(cur);
    base.value = String((dbs.find((d) => d.id !== cur) || dbs[0]).id);
    status.textContent = "";
    dlg.showModal();
  };
  dlg.querySelector("#cmp-ok").onclick = async () => {
    status.textContent = "comparing…";
    let doc;
    try {
      // quiet: the server's refusal (one line) goes into the dialog, not the error bar
      doc = await api.compare(Number(base.value), Number(news.value));
    } catch (e) {
      status.textContent = e.message;
      return;
    }
    try {
      dlg.close();
      await hooks.opened(doc);
      if (doc.warning) showError(doc.warning);  // metrics that differ by name: say so
    } catch (e) {
      status.textContent = String(e);
    }
  };
}

/** Column configuration of a comparison tab: base, new, delta and ratio of the first metric
 * first (the rest stay available in the Columns dialog). */
export function comparisonColumns() {
  return { order: ["m0i", "m1i", "d0", "d1"], hidden: [], names: {} };
}

/**
 * Coloured bars in the tree's delta columns (any column named "… [delta] (I|E)", as
 * `callpath diff` and Compare… make them): red for more in the new run, blue for less, the
 * bar's length the value's share of the largest |delta| among the rows on screen. Watches the
 * tree's DOM (rows are recycled as it scrolls) and paints only the rendered cells.
 */
export function installDeltaBars(host) {
  let queued = false;
  const paint = () => {
    queued = false;
    const heads = [...host.querySelectorAll(".tv-hcell.tv-metric")];
    const cols = heads.map((h, i) => ({ i, key: h.dataset.key, delta: / \[delta\] \([IE]\)$/.test(h.title.split("\n")[0].split(" — ")[0]) }))
      .filter((c) => c.delta);
    const rows = [...host.querySelectorAll(".tv-row")].filter((r) => r._entry && r._entry.row && !r.hidden);
    for (const c of cols) {
      let max = 0;
      for (const r of rows) max = Math.max(max, Math.abs(r._entry.row.values[c.key] || 0));
      for (const r of rows) {
        const cell = r._cells && r._cells[c.i];
        if (!cell) continue;
        const v = r._entry.row.values[c.key] || 0;
        const pct = max > 0 ? Math.round(100 * Math.abs(v) / max) : 0;
        const color = v > 0 ? "rgba(230,60,60,.35)" : "rgba(60,90,230,.35)";
        cell.style.background = pct ? `linear-gradient(to left, ${color} ${pct}%, transparent ${pct}%)` : "";
        cell.dataset.delta = v > 0 ? "more" : v < 0 ? "less" : "same";
      }
    }
    for (const r of rows) {  // a recycled row that shows no delta column any more
      for (let i = 0; r._cells && i < r._cells.length; i++) {
        if (!cols.some((c) => c.i === i) && r._cells[i].dataset.delta) {
          r._cells[i].style.background = "";
          delete r._cells[i].dataset.delta;
        }
      }
    }
  };
  new MutationObserver(() => {
    if (!queued) { queued = true; requestAnimationFrame(paint); }
  }).observe(host, { childList: true, subtree: true, characterData: true });
}
