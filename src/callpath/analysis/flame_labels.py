"""What a flame graph shows besides geometry: names of its rectangles and the colour column.

Shared by the viewer's flame pane and the SVG renderer so that both pick the same names and
the same differential colouring on a comparison database (``callpath diff``).
"""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from callpath.analysis.columns import ColumnDef, ColumnSet
from callpath.analysis.flame import FlameFrame
from callpath.analysis.view import View

F64 = npt.NDArray[np.float64]

_SIDE = re.compile(r"^(?P<metric>.*) \[(?P<tag>[^\]]+)\] \((?P<scope>[IE])\)$")


def rect_names(view: View, frame: FlameFrame) -> list[str]:
    """The scope name of every rectangle (computed once per distinct node kind and table
    entry would be faster; a frame has at most a few thousand rectangles)."""
    return [view.label(int(n)) for n in frame.nodes.tolist()]


def delta_column(columns: ColumnSet, width: ColumnDef) -> ColumnDef | None:
    """On a comparison database, the ``M [delta] (I)`` column that goes with a width column
    ``M [base] (I)`` or ``M [new] (I)``; None elsewhere."""
    m = _SIDE.match(width.title)
    if m is None or m.group("tag") == "delta":
        return None
    want = f"{m.group('metric')} [delta] ({m.group('scope')})"
    return next((c for c in columns.columns if c.title == want), None)


def rect_values(columns: ColumnSet, view: View, col: ColumnDef, frame: FlameFrame) -> F64:
    out: F64 = columns.values(view, col)[frame.nodes]
    return out
