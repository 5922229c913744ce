"""The terminal report: the top-down tree with inclusive and exclusive values.

Selection (depth limit, threshold, pruning of hidden subtrees) is vectorised over the whole
tree; only the lines actually printed are formatted in Python, so a 10^6-node database with a
threshold prints its top in well under a second.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import TextIO

import numpy as np
import numpy.typing as npt

from callpath.model import Experiment, Metric, NodeKind
from callpath.model.cct import KIND_NAMES
from callpath.present.labels import node_label, node_name

F64 = npt.NDArray[np.float64]


def visible_nodes(exp: Experiment, inclusive: F64, depth: int | None = None,
                  threshold: float = 0.0) -> npt.NDArray[np.int64]:
    """Preorder indices of the nodes to show.

    A node is shown when it is at most ``depth`` deep, its inclusive value is at least
    ``threshold`` percent of the root's, and every ancestor is shown too (hiding a node hides
    its subtree, as collapsing does in a viewer)."""
    cct = exp.cct
    n = len(cct)
    ok = np.ones(n, dtype=bool)
    if depth is not None:
        ok &= cct.depth <= depth
    if threshold > 0:
        total = abs(float(inclusive[0]))
        ok &= np.abs(inclusive) >= threshold / 100.0 * total
    ok[0] = True
    hidden_roots = np.nonzero(~ok)[0]
    if len(hidden_roots):
        diff = np.zeros(n + 1, dtype=np.int64)
        np.add.at(diff, hidden_roots, 1)
        np.add.at(diff, cct.subtree_end[hidden_roots], -1)
        ok &= np.cumsum(diff[:-1]) == 0
    return np.nonzero(ok)[0]


def format_value(v: float) -> str:
    """hpcviewer's default display: scientific notation with 3 significant digits."""
    if v == 0:
        return "0"
    if not math.isfinite(v):
        return str(v)
    return f"{v:.2e}"


def format_percent(v: float, total: float) -> str:
    if total == 0:
        return ""
    return f"{100.0 * v / total:5.1f}%"


def render_text(exp: Experiment, metric: Metric, nodes: npt.NDArray[np.int64], out: TextIO,
                inclusive: F64, exclusive: F64) -> None:
    """One line per node: inclusive and exclusive value with percent of the root, then the
    indented label."""
    total = float(inclusive[0])
    head_i = f"{metric.name} (I)"
    head_e = f"{metric.name} (E)"
    width = max(16, len(head_i), len(head_e))
    out.write(f"{head_i:>{width}}  {head_e:>{width}}  scope\n")
    depth = exp.cct.depth
    for k in nodes.tolist():
        vi, ve = float(inclusive[k]), float(exclusive[k])
        ci = f"{format_value(vi)} {format_percent(vi, total):>6}"
        ce = f"{format_value(ve)} {format_percent(ve, total):>6}"
        out.write(f"{ci:>{width}}  {ce:>{width}}  {'  ' * int(depth[k])}"
                  f"{node_label(exp, k)}\n")


def json_records(exp: Experiment, nodes: npt.NDArray[np.int64]) -> Iterator[dict[str, object]]:
    """One dictionary per node in preorder, with every metric's inclusive and exclusive value."""
    cct = exp.cct
    cols: list[tuple[str, F64]] = []
    for m in exp.metrics:
        cols.append((f"{m.name} (I)", exp.inclusive(m)))
        cols.append((f"{m.name} (E)", exp.exclusive(m)))
    for k in nodes.tolist():
        kind = int(cct.kind[k])
        par = int(cct.parent[k])
        f = int(cct.function[k])
        fn = exp.functions[f] if f >= 0 else None
        mod = int(cct.module[k]) if int(cct.module[k]) >= 0 else (fn.module if fn else -1)
        fil = int(cct.file[k]) if int(cct.file[k]) >= 0 else (fn.file if fn else -1)
        line: int | None = int(cct.line[k]) if int(cct.file[k]) >= 0 else None
        if line is None and fn is not None and fn.file >= 0:
            line = fn.line
        yield {
            "id": int(cct.ctx_id[k]),
            "parent": int(cct.ctx_id[par]) if par >= 0 else None,
            "depth": int(cct.depth[k]),
            "type": "entry" if kind == NodeKind.ROOT else KIND_NAMES[NodeKind(kind)],
            "name": node_name(exp, k),
            "label": node_label(exp, k),
            "module": exp.modules[mod].path if mod >= 0 else None,
            "file": exp.files[fil].path if fil >= 0 else None,
            "line": line,
            "metrics": {name: float(vals[k]) for name, vals in cols},
        }


def render_json(exp: Experiment, nodes: npt.NDArray[np.int64], out: TextIO) -> None:
    """A JSON array, one object per line, streamed so large trees need no big string."""
    out.write("[\n")
    first = True
    for rec in json_records(exp, nodes):
        if not first:
            out.write(",\n")
        out.write(json.dumps(rec))
        first = False
    out.write("\n]\n")


def render_contexts(exp: Experiment, out: TextIO) -> None:
    """The execution contexts, one per line: profile index, short and full label."""
    out.write(f"{'profile':>7}  {'short':<10}  identifiers\n")
    for p in exp.profiles:
        if p.is_summary:
            short, label = "summary", "(summary of all contexts)"
        else:
            short, label = p.short_label(exp.id_names), p.label(exp.id_names)
        out.write(f"{p.index:>7}  {short:<10}  {label}\n")
    out.write(f"{len(exp.contexts)} execution contexts\n")
