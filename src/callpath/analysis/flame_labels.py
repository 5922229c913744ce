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
from callpath.analysis.nodes import ViewKind
from callpath.analysis.topdown import View

F64 = npt.NDArray[np.float64]

_SIDE = re.compile(r"^(?P<metric>.*) \[(?P<tag>[^\]]+)\] \((?P<scope>[IE])\)$")


def rect_names(view: View, frame: FlameFrame) -> list[str]:
    """The label of every rectangle as the tree shows it (``[line] » callee``, ``« caller``):
    names in one batch (:meth:`NodeTable.names`), then the call-site decoration."""
    t = view.nodes
    ids = frame.nodes
    names = t.names(view.exp, ids)
    out = []
    act, inl, caller = int(ViewKind.ACTIVATION), int(ViewKind.INLINED), int(ViewKind.CALLER)
    for name, k, cl in zip(names, t.kind[ids].tolist(), t.call_line[ids].tolist(), strict=True):
        if k in (act, inl):
            head = f"[{cl}] »" if cl > 0 else "»"
            out.append(f"{head} {name} [inlined]" if k == inl else f"{head} {name}")
        elif k == caller:
            out.append(f"[{cl}] « {name}" if cl > 0 else f"« {name}")
        else:
            out.append(name)
    return out


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
