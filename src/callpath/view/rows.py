"""JSON shapes of the profile view: column descriptions and tree rows.

Values of a column are computed for the whole view at once by the analysis layer (and
cached there); a page of rows only indexes them, so formatting 200 rows is cheap whatever
the size of the tree. Text cells use exactly the report's formatting
(:mod:`callpath.present.viewreport`): the viewer and ``callpath report`` show the same text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.analysis.columns import ColumnDef
from callpath.analysis.nodes import ViewKind
from callpath.analysis.time_metric import TIME_FIRST, is_time, time_metric
from callpath.engine.database import Built
from callpath.engine.sources import Servable
from callpath.present import viewreport

I64 = npt.NDArray[np.int64]

ROW_TYPES = {
    ViewKind.ROOT: "root", ViewKind.ENTRY: "entry", ViewKind.MODULE: "module",
    ViewKind.FILE: "file", ViewKind.PROCEDURE: "procedure", ViewKind.ACTIVATION: "activation",
    ViewKind.INLINED: "inlined", ViewKind.CALLER: "caller", ViewKind.LOOP: "loop",
    ViewKind.LINE: "statement", ViewKind.INSTRUCTION: "instruction",
}


def number(v: float) -> float | None:
    return v if math.isfinite(v) else None


# the metrics that hold the time of a run, best first, shared with `callpath report` and
# `callpath lines` (analysis.time_metric); see open_column()
_TIME_FIRST = TIME_FIRST
_is_time = is_time


def open_column(cols: list[dict[str, Any]]) -> str | None:
    """The key of the column a database opens on (sorted by it): the inclusive column of
    the metric that holds the time. A GPU database lists ~50 metrics whose first
    (``GKER:BLK_SM_ACUMU``) is zero everywhere; sorted by it, the tree order, the Lines tab
    and the ranked list meant nothing. Order: GPUOP, CPUTIME and the like, then the first
    non-empty time metric, then the first non-empty column, then the first column."""
    incl = [c for c in cols if c["scope"] == "inclusive" and not c["empty"]]
    for want in _TIME_FIRST:
        for c in incl:
            if c["name"].split(" ")[0].split(":")[0] == want:
                return str(c["key"])
    for c in incl:
        if _is_time(c["name"]):
            return str(c["key"])
    for c in cols:
        if not c["empty"]:
            return str(c["key"])
    return str(cols[0]["key"]) if cols else None


def open_metric(names: list[str]) -> int:
    """The metric a database's Lines tab opens on, from the metric names alone (the list of
    databases must stay cheap): the first of :data:`_TIME_FIRST`, else the first time
    metric, else metric 0."""
    return time_metric(names)


def columns_json(b: Built) -> list[dict[str, Any]]:
    """The columns of a view. ``empty``: zero at every node of the view (the viewer hides
    such columns until asked); ``open``: the column the view opens sorted by."""
    out: list[dict[str, Any]] = []
    start = b.start()
    for c in b.columns.columns:
        vals = b.columns.values(b.view, c)
        agg = float(vals[start])
        empty = not bool(np.any(vals != 0))
        text = viewreport.cells(b.columns, b.view, c, [start])[0]
        out.append({
            "key": b.column_key(c), "name": c.title, "metric": c.metric,
            "scope": c.scope,
            "format": c.derived.format if c.derived is not None else "scientific",
            "formula": c.derived.formula if c.derived is not None else None,
            "percent_annotation": c.derived.percent if c.derived is not None else False,
            "description": (b.source.metrics[c.metric].description
                            if c.metric is not None else ""),
            "aggregate": number(agg), "aggregate_text": text, "empty": empty,
            "time": _is_time(c.title),
        })
    first = open_column(out)
    for doc in out:
        doc["open"] = doc["key"] == first
    return out


def rows_json(b: Built, nodes: Sequence[int], keys: Sequence[str],
              servable: Servable) -> list[dict[str, Any]]:
    """One ROW per node (see docs/view.md, "API")."""
    view = b.view
    arr = np.asarray(nodes, dtype=np.int64)
    has_kids = view.has_children(arr).tolist()
    cols = b.columns.columns
    values: list[tuple[str, list[float | None], list[str]]] = []
    for c in cols:
        v = b.columns.values(view, c)
        values.append((b.column_key(c), [number(x) for x in v[arr].tolist()],
                       viewreport.cells(b.columns, view, c, list(nodes))))
    kinds = view.nodes.kind[arr].tolist() if len(arr) else []
    out = []
    for r, (n, key) in enumerate(zip(nodes, keys, strict=True)):
        loc = view.location(n)
        src = servable.get(loc.file) is not None
        call = servable.get(loc.call_file) is not None
        out.append({
            "key": key, "label": view.label(n), "name": view.node_name(n),
            "type": ROW_TYPES.get(ViewKind(kinds[r]), "scope"),
            "has_children": has_kids[r], "has_source": src, "has_callsite_source": call,
            "file": loc.file, "line": loc.line, "call_line": loc.call_line,
            "values": {k: vals[r] for k, vals, _ in values},
            "text": {k: texts[r] for k, _, texts in values},
        })
    return out


def column_subset(b: Built, keys: list[str] | None) -> list[ColumnDef]:
    if not keys:
        return list(b.columns.columns)
    return [b.column(k) for k in keys]
