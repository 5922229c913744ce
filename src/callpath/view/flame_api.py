"""The flame graph / icicle endpoint of the viewer (``GET /api/db/{db}/flame``).

The layout is computed here, on the server, for the width of the canvas: only rectangles of
at least one pixel travel (see :mod:`callpath.analysis.flame`). The response is a table of
columns (one list per field), which is several times smaller than a list of objects.

Parameters: the view state (as every endpoint), ``column`` (the width column key, default
the first measured inclusive column), ``color`` (a column key for differential colours; on a
comparison database the delta column is chosen when absent; ``none`` turns it off),
``width`` (pixels, 16..16384) and ``node`` (the key of the frame's root, default the view's
start).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from callpath.analysis.flame import flame_frame
from callpath.analysis.flame_labels import delta_column, rect_names, rect_values
from callpath.analysis.topdown import TopDownView
from callpath.engine.database import Database
from callpath.errors import CallpathError
from callpath.view.api import Params, built, start_key
from callpath.view.params import parse_int


def _num(v: float) -> float | None:
    return v if math.isfinite(v) else None


def flame(db: Database, params: Params, body: bytes) -> Any:
    b = built(db, params)
    width = parse_int(params, "width", 1200, lo=16, hi=16384)
    key = params.get("column")
    col = b.column(key, "parameter 'column'") if key else b.columns.columns[0]
    if col.scope == "exclusive":
        raise CallpathError(f"parameter 'column': {col.title!r} is an exclusive column; a "
                            "flame graph needs inclusive values")
    ckey = params.get("color")
    if ckey == "none":
        color = None
    elif ckey:
        color = b.column(ckey, "parameter 'color'")
    else:
        color = delta_column(b.columns, col)
    node_key = params.get("node") or start_key(b)
    node = b.node(node_key)
    view = b.view
    excl = col
    if not isinstance(view, TopDownView):  # an icicle: widths are exclusive values
        if col.metric is None:
            raise CallpathError(f"parameter 'column': {col.title!r} is not a measured metric; "
                                f"the {view.name} icicle needs one")
        excl = b.columns.columns[2 * col.metric + 1]
        if not ckey:
            color = delta_column(b.columns, excl)
    frame = flame_frame(view, lambda: b.columns.values(view, col),
                        lambda: b.columns.values(view, excl), node, 1.0 / width)
    keys = _keys(b, node_key, frame)
    vals = rect_values(b.columns, view, excl, frame)
    vals[0] = frame.total  # an icicle's root stands for everything below it
    out: dict[str, Any] = {
        "node": node_key, "column": b.column_key(excl), "column_name": excl.title,
        "color": b.column_key(color) if color is not None else None,
        "color_name": color.title if color is not None else None,
        "total": _num(frame.total), "width": width,
        "max_depth": int(frame.depth.max()) if len(frame) else 0,
        "key": keys, "name": rect_names(view, frame),
        "parent": frame.parent.tolist(), "depth": frame.depth.tolist(),
        "x": np.round(frame.x, 7).tolist(), "w": np.round(frame.w, 7).tolist(),
        "value": [_num(v) for v in vals.tolist()],
    }
    if color is not None:
        cv = rect_values(b.columns, view, color, frame)
        out["c"] = [_num(v) for v in cv.tolist()]
    return out


def _keys(b: Any, top_key: str, frame: Any) -> list[str]:
    """Node keys of the rectangles, as the tree uses them (linked selection)."""
    if isinstance(b.view, TopDownView):
        rest = b.keys.child_keys(top_key, 0, frame.nodes[1:])
        return [top_key, *rest]
    keys = [top_key]
    for par, pos in zip(frame.parent[1:].tolist(), frame.child_pos[1:].tolist(), strict=True):
        pk = keys[par]
        keys.append(f"{'p' if pk == 'r' else pk + '.'}{pos}")
    return keys


GETS = {"flame": flame}
