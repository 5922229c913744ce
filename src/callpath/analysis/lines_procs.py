"""Ranked procedures over the line axis (PerfVisS Figure 5) and the procedure of a line.

A procedure is the innermost function scope (a procedure frame or inlined code) around a line
scope, one per (name, module, file, line) as the Flat view counts them. Each axis row belongs
to one procedure (the one with the most cost on that line when two share it), so a
procedure's sum is the sum of its rows' costs and the ranked sums add up to the matrix total
(less lines outside any procedure). A procedure's *code segment* is the range of rows from its
first to its last line in its own file: the rectangle the overview outlines.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from callpath.analysis.lines_matrix import LineMatrix
from callpath.errors import CallpathError


def _proc_sums(m: LineMatrix) -> np.ndarray:
    ok = m.row_proc >= 0
    out: np.ndarray = np.bincount(m.row_proc[ok], weights=m.row_sum[ok],
                                  minlength=len(m.procedures))
    return out


def segments(m: LineMatrix) -> tuple[np.ndarray, np.ndarray]:
    """First and last axis row (inclusive) of every procedure's code segment: its rows in
    its own file (all its rows when none is there); -1 for a procedure without rows.
    Computed once per matrix in two vectorised passes."""
    got = m._memo.get("segments")
    if got is not None:
        return got  # type: ignore[no-any-return]
    n = len(m.procedures)
    rows = np.nonzero(m.row_proc >= 0)[0]
    p = m.row_proc[rows]
    own = m.file_of_row[rows] == m.proc_file[p]
    has_own = np.zeros(n, dtype=bool)
    has_own[p[own]] = True
    use = own | ~has_own[p]
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(n, -1, dtype=np.int64)
    np.minimum.at(first, p[use], rows[use])
    np.maximum.at(last, p[use], rows[use])
    first[last < 0] = -1
    m._memo["segments"] = (first, last)
    return first, last


def segment(m: LineMatrix, proc: int) -> tuple[int, int]:
    """First and last axis row (inclusive) of procedure ``proc``'s code segment."""
    if not 0 <= proc < len(m.procedures):
        raise CallpathError(f"procedure index {proc} out of range (0..{len(m.procedures) - 1})")
    first, last = segments(m)
    if last[proc] < 0:
        raise CallpathError(f"procedure {m.procedures[proc]!r} has no line on the axis")
    return int(first[proc]), int(last[proc])


def describe(m: LineMatrix, proc: int, sums: np.ndarray | None = None,
             rank: int | None = None) -> dict[str, Any]:
    s = _proc_sums(m) if sums is None else sums
    total = m.total
    first, last = segment(m, proc)
    f = int(m.proc_file[proc])
    return {"rank": rank, "procedure": m.procedures[proc], "index": proc,
            "file": m.file_labels[f] if f >= 0 else "", "sum": float(s[proc]),
            "percent": float(100.0 * s[proc] / total) if total else 0.0,
            "first_row": first, "last_row": last}


def ranked_procedures(m: LineMatrix, n: int) -> list[dict[str, Any]]:
    """The top ``n`` procedures by cost, descending: ``rank`` (0-based, as Figure 5),
    ``procedure``, ``index`` (procedure index for :func:`segment`), ``file``, ``sum``,
    ``percent`` of the matrix total, and ``first_row`` / ``last_row`` of the code segment.
    Procedures without cost are not listed; ties keep procedure order."""
    if n < 0:
        raise CallpathError(f"number of ranked procedures {n}: expected at least 0")
    sums = _proc_sums(m)
    order = np.argsort(-sums, kind="stable")
    order = order[sums[order] > 0][:n]
    return [describe(m, int(p), sums, rank=i) for i, p in enumerate(order.tolist())]


def procedure_at(m: LineMatrix, row: int) -> dict[str, Any] | None:
    """The procedure owning axis row ``row`` (as in :func:`ranked_procedures`, with its
    ``rank`` among all procedures), or None when no procedure scope covers the line."""
    if not 0 <= row < m.n_rows:
        raise CallpathError(f"line row {row} out of range (0..{m.n_rows - 1})")
    p = int(m.row_proc[row])
    if p < 0:
        # a line between scopes (a comment, a blank): the innermost procedure of this file
        # whose segment covers it
        first, last = segments(m)
        cover = np.nonzero((first <= row) & (last >= row)
                           & (m.file_of_row[np.maximum(first, 0)] == m.file_of_row[row]))[0]
        if not len(cover):
            return None
        p = int(cover[np.argmin(last[cover] - first[cover])])
    sums = _proc_sums(m)
    rank = int(np.sum(sums > sums[p]) + np.sum(sums[:p] == sums[p]))
    return describe(m, p, sums, rank=rank)
