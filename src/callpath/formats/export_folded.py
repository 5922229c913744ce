"""Folded stacks (Brendan Gregg's "collapsed" format) for flamegraph.pl and inferno.

One line per distinct call path: frames from the outermost inwards separated by ``;``, a space,
and an integer count. Counts are the chosen metric's point values made integers
(:func:`~callpath.formats.stacks.integer_scale`): sample counts stay counts, so the lines add up
to the database's sample total. Paths are built once per frame node from its parent's path
(preorder), not once per sample.
"""

from __future__ import annotations

from typing import TextIO

import numpy as np

from callpath.formats.stacks import (
    FrameTree,
    IntegerScale,
    check_nonnegative,
    integer_scale,
)
from callpath.model import Metric


def clean_name(name: str) -> str:
    """A frame name as one field of a folded line: no separator, no line break."""
    return name.replace(";", ":").replace("\n", " ").replace("\r", " ")


def folded_lines(ft: FrameTree, point: np.ndarray, metric: Metric,
                 scale: IntegerScale | None = None) -> tuple[list[str], IntegerScale]:
    """The folded lines of per-node point values, and the integer scale used."""
    check_nonnegative(point, metric, "folded stacks")
    selfw, incl = ft.frame_weights(point)
    sc = scale or integer_scale(metric, selfw)
    counts = np.rint(selfw * sc.factor).astype(np.int64)
    keep = ft.kept(selfw, incl)
    names = [clean_name(n) for n in ft.names]
    frame = ft.frame.tolist()
    parent = ft.parent.tolist()
    path: dict[int, str] = {}
    out: dict[str, int] = {}  # distinct procedures may share a name: one line per path
    cnt = counts.tolist()
    for k in keep.tolist():  # preorder: a parent's path exists before its children's
        p = parent[k]
        s = names[frame[k]] if p < 0 else f"{path[p]};{names[frame[k]]}"
        path[k] = s
        if cnt[k] > 0:
            out[s] = out.get(s, 0) + cnt[k]
    return [f"{s} {c}" for s, c in out.items()], sc


def write_folded(ft: FrameTree, point: np.ndarray, metric: Metric, out: TextIO) -> IntegerScale:
    lines, sc = folded_lines(ft, point, metric)
    out.write("\n".join(lines))
    if lines:
        out.write("\n")
    return sc
