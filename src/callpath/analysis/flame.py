"""Flame graph and icicle layout: which nodes of a view are wider than a pixel, and where.

A flame graph draws each node as a rectangle as wide as its inclusive value, its children side
by side from its left edge (what is left over on the right is the node's own cost). Only
rectangles at least ``min_fraction`` of the start node's width are kept, so what travels to a
browser is bounded by the pixels on screen, not by the size of the tree.

Top-down (the flame graph) is laid out for the whole subtree at once from preorder arrays:
with ``self = inclusive - sum(children)``, the left edge of a node is the ``self`` of every
node before it in preorder minus that of its ancestors (whose own cost lies to the right of
their children): two cumulative sums and an Euler-tour difference, no per-node loop. Other
views (the Bottom-up icicle) materialize their children lazily; they are expanded level by
level, only below rectangles that were kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.analysis.topdown import TopDownView, View

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass
class FlameFrame:
    """Rectangles in drawing order (every parent before its children). ``x`` and ``w`` are
    fractions of the start node's value; ``parent`` indexes these arrays (-1: the start);
    ``child_pos`` is a rectangle's position among its view parent's children (for node keys
    that are paths)."""

    nodes: I64
    parent: I64
    depth: I64
    x: F64
    w: F64
    total: float
    child_pos: I64

    def __len__(self) -> int:
        return len(self.nodes)


def _empty(start: int, total: float) -> FlameFrame:
    z = np.zeros(1, np.int64)
    return FlameFrame(np.array([start], np.int64), np.array([-1], np.int64), z,
                      np.zeros(1), np.ones(1) if total > 0 else np.zeros(1), total, z.copy())


def topdown_frame(view: TopDownView, incl: F64, start: int, min_fraction: float,
                  max_depth: int | None = None) -> FlameFrame:
    """The flame graph of ``start``'s subtree in a Top-down view (vectorised)."""
    cct = view.source.cct
    lo, hi = start, int(cct.subtree_end[start])
    total = float(incl[start])
    if not total > 0:
        return _empty(start, total)
    w = np.maximum(incl[lo:hi], 0.0)
    par = cct.parent[lo:hi] - lo
    par[0] = -1
    n = hi - lo
    child_sum = np.bincount(par[1:], weights=w[1:], minlength=n)
    own = np.maximum(w - child_sum, 0.0)
    before = np.zeros(n + 1)
    np.cumsum(own, out=before[1:])
    # sum of the own cost of each node's proper ancestors: +own at a node, -own at its
    # subtree's end, prefix-summed (an Euler tour)
    ends = cct.subtree_end[lo:hi] - lo
    tour = -np.bincount(ends, weights=own, minlength=n + 1)
    tour[:n] += own
    anc = np.cumsum(tour)[:n] - own
    x = before[:n] - anc
    depth = cct.depth[lo:hi] - cct.depth[lo]
    keep = w >= min_fraction * total
    if max_depth is not None:
        keep &= depth <= max_depth
    keep[0] = True
    # a node is drawn only under a drawn parent (a child can outgrow its parent only with
    # inconsistent values): count dropped ancestors-or-self with the same Euler tour
    dropped = ~keep
    if dropped.any():
        tour_d = -np.bincount(ends[dropped], minlength=n + 1)
        tour_d[:n] += dropped
        keep &= np.cumsum(tour_d)[:n] == 0
    idx = np.flatnonzero(keep)
    where = np.full(n, -1, dtype=np.int64)
    where[idx] = np.arange(len(idx), dtype=np.int64)
    rect_parent = np.where(par[idx] >= 0, where[np.maximum(par[idx], 0)], -1)
    return FlameFrame(idx + lo, rect_parent, depth[idx].astype(np.int64), x[idx] / total,
                      w[idx] / total, total, np.zeros(len(idx), np.int64))


def lazy_frame(view: View, values: Callable[[], F64], start: int, total: float,
               min_fraction: float, max_depth: int = 200) -> FlameFrame:
    """The icicle of ``start`` in a view whose children are materialized on demand (Bottom-up,
    Flat): expand level by level below the rectangles that are kept; children are laid out
    left to right in the view's child order. In Bottom-up the widths are *exclusive* values
    (``values``): a procedure's own cost, split among its callers, which add up (inclusive
    values of different procedures overlap); ``total`` is the width of ``start``."""
    if not total > 0:
        return _empty(start, total)
    nodes, parents, depths, xs, ws, pos = [start], [-1], [0], [0.0], [1.0], [0]
    frontier = [0]  # indices into the lists above
    level = 0
    while frontier and level < max_depth:
        level += 1
        kids_of = [view.children(nodes[r]) for r in frontier]
        vals = values()  # the children just materialized have values now
        nxt = []
        for r, kids in zip(frontier, kids_of, strict=True):
            if not len(kids):
                continue
            kw = np.maximum(vals[kids], 0.0) / total
            left = xs[r] + np.concatenate([[0.0], np.cumsum(kw)[:-1]])
            for i in np.flatnonzero(kw >= min_fraction).tolist():
                nodes.append(int(kids[i]))
                parents.append(r)
                depths.append(level)
                xs.append(float(left[i]))
                ws.append(float(kw[i]))
                pos.append(i)
                nxt.append(len(nodes) - 1)
        frontier = nxt
    return FlameFrame(np.array(nodes, np.int64), np.array(parents, np.int64),
                      np.array(depths, np.int64), np.array(xs), np.array(ws), total,
                      np.array(pos, np.int64))


def flame_frame(view: View, inclusive: Callable[[], F64], exclusive: Callable[[], F64],
                start: int, min_fraction: float) -> FlameFrame:
    """The frame of any view: the vectorised flame graph of inclusive values for Top-down;
    otherwise the icicle of exclusive values, whose root is as wide as the start's inclusive
    value at the view's root (everything) and as its exclusive value below."""
    if isinstance(view, TopDownView):
        return topdown_frame(view, inclusive(), start, min_fraction)
    total = float(inclusive()[start] if start == 0 else exclusive()[start])
    return lazy_frame(view, exclusive, start, total, min_fraction)
