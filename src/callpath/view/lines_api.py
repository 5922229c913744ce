"""The Lines tab's JSON API (PerfVisS, seeds/003; see docs/view.md, "Lines").

Every handler is ``(db, params, body) -> payload`` like :mod:`callpath.view.api`, run with
the database's lock held. All aggregation happens in :mod:`callpath.analysis` (the line ×
context matrix is built once per database, metric and grouping and cached there); a request
returns only what is on screen: the dense window of the detailed view, the compressed
overview, the ranked list, a few instructions. Parameters are validated before any work; a
malformed one is a 400 naming it and what was expected.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.analysis import lines as lm
from callpath.analysis import lines_view as lv
from callpath.analysis.lines_procs import describe
from callpath.analysis.topdown import TopDownView
from callpath.engine.database import Database
from callpath.engine.lines_cache import OverviewParams, overview_of, source_of_file
from callpath.errors import CallpathError
from callpath.view.params import parse_bool, parse_int, parse_json_param
from callpath.view.rows import number

Params = Mapping[str, str]
Handler = Callable[[Database, Params, bytes], Any]

MAX_WINDOW = 400        # lines in one detailed window
MAX_SEGMENTS = 1001     # rectangles wrapped in one request (the window + 1000 procedures)
MAX_AROUND = 50         # assembler: lines around the selected one


def _procedure(m: lm.LineMatrix, d: dict[str, Any] | None) -> dict[str, Any] | None:
    """A procedure of the library with what the page needs: the base name of its file and
    its hottest row (where the detail window goes when it is selected)."""
    if d is None:
        return None
    return {**d, "file_name": _file_name(d["file"]),
            "hot_row": lv.hot_row(m, d["first_row"], d["last_row"])}


# ---- parameters ------------------------------------------------------------------------


def _matrix(db: Database, params: Params) -> lm.LineMatrix:
    exp = db.exp
    metric = parse_int(params, "metric", 0, lo=0, hi=max(len(exp.metrics) - 1, 0))
    group = params.get("group") or "none"
    if group not in lm.GROUPS:
        raise CallpathError(f"parameter 'group': expected one of {', '.join(lm.GROUPS)}, got "
                            f"{group[:40]!r}")
    threads = parse_json_param(params, "threads")
    profiles = None
    if threads:
        if not isinstance(threads, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < len(exp.contexts)
                for t in threads):
            raise CallpathError(f"parameter 'threads': expected a JSON list of context indices "
                                f"0..{len(exp.contexts) - 1}")
        profiles = [exp.contexts[t].index for t in sorted(set(threads))]
    return lm.build_line_matrix(exp, metric, group, profiles)


def _row(m: lm.LineMatrix, params: Params, name: str = "row") -> int:
    if not m.n_rows:
        raise CallpathError("the database has no source line with data: the Lines view is "
                            "empty")
    text = params.get(name)
    if text is None or text == "":
        raise CallpathError(f"parameter {name!r}: expected a line row 0..{m.n_rows - 1}")
    return parse_int(params, name, 0, lo=0, hi=m.n_rows - 1)


def _overview_params(params: Params) -> OverviewParams:
    reduce = params.get("reduce") or "max"
    if reduce not in ("max", "sum"):
        raise CallpathError(f"parameter 'reduce': expected max or sum, got {reduce[:40]!r}")
    return OverviewParams(
        skip=parse_int(params, "skip", 50, lo=0, hi=10**9),
        bin=parse_int(params, "bin", 4, lo=1, hi=10**6),
        reduce=reduce,
        strip=parse_int(params, "strip", 80, lo=1, hi=10**6),
        cbins=parse_int(params, "cbins", 32, lo=1, hi=4096),
        top=parse_bool(params, "ctop"))


def column_groups(n_cols: int, bins: int) -> npt.NDArray[np.int64]:
    """First context of each displayed column when ``n_cols`` contexts are shown in at most
    ``bins`` columns (0: no limit), as the overview bins them (each column the max of its
    contexts)."""
    if bins <= 0 or bins >= n_cols:
        return np.arange(n_cols, dtype=np.int64)
    return np.unique((np.arange(bins, dtype=np.int64) * n_cols) // bins)


def _json_rows(a: npt.NDArray[np.float64]) -> list[list[float | None]]:
    """Rows of a 2-D array as JSON lists (non-finite values as null), converted at once when
    every value is finite (the usual case)."""
    if np.isfinite(a).all():
        out: list[list[float | None]] = a.tolist()
        return out
    return [[number(v) for v in row] for row in a.tolist()]


def _context_indices(db: Database, m: lm.LineMatrix) -> list[list[int]]:
    pos = {c.index: i for i, c in enumerate(db.exp.contexts)}
    return [[pos[p] for p in profs if p in pos] for profs in m.column_profiles]


def _file_name(path: str) -> str:
    return os.path.basename(path) or path


# ---- handlers --------------------------------------------------------------------------


def meta(db: Database, params: Params, body: bytes) -> Any:
    """The axis and the columns: what every pane needs once per (metric, grouping)."""
    m = _matrix(db, params)
    hottest = None
    mx = 0.0
    if len(m.vals):
        k = int(np.argmax(m.vals))
        mx = float(m.vals[k])
        hottest = int(m.nz_rows[np.searchsorted(m.indptr, k, side="right") - 1])
    return {
        "metric": m.metric, "group": m.group, "contexts": m.labels, "short": m.short_labels,
        "rows": m.n_rows, "max": number(mx), "total": number(m.total),
        "hottest_row": hottest,
        # per column, its execution contexts as /contexts indices (the Thread view's terms)
        "context_index": _context_indices(db, m),
        "files": [{"file": f, "name": _file_name(f), "first_row": int(m.file_start[i]),
                   "rows": int(m.file_start[i + 1] - m.file_start[i]),
                   "source": bool(m.readable[i])} for i, f in enumerate(m.files)],
    }


def window(db: Database, params: Params, body: bytes) -> Any:
    """The detailed view: ``count`` rows from ``start``, dense, with the source text, the
    per-line statistics (sorted processor view) and the owning procedure."""
    m = _matrix(db, params)
    start = parse_int(params, "start", 0, lo=0, hi=max(m.n_rows - 1, 0))
    count = parse_int(params, "count", 40, lo=1, hi=MAX_WINDOW)
    cbins = parse_int(params, "cbins", 0, lo=0, hi=4096)
    dense = lm.window(m, start, count)
    rows = np.arange(start, start + len(dense), dtype=np.int64)
    st = lm.line_stats(m, rows)  # over every context, whatever the columns shown
    groups = column_groups(m.n_cols, cbins)
    cols = [{"first": a, "last": b, "label": m.labels[a] if a == b
             else f"{m.labels[a]} … {m.labels[b]}",
             "short": m.short_labels[a] if a == b
             else f"{m.short_labels[a]}–{m.short_labels[b]}"}
            for a, b in zip(groups.tolist(), (np.append(groups[1:], m.n_cols) - 1).tolist(),
                            strict=True)]
    if len(groups) < m.n_cols and len(dense):
        dense = np.maximum.reduceat(dense, groups, axis=1)
    values = _json_rows(dense)  # 100 lines x 1,024 contexts: one conversion, not 10^5 calls
    stats = {k: _json_rows(np.asarray(st[k], dtype=np.float64)[:, None])
             for k in ("sum", "min", "max", "mean", "stdev")}
    out = []
    for i, r in enumerate(rows.tolist()):
        f = int(m.file_of_row[r])
        line = int(m.line_of_row[r])
        src = source_of_file(db, m, f)
        p = int(m.row_proc[r])
        mn, mx = int(st["min_context"][i]), int(st["max_context"][i])
        out.append({
            "row": r, "file": m.files[f], "file_name": _file_name(m.files[f]), "line": line,
            "known": bool(m.known[r]), "gap_before": int(m.gap_before[r]),
            "text": src[line - 1] if src is not None and 0 < line <= len(src) else None,
            "values": values[i],
            "sum": stats["sum"][i][0],
            "min": stats["min"][i][0], "min_context": m.labels[mn],
            "min_short": m.short_labels[mn],
            "max": stats["max"][i][0], "max_context": m.labels[mx],
            "max_short": m.short_labels[mx],
            "mean": stats["mean"][i][0], "stdev": stats["stdev"][i][0],
            "procedure": m.procedures[p] if p >= 0 else None,
            # GPU operations launched here: their time is counted on this line
            "launch": bool(m.launch[r]) if len(m.launch) else False,
        })
    return {"start": start, "count": len(out), "contexts": m.labels, "columns": cols,
            "binned": len(groups) < m.n_cols,
            "max_window": number(float(dense.max())) if dense.size else 0.0,
            "max_program": number(float(m.vals.max())) if len(m.vals) else 0.0,
            "rows": out}


def overview(db: Database, params: Params, body: bytes) -> Any:
    """The compressed overview, bins × columns in axis order (strip ``s`` holds bins
    ``s*strip ..``), and the inverse map ``bin_row`` (the first original row of each bin),
    with which the page maps a click back to its line.

    ``levels``: base64 of uint8 colour levels, 0 for a zero cell and 1..255 for a value
    relative to the overview's maximum (rounded up, so that no cost looks like none): what the
    page draws, a quarter of the float32 values and far more compressible (10^5 lines × 1,024
    contexts binned to 32 columns: 2.6 MB of JSON as float32, the encoding took ~150 ms).
    ``values=1`` adds ``values``, the exact values as base64 little-endian float32."""
    m = _matrix(db, params)
    p = _overview_params(params)
    ov = overview_of(db, m, p)
    key = f"lines-overview-doc:{id(m)}:{p}"
    doc = db.trace_cache.get(key)
    if not isinstance(doc, dict):
        grid = np.ascontiguousarray(ov.values, dtype=np.float64)
        mx = float(grid.max()) if grid.size else 0.0
        levels = np.zeros(grid.shape, dtype=np.uint8)
        if mx > 0:
            levels = np.where(grid > 0, np.clip(np.ceil(grid * (255.0 / mx)), 1, 255), 0
                              ).astype(np.uint8)
        doc = {
            "rows": m.n_rows, "kept": int(ov.kept.sum()), "bins": ov.n_orows, "bin": ov.bin,
            "reduce": ov.reduce, "strip": ov.strip_lines, "strips": ov.n_strips,
            "columns": int(grid.shape[1]) if grid.ndim == 2 else 0, "contexts": m.n_cols,
            "max": number(mx), "levels": base64.b64encode(levels.tobytes()).decode("ascii"),
            "bin_row": ov.inv_first.tolist(), "top": ov.top_index is not None,
        }
        db.trace_cache[key] = doc  # dropped with its overview (engine.lines_cache.overview_of)
    if parse_bool(params, "values"):
        grid32 = np.ascontiguousarray(ov.values, dtype="<f4")
        return {**doc, "values": base64.b64encode(grid32.tobytes()).decode("ascii")}
    return doc


def rects(db: Database, params: Params, body: bytes) -> Any:
    """Row ranges ``segments=[[first, last], ...]`` pushed through the overview's map: per
    segment the pieces ``[strip, first bin in strip, last bin in strip]`` it covers, cut at
    strip ends exactly as the data is: ``[strip, first row in the strip, rows]``."""
    m = _matrix(db, params)
    ov = overview_of(db, m, _overview_params(params))
    segs = parse_json_param(params, "segments") or []
    if not isinstance(segs, list) or len(segs) > MAX_SEGMENTS or not all(
            isinstance(s, list) and len(s) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in s) for s in segs):
        raise CallpathError(f"parameter 'segments': expected a JSON list of at most "
                            f"{MAX_SEGMENTS} [first row, last row] pairs")
    if not ov.n_orows:
        return {"rects": [[] for _ in segs]}
    return {"rects": [[list(r) for r in ov.rectangles(a, b)] for a, b in segs]}


def ranked(db: Database, params: Params, body: bytes) -> Any:
    """The top ``n`` procedures (Figure 5); with ``row``, ``selected`` is the position of that
    line's procedure in the list, appended as ``extra`` when it is not among the top n."""
    m = _matrix(db, params)
    n = parse_int(params, "n", 10, lo=1, hi=1000)
    top = [_procedure(m, d) for d in lm.ranked_procedures(m, n)]
    out: dict[str, Any] = {"procedures": top, "selected": None, "extra": None,
                           "total": number(m.total)}
    if params.get("row"):
        r = _row(m, params)
        p = _procedure(m, lm.procedure_at(m, r))
        if p is not None:
            pos = [i for i, t in enumerate(top) if t is not None and t["index"] == p["index"]]
            if pos:
                out["selected"] = pos[0]
            else:
                out["extra"] = p
                out["selected"] = len(top)
    return out


def locate(db: Database, params: Params, body: bytes) -> Any:
    """A place on the line axis: ``file`` and ``line``, or ``node`` (a key of the view named
    by the view state, as the trees send it) → its row and its procedure's segment."""
    from callpath.view.api import built

    m = _matrix(db, params)
    if params.get("node"):
        b = built(db, params)
        node = b.node(params["node"])
        loc = b.view.location(node)
        if not loc.file and isinstance(b.view, TopDownView):
            up = b.view.launch_line(node)  # GPU time is counted on its launch line
            if up is not None:
                node, loc = up, b.view.location(up)
        if not loc.file:
            raise CallpathError(f"{b.view.label(node)}: no source file is recorded for this "
                                "scope, so it has no place on the line axis")
        r = lv.nearest_row(m, loc.file, loc.line or 0)
        fn = int(b.view.nodes.function[node])
        proc = None
        if b.view.node_type(node) == "function":  # procedure, activation, inlined, caller
            pi = lv.procedure_of_function(m, db.exp, fn)
            if pi is not None:  # a procedure scope: its code segment, at its hottest line
                try:
                    proc = _procedure(m, describe(m, pi))
                except CallpathError:  # its lines are all owned by another procedure
                    proc = None
                if proc is not None:
                    r = proc["hot_row"]
    else:
        file = params.get("file")
        if not file:
            raise CallpathError("parameter 'file': expected a source file (or 'node')")
        line = parse_int(params, "line", 1, lo=0)
        r = lv.nearest_row(m, file, line)
        proc = None
    if proc is None:
        proc = _procedure(m, lm.procedure_at(m, r))
    return {"row": r, "file": m.files[int(m.file_of_row[r])],
            "line": int(m.line_of_row[r]), "procedure": proc}


def contexts(db: Database, params: Params, body: bytes) -> Any:
    """The calling contexts of a line: the Top-down keys of its line scopes, hottest first,
    each with the procedures on its path (what the page lists and opens in Top-down)."""
    m = _matrix(db, params)
    r = _row(m, params)
    metric = parse_int(params, "metric", 0, lo=0)
    threads = parse_json_param(params, "threads") or []  # validated by _matrix
    profiles = [db.exp.contexts[t].index for t in threads] if threads else None
    return {"row": r, "nodes": lv.calling_contexts(db.exp, m, r, metric, limit=200,
                                                    profiles=profiles)}


def asm(db: Database, params: Params, body: bytes) -> Any:
    """Instructions of the selected line ± ``around`` lines, disassembled from the load
    module, with per-instruction costs where the database has them; ``error`` says why there
    are none (the binary cannot be read here)."""
    m = _matrix(db, params)
    r = _row(m, params)
    around = parse_int(params, "around", 2, lo=0, hi=MAX_AROUND)
    f = int(m.file_of_row[r])
    line = int(m.line_of_row[r])
    listing = lm.line_instructions(db.exp, m.files[f], line, around)
    ins = []
    for d in listing:
        item = {k: (number(v) if isinstance(v, float) else v) for k, v in d.items()}
        ip = d.get("address")
        if isinstance(ip, int):
            item["ip"], item["address"] = ip, f"{ip:#x}"
        ins.append(item)
    return {"file": m.files[f], "file_name": _file_name(m.files[f]), "line": line,
            "around": around, "instructions": ins,
            "error": None if ins else (listing.reason or "no instruction of the load "
                                       "module maps to these lines"),
            "note": listing.reason if ins else None}


GETS: dict[str, Handler] = {
    "lines/meta": meta, "lines/window": window, "lines/overview": overview,
    "lines/rects": rects, "lines/ranked": ranked, "lines/locate": locate,
    "lines/contexts": contexts, "lines/asm": asm,
}
