"""What the viewer's Lines tab needs beside :mod:`callpath.analysis.lines`: translations
between the line axis and the trees (the linked cursors of PerfVisS, seeds/003), each a
vectorised pass over arrays the matrix already holds.

- :func:`nearest_row`: a (file, line) that a tree scope names → its axis row, the closest
  row of that file when the line itself is not on the axis (a declaration line of a file
  whose source cannot be read).
- :func:`procedure_of_function`: a tree's procedure scope → the matrix's procedure (one per
  name, module, file and line, as the Flat view counts them).
- :func:`hot_row`: the row of a segment with the most cost (where the detail window goes).
- :func:`calling_contexts`: a line → its line scopes in the calling context tree (Top-down
  keys ``t<context id>``), hottest first, each with the procedures on its call path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from callpath.analysis.lines_matrix import LineMatrix, file_index
from callpath.errors import CallpathError
from callpath.model import Experiment, NodeKind


def nearest_row(m: LineMatrix, file: str | int, line: int) -> int:
    """The axis row of ``line`` in ``file``, else the nearest row of that file."""
    fi = file_index(m, file)
    lo, hi = int(m.file_start[fi]), int(m.file_start[fi + 1])
    if hi <= lo:
        raise CallpathError(f"file {m.file_labels[fi]} has no line on the axis")
    lines = m.line_of_row[lo:hi]
    k = int(np.searchsorted(lines, int(line)))
    if k >= len(lines):
        return hi - 1
    if k > 0 and int(line) - int(lines[k - 1]) < int(lines[k]) - int(line):
        k -= 1
    return lo + k


def procedure_of_function(m: LineMatrix, exp: Experiment, function: int) -> int | None:
    """The matrix's procedure index for ``exp.functions[function]`` (None when the matrix has
    no line of it): procedures are identified by (name, module, file, line)."""
    if not 0 <= function < len(exp.functions):
        return None
    f = exp.functions[function]
    want = (f.name, f.module, f.file, f.line)
    for p, fn in enumerate(m.proc_function.tolist()):
        g = exp.functions[fn]
        if (g.name, g.module, g.file, g.line) == want:
            return p
    return None


def hot_row(m: LineMatrix, first: int, last: int) -> int:
    """The row of ``first..last`` (inclusive) with the largest sum (``first`` when none)."""
    seg = m.row_sum[first:last + 1]
    return first + int(np.argmax(seg)) if len(seg) and float(seg.max()) > 0 else first


def calling_contexts(exp: Experiment, m: LineMatrix, row: int, metric: int,
                     limit: int = 200, profiles: list[int] | None = None
                     ) -> list[dict[str, Any]]:
    """The line scopes of the tree on axis row ``row``, by decreasing exclusive value of
    metric ``metric`` (the summary's, or summed over ``profiles``, the Thread view's
    contexts): ``key`` (the Top-down key ``t<context id>``), ``value`` and ``path`` (the
    procedures from the outermost to the line, joined by " > ")."""
    cct = exp.cct
    nodes = np.nonzero(m.node_rows() == int(row))[0]
    if not len(nodes):
        return []
    try:
        if profiles:
            vals = np.zeros(len(nodes))
            for p in profiles:  # the Thread view's few contexts: one dense read each
                vals += m.charged(exp.values_in(p, metric, "function"))[nodes]
        else:
            vals = m.charged(exp.exclusive(metric))[nodes]
    except CallpathError:
        vals = np.zeros(len(nodes))
    order = np.lexsort((nodes, -vals))[:limit]
    out = []
    for i in order.tolist():
        n = int(nodes[i])
        names: list[str] = []
        p = int(cct.parent[n])
        while p >= 0 and len(names) < 64:  # the chain of one node: its depth, not the tree
            if cct.kind[p] == NodeKind.FUNCTION and int(cct.function[p]) >= 0:
                names.append(exp.functions[int(cct.function[p])].name or "?")
            p = int(cct.parent[p])
        out.append({"key": f"t{int(cct.ctx_id[n])}", "value": float(vals[i]),
                    "path": " > ".join(reversed(names)) or "(root)"})
    return out
