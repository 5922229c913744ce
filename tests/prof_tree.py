"""Finding contexts in a database by what a reader sees: kind, name, line."""

from __future__ import annotations

import numpy as np

from callpath.model import Experiment, NodeKind


def find(exp: Experiment, kind: NodeKind, *, name: str | None = None, line: int | None = None,
         within: int | None = None) -> list[int]:
    """Nodes of ``kind`` (with that function name / line), inside ``within``'s subtree."""
    c = exp.cct
    sel = c.kind == kind
    if name is not None:
        names = np.array([exp.functions[f].name if f >= 0 else "" for f in c.function])
        sel &= names == name
    if line is not None:
        sel &= c.line == line
    if within is not None:
        idx = np.arange(len(c))
        sel &= (idx > within) & (idx < c.subtree_end[within])
    return [int(i) for i in np.flatnonzero(sel)]


def inclusive(exp: Experiment, metric: str) -> np.ndarray:
    return exp.inclusive(metric)
