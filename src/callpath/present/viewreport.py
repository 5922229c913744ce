"""Render rows of any view (Top-down, Bottom-up, Flat) as text, JSON or CSV.

The rows are what the analysis layer decided to show (``analysis.navigate.expand``); this
module only formats them. Values of every column are computed once for the whole view and
indexed by row, so the cost is in the analysis, not here.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Sequence
from typing import TextIO

import numpy as np
import numpy.typing as npt

from callpath.analysis.columns import ColumnDef, ColumnSet
from callpath.analysis.topdown import View

F64 = npt.NDArray[np.float64]

Row = tuple[int, int]  # (node, indent)


def format_value(v: float) -> str:
    """hpcviewer's default display: scientific notation with 3 significant digits."""
    if v == 0:
        return "0"
    if not math.isfinite(v):
        return ""
    return f"{v:.2e}"


def _percent_base(columns: ColumnSet, view: View, col: ColumnDef
                  ) -> npt.NDArray[np.float64]:
    """The values whose root value is a column's 100%: an exclusive column's percentages are
    of its metric's inclusive root, as hpcviewer prints them (the exclusive value at the
    root is 0 or tiny, which left exclusive columns with no percentage at all)."""
    if col.scope == "exclusive" and col.metric is not None and col.derived is None:
        for c in columns.columns:
            if c.metric == col.metric and c.scope == "inclusive" and c.derived is None:
                return columns.values(view, c)
    return columns.values(view, col)


def cells(columns: ColumnSet, view: View, col: ColumnDef, nodes: list[int]) -> list[str]:
    """The text of ``col`` at ``nodes``, as the report prints it and the viewer shows it: the
    column's value format, else the value and its percentage of the column's total."""
    vals = columns.values(view, col)
    sub = vals[np.asarray(nodes, dtype=np.int64)] if nodes else np.zeros(0)
    fmt = col.value_format
    if fmt is not None:
        return fmt.format_column(sub, columns.aggregate_scalar(view, col))
    total = float(_percent_base(columns, view, col)[0])
    out = []
    for v in sub.tolist():
        # zero reads one way in every column: "0", never "0 0.0%" beside a bare "0"
        pct = f"{100.0 * v / total:5.1f}%" if total and v and math.isfinite(v) else ""
        text = format_value(v)
        out.append(f"{text} {pct:>6}" if text else "")
    return out


def render_text(columns: ColumnSet, view: View, cols: Sequence[ColumnDef], rows: list[Row],
                out: TextIO) -> None:
    """A column per metric, then the indented scope label."""
    nodes = [n for n, _ in rows]
    texts = [cells(columns, view, c, nodes) for c in cols]
    widths = [max([16, len(c.title)] + [len(s) for s in cs]) for c, cs in zip(cols, texts,
                                                                               strict=True)]
    head = "  ".join(f"{c.title:>{w}}" for c, w in zip(cols, widths, strict=True))
    out.write(f"{head}  scope\n")
    for r, (node, indent) in enumerate(rows):
        line = "  ".join(f"{cs[r]:>{w}}" for cs, w in zip(texts, widths, strict=True))
        out.write(f"{line}  {'  ' * indent}{view.label(node)}\n")


def records(columns: ColumnSet, view: View, cols: Sequence[ColumnDef], rows: list[Row]
            ) -> Iterator[dict[str, object]]:
    """One dictionary per row: the JSON schema of the core report, for every view."""
    vals = [(c.title, columns.values(view, c)) for c in cols]
    par = view.parent
    for node, indent in rows:
        loc = view.location(node)
        p = int(par[node])
        yield {
            "id": view.stable_id(node),
            "parent": view.stable_id(p) if p >= 0 else None,
            "depth": indent,
            "type": view.node_type(node),
            "name": view.node_name(node),
            "label": view.label(node),
            "module": loc.module,
            "file": loc.file,
            "line": loc.line,
            "call_line": loc.call_line,
            "metrics": {t: _json_number(float(v[node])) for t, v in vals},
        }


def _json_number(v: float) -> float | None:
    return v if math.isfinite(v) else None


def render_json(columns: ColumnSet, view: View, cols: Sequence[ColumnDef], rows: list[Row],
                out: TextIO) -> None:
    """A JSON array, one object per line, streamed."""
    out.write("[\n")
    first = True
    for rec in records(columns, view, cols, rows):
        if not first:
            out.write(",\n")
        out.write(json.dumps(rec))
        first = False
    out.write("\n]\n")


def render_csv(columns: ColumnSet, view: View, cols: Sequence[ColumnDef], rows: list[Row],
               out: TextIO) -> None:
    """hpcviewer's CSV export: a header of column titles, then the rows shown, the aggregate
    (root) row first; values at full precision, empty cells for undefined values."""
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["Scope", *(c.title for c in cols)])
    ordered = sorted(rows, key=lambda r: r[0] != 0)  # the aggregate row first, stable
    vals = [columns.values(view, c) for c in cols]
    for node, _ in ordered:
        label = view.label(node)
        cells = []
        for v in vals:
            x = float(v[node])
            cells.append(repr(x) if math.isfinite(x) else "")
        w.writerow([label, *cells])
