"""The one composition of a look at a database: tree source → filters → metric columns → view,
then the order of a node's children and the nodes Find looks at.

``callpath report`` (:mod:`callpath.cli.report_build`) calls these functions once per run;
the viewer (:class:`callpath.engine.database.Database`) calls them on a cache miss and keeps
what they return per view state. Either way the same functions build the same objects, so
the viewer's tree and the report's text cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from callpath.analysis.bottomup import BottomUpView
from callpath.analysis.columns import ColumnDef, ColumnSet
from callpath.analysis.derived import DerivedMetric
from callpath.analysis.flat import FlatView
from callpath.analysis.navigate import flattened_top, sorted_children
from callpath.analysis.source import TreeSource, tree_source
from callpath.analysis.topdown import View
from callpath.analysis.tree_filters import Filter, apply_filters
from callpath.analysis.view_by_name import make_view
from callpath.analysis.viewconfig import ColumnSpec
from callpath.model import Experiment

I64 = npt.NDArray[np.int64]


def source_of(exp: Experiment, profiles: Sequence[int] | None,
              filters: Iterable[Filter]) -> TreeSource:
    """The tree of ``exp`` summed over ``profiles`` (None: every context), with the nodes
    the ``filters`` match elided."""
    return apply_filters(tree_source(exp, profiles), filters)


def columns_of(source: TreeSource, derived: Sequence[DerivedMetric] = (),
               specs: Sequence[ColumnSpec] = ()) -> ColumnSet:
    """The measured columns of ``source``, then the ``derived`` metrics and the columns of
    view configurations (``specs``)."""
    return ColumnSet(source, derived, specs)


def view_of(name: str, source: TreeSource) -> View:
    """``top-down``, ``bottom-up`` or ``flat`` over ``source``."""
    return make_view(name, source)


def child_order(view: View, columns: ColumnSet, node: int, col: ColumnDef, *,
                descending: bool = True, flatten: int = 0, start: int = 0) -> I64:
    """Children of ``node`` sorted by ``col``; in Flat with ``flatten`` levels, the children
    of the start node are the flattened scopes (hpcviewer's flatten).

    The children are materialized before the column is computed: Bottom-up adds a node's
    children to the view on first access, and a column computed before that has no value
    for them (an IndexError on every first expansion of a Bottom-up node)."""
    view.children(node)
    vals = columns.values(view, col)
    if isinstance(view, FlatView) and flatten and node == start:
        return flattened_top(view, node, flatten, vals, descending=descending)
    return sorted_children(view, node, vals, descending=descending)


def open_for_find(view: View, depth: int | None = None) -> None:
    """Find looks at materialized nodes: open a Bottom-up view to ``depth`` (default 3)
    first, as ``callpath report --find`` and the viewer's Find dialog both do."""
    if isinstance(view, BottomUpView):
        view.expand_all(3 if depth is None else depth)


def visible_rows(view: View, columns: ColumnSet, start: int, expanded: Iterable[int],
                 col: ColumnDef, *, descending: bool = True, flatten: int = 0
                 ) -> list[tuple[int, int]]:
    """``(node, depth)`` of the rows a tree shows: ``start``, then the children of the
    ``expanded`` nodes in tree order, each node's children ordered by :func:`child_order`."""
    open_ = set(expanded)
    rows: list[tuple[int, int]] = []
    stack: list[tuple[int, int]] = [(start, 0)]
    while stack:
        node, depth = stack.pop()
        rows.append((node, depth))
        if node in open_:
            kids = child_order(view, columns, node, col, descending=descending,
                               flatten=flatten, start=start)
            stack.extend((int(k), depth + 1) for k in kids[::-1].tolist())
    return rows
