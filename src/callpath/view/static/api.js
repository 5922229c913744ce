// api.js — the request layer: every request to the server goes through here (no other module
// calls fetch; tests/test_view_frontend_rules.py checks it), so that the access token (when the
// server binds a non-loopback address) is sent on each request, JSON is read in one way, and
// every error reaches the dismissable error bar in one place (or is handed back quietly).

const token = new URLSearchParams(location.search).get("token");

/** Headers for a request: the token header when the page was opened with ?token=. */
export function headers(extra = {}) {
  const h = { ...extra };
  if (token) h["X-Callpath-Token"] = token;
  return h;
}

/** Shows a one-line error in the bar at the top of the page (dismissable). */
export function showError(message) {
  const bar = document.getElementById("error-bar");
  const text = document.getElementById("error-text");
  if (!bar || !text) return;
  text.textContent = String(message);
  bar.hidden = false;
}

export function clearError() {
  const bar = document.getElementById("error-bar");
  if (bar) bar.hidden = true;
}

/** The query string of a view request: the view state every endpoint understands. */
export function stateQuery(vs, extra = {}) {
  const q = new URLSearchParams();
  q.set("view", vs.view);
  if (vs.filters && vs.filters.length) q.set("filters", JSON.stringify(vs.filters));
  if (vs.derived && vs.derived.length) q.set("derived", JSON.stringify(vs.derived));
  if (vs.threads && vs.threads.length) q.set("threads", JSON.stringify(vs.threads));
  if (vs.view === "flat" && vs.flatten) q.set("flatten", String(vs.flatten));
  if (vs.zoom) q.set("zoom", vs.zoom);
  for (const [k, v] of Object.entries(extra)) {
    if (v === undefined || v === null) continue;
    q.set(k, typeof v === "string" ? v : typeof v === "number" || typeof v === "boolean" ? String(v) : JSON.stringify(v));
  }
  return q.toString();
}

async function errorOf(resp) {
  let msg = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    if (body && body.error) msg = body.error;
  } catch (_) { /* not JSON */ }
  return msg;
}

export class ApiError extends Error {
  constructor(message, status) { super(message); this.status = status; }
}

// An ApiError has been shown in the error bar (or was asked to be quiet) where it was raised:
// a caller that lets it go (an expansion, a sort, a save started from a click) must not turn
// it into an uncaught error as well.
window.addEventListener("unhandledrejection", (ev) => {
  if (ev.reason instanceof ApiError) ev.preventDefault();
});

/** fetch, with a network failure (the server stopped, the tunnel closed) turned into an
 *  ApiError shown in the error bar, as an error status is. */
async function request(url, init, quiet) {
  try {
    return await fetch(url, { credentials: "same-origin", ...init });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    const msg = `the server did not answer ${url.split("?")[0]}: ${e.message}`;
    if (!quiet) showError(msg);
    throw new ApiError(msg, 0);
  }
}

/** GET a JSON document; raises ApiError with the server's one-line message. */
export async function getJSON(url, { quiet = false, signal } = {}) {
  const resp = await request(url, { headers: headers(), signal }, quiet);
  if (!resp.ok) {
    const msg = await errorOf(resp);
    if (!quiet) showError(msg);
    throw new ApiError(msg, resp.status);
  }
  return resp.json();
}

export async function postJSON(url, body, { quiet = false } = {}) {
  const resp = await request(url, {
    method: "POST", headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(body),
  }, quiet);
  if (!resp.ok) {
    const msg = await errorOf(resp);
    if (!quiet) showError(msg);
    throw new ApiError(msg, resp.status);
  }
  return resp.json();
}

/** GET a file and hand it to the browser as a download (the token travels in the header). */
export async function download(url, filename) {
  const resp = await request(url, { headers: headers() }, false);
  if (!resp.ok) {
    const msg = await errorOf(resp);
    showError(msg);
    throw new ApiError(msg, resp.status);
  }
  const blob = await resp.blob();
  saveBlob(blob, filename);
}

export function saveBlob(blob, filename) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = filename;
  document.body.appendChild(a);
  a.click();
  setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
}

export const api = {
  databases: () => getJSON("/api/databases"),
  filters: () => getJSON("/api/filters", { quiet: true }),
  columns: (db, vs) => getJSON(`/api/db/${db}/columns?${stateQuery(vs)}`),
  children: (db, vs, node, sort, order, offset, limit, opts) =>
    getJSON(`/api/db/${db}/children?${stateQuery(vs, { node, sort, order, offset, limit })}`, opts),
  hotpath: (db, vs, node, column, threshold) =>
    getJSON(`/api/db/${db}/hotpath?${stateQuery(vs, { node, column, threshold })}`),
  find: (db, vs, q, o) =>
    getJSON(`/api/db/${db}/find?${stateQuery(vs, { q, case: o.case ? 1 : 0, word: o.word ? 1 : 0, regex: o.regex ? 1 : 0, limit: o.limit || 100 })}`),
  source: (db, vs, node, which) =>
    getJSON(`/api/db/${db}/source?${stateQuery(vs, { node, which })}`, { quiet: true }),
  contexts: (db) => getJSON(`/api/db/${db}/contexts`),
  path: (db, vs, node) => getJSON(`/api/db/${db}/path?${stateQuery(vs, { node })}`, { quiet: true }),
  plot: (db, vs, node, column) => getJSON(`/api/db/${db}/plot?${stateQuery(vs, { node, column })}`),
  csvUrl: (db, vs, expanded, sort, order, columns) =>
    `/api/db/${db}/csv?${stateQuery(vs, { expanded, sort, order, columns })}`,
  checkDerived: (db, formula, vs) => postJSON(`/api/db/${db}/derived/check${vs ? "?" + stateQuery(vs) : ""}`, { formula }, { quiet: true }),
  saveDerived: (db, derived) => postJSON(`/api/db/${db}/derived/save`, derived),
  compare: (base, news) => postJSON("/api/compare", { base, new: news }, { quiet: true }),
  notes: (db) => getJSON(`/api/db/${db}/notes`, { quiet: true }),
  saveNote: (db, note) => postJSON(`/api/db/${db}/notes/save`, note),
  deleteNote: (db, id) => postJSON(`/api/db/${db}/notes/delete`, { id }),
  shareStart: () => postJSON("/api/share/start", {}),
  traceMeta: (db) => getJSON(`/api/db/${db}/trace/meta`),
  traceFrame: (db, p, signal) => getJSON(`/api/db/${db}/trace/frame?${new URLSearchParams(p)}`, { signal }),
  traceDepth: (db, p, signal) => getJSON(`/api/db/${db}/trace/depth?${new URLSearchParams(p)}`, { signal }),
  traceCallpath: (db, p, signal) => getJSON(`/api/db/${db}/trace/callpath?${new URLSearchParams(p)}`, { signal, quiet: true }),
  traceSummary: (db, p, signal) => getJSON(`/api/db/${db}/trace/summary?${new URLSearchParams(p)}`, { signal }),
  traceStats: (db, p, signal) => getJSON(`/api/db/${db}/trace/stats?${new URLSearchParams(p)}`, { signal }),
};

/** The WebSocket address of a shared session (the token and the guest flag of this page's
 *  address travel along: a socket cannot carry the token header). */
export function shareSocketUrl(session) {
  const page = new URLSearchParams(location.search);
  const q = new URLSearchParams({ session });
  for (const k of ["token", "guest"]) if (page.get(k)) q.set(k, page.get(k));
  return `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/api/share/ws?${q}`;
}
