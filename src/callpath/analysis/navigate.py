"""Navigation operations that work the same in every view: sorting children, the hot call
path, Find over scope names, and expanding a view to a depth/threshold for printing."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.analysis.flat import FlatView
from callpath.analysis.topdown import View
from callpath.errors import CallpathError

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

DEFAULT_HOT_THRESHOLD = 50.0


def order_by(nodes: I64, values: F64, descending: bool = True) -> I64:
    """``nodes`` ordered by ``values`` (ties keep their order); NaN (empty cells) last."""
    if len(nodes) < 2:
        return nodes
    v = values[nodes]
    key = np.where(np.isnan(v), -np.inf if descending else np.inf, v)
    out: I64 = nodes[np.argsort(-key if descending else key, kind="stable")]
    return out


def sorted_children(view: View, node: int, values: F64 | None, *,
                    descending: bool = True) -> I64:
    """Children of ``node`` ordered by ``values`` (ties keep the view's order); NaN last."""
    kids = view.children(node)
    if values is None:
        return kids
    return order_by(kids, values, descending)


def flattened_top(view: FlatView, start: int, levels: int, values: F64, *,
                  descending: bool = True) -> I64:
    """hpcviewer's flatten applied ``levels`` times to the children of ``start``: the scopes
    shown at the top of a flattened Flat view, ordered by ``values``."""
    top = view.children(start).tolist()
    for _ in range(levels):
        top = view.flatten(top)
    return order_by(np.asarray(top, dtype=np.int64), values, descending)


def hot_path(view: View, start: int, values_of: Callable[[], F64],
             threshold: float = DEFAULT_HOT_THRESHOLD) -> list[int]:
    """hpcviewer's hot call path from ``start``: while one child accounts for at least
    ``threshold`` percent of the current node's value, descend into it.

    ``values_of`` is a callable returning the current per-node values of the chosen metric
    (called again after each step, because expanding a Bottom-up node adds nodes)."""
    if not 0 < threshold <= 100:
        raise CallpathError(f"hot path threshold {threshold}: expected a percentage in (0, 100]")
    view.check_node(start)
    path = [start]
    node = start
    while True:
        kids = view.children(node)
        if not len(kids):
            return path
        vals = values_of()
        here = float(vals[node])
        kv = vals[kids]
        if here == 0 or not np.isfinite(here) or np.all(np.isnan(kv)):
            return path
        best = int(np.nanargmax(kv))
        if float(kv[best]) < threshold / 100.0 * here:
            return path
        node = int(kids[best])
        path.append(node)


@dataclass(frozen=True)
class FindOptions:
    pattern: str
    case_sensitive: bool = False
    whole_word: bool = False
    regex: bool = False

    def compile(self) -> re.Pattern[str]:
        flags = 0 if self.case_sensitive else re.IGNORECASE
        text = self.pattern if self.regex else re.escape(self.pattern)
        if self.whole_word:
            text = rf"(?<!\w)(?:{text})(?!\w)"
        try:
            return re.compile(text, flags)
        except re.error as e:
            raise CallpathError(f"find pattern {self.pattern!r}: invalid regular expression: "
                                f"{e}") from None


def find(view: View, options: FindOptions, within: I64 | None = None) -> I64:
    """Materialized nodes whose name matches, in node order. Names are formatted once per
    distinct (kind, procedure, file, line) key, not once per node."""
    rx = options.compile()
    keys, reps = view.nodes.name_keys(within)
    names = view.nodes.names(view.exp, reps)
    hit = np.fromiter((bool(rx.search(nm)) for nm in names), dtype=bool, count=len(names))
    sel = np.arange(len(view), dtype=np.int64) if within is None else within
    out: I64 = sel[hit[keys]]
    return out


def expand(view: View, start: int, values_of: Callable[[], F64] | None, *,
           depth: int | None = None, threshold: float = 0.0, descending: bool = True,
           total: float | None = None, sort: bool = True) -> list[tuple[int, int]]:
    """The rows a report shows: ``(node, indent)`` in display order, expanding from ``start``
    down to ``depth`` levels, hiding nodes below ``threshold`` percent of ``total`` (default:
    the start node's value), children sorted by the values.

    Expands breadth-first, one level at a time, and asks ``values_of`` for fresh values once
    per level: Bottom-up nodes are materialized by the expansion, and computing their values
    level by level keeps the work linear."""
    view.check_node(start)
    vals = values_of() if values_of is not None else None
    base = total if total is not None else (abs(float(vals[start])) if vals is not None else 0.0)
    limit = threshold / 100.0 * base
    shown: dict[int, I64] = {}
    frontier = [start]
    level = 0
    while frontier and (depth is None or level < depth):
        kids_of = [(v, view.children(v)) for v in frontier]
        vals = values_of() if values_of is not None else None
        nxt: list[int] = []
        for v, kids in kids_of:
            if not len(kids):
                continue
            order = sorted_children(view, v, vals if sort else None, descending=descending)
            if threshold > 0 and vals is not None:
                order = order[np.abs(vals[order]) >= limit]
            shown[v] = order
            nxt.extend(order.tolist())
        frontier = nxt
        level += 1
    rows: list[tuple[int, int]] = []
    stack: list[tuple[int, int]] = [(start, 0)]
    while stack:
        node, d = stack.pop()
        rows.append((node, d))
        shown_kids = shown.get(node)
        if shown_kids is not None:
            stack.extend((int(k), d + 1) for k in shown_kids[::-1])
    return rows
