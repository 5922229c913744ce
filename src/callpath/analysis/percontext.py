"""Values of one node across execution contexts, and their statistics (hpcviewer's graphs).

For a measured metric on an unfiltered tree the values come straight from the context-major
store (``cct.db``): only the node's instances are read, whatever the number of nodes. Derived
metrics, configured columns and filtered trees are computed per context through the same
column machinery as the views (one pass over the tree per context).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.analysis.columns import ColumnDef, ColumnSet
from callpath.analysis.topdown import View
from callpath.errors import CallpathError
from callpath.model.treeops import outermost

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Statistics:
    count: int
    sum: float
    mean: float
    min: float
    max: float
    stddev: float  # population standard deviation, as hpcprof's summary statistics
    cv: float  # coefficient of variation: stddev / mean (NaN when the mean is 0)

    def as_dict(self) -> dict[str, float]:
        return {"count": self.count, "sum": self.sum, "mean": self.mean, "min": self.min,
                "max": self.max, "stddev": self.stddev, "cv": self.cv}


@dataclass(frozen=True)
class ContextValues:
    """One value per measured execution context (profile order)."""

    profiles: list[int]
    labels: list[str]
    values: F64

    def statistics(self) -> Statistics:
        v = self.values
        if not len(v):
            nan = math.nan
            return Statistics(0, 0.0, nan, nan, nan, nan, nan)
        mean = float(v.mean())
        std = float(v.std())
        return Statistics(len(v), float(v.sum()), mean, float(v.min()), float(v.max()), std,
                          std / mean if mean != 0 else math.nan)


def context_values(columns: ColumnSet, view: View, node: int, col: ColumnDef
                   ) -> ContextValues:
    """The value of column ``col`` at ``node`` in every measured execution context."""
    source = view.source
    exp = source.exp
    view.check_node(node)
    ctxs = exp.contexts
    if not ctxs:
        raise CallpathError("the database has no execution contexts to plot")
    profiles = [c.index for c in ctxs]
    labels = [exp.context_label(c) for c in ctxs]
    if col.metric is not None and source.parent_source is None and source.profiles is None:
        vals = _from_context_store(view, node, col)
    else:
        vals = np.zeros(len(profiles), dtype=np.float64)
        for i, p in enumerate(profiles):
            per = columns.with_source(source.with_profiles((p,)))
            vals[i] = per.values(view, col.id)[node]
    return ContextValues(profiles, labels, vals)


def _from_context_store(view: View, node: int, col: ColumnDef) -> F64:
    source = view.source
    exp = source.exp
    assert col.metric is not None
    metric = exp.metrics[col.metric]
    members = view.members(node)
    scope = "execution" if col.scope == "inclusive" else "function"
    pid = metric.prop_id(exp.scopes, scope)
    if pid is None:
        raise CallpathError(f"metric {metric.name!r} has no per-context {scope} values")
    if col.scope == "inclusive":
        keep = outermost(np.zeros(len(members), np.int64), members, source.cct.subtree_end)
        members = members[keep]
    index_of = {p.index: i for i, p in enumerate(exp.contexts)}
    lookup = np.full(len(exp.profiles), -1, dtype=np.int64)
    for p, i in index_of.items():
        lookup[p] = i
    out = np.zeros(len(index_of), dtype=np.float64)
    store = exp.context_store()
    for ctx in exp.cct.ctx_id[source.orig[members]].tolist():
        blk = store[int(ctx)]
        hit = np.nonzero(blk.metric_ids == pid)[0]
        if not len(hit):
            continue
        k = int(hit[0])
        lo = int(blk.starts[k])
        hi = int(blk.starts[k + 1]) if k + 1 < len(blk.starts) else len(blk.values)
        slot = lookup[blk.prof_indices[lo:hi].astype(np.int64)]
        ok = slot >= 0
        np.add.at(out, slot[ok], blk.values[lo:hi][ok])
    return out
