"""Propagated metric values per execution context, as hpcprof computes them.

For every metric four values per context: ``point`` (as measured at that context), ``function``
(exclusive: flows up through every context not entered by a call or an inlined call),
``lex_aware`` and ``execution`` (inclusive).

``lex_aware`` reproduces hpcprof exactly, quirk included: in the summary profile a loop's value
excludes its nested loops (the loop's own cost), everywhere else it equals ``function``; but
in each execution context's own profile hpcprof writes ``function`` unchanged (its per-thread
accumulator never learns that a context is a loop). So the summary's ``lex_aware`` is not the
sum of the per-context ones; :meth:`Propagator.block` returns both. All propagations are
linear numpy passes over the preorder tree (:meth:`CCT.inclusive`, :meth:`CCT.exclusive`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from callpath.model import (
    CCT,
    Metric,
    NodeKind,
    ProfileBlock,
    PropagationScope,
    Relation,
)
from callpath.model.metrics import (
    EXECUTION,
    FUNCTION,
    POINT,
    Combine,
    ScopeInstance,
    ScopeType,
    SummaryStatistic,
)

LEX_AWARE = PropagationScope("lex_aware", ScopeType.CUSTOM)
SCOPES = [POINT, FUNCTION, LEX_AWARE, EXECUTION]
N_SCOPES = len(SCOPES)


#: The extra partials of ``-M stats`` per scope, in hpcprof's terms: the number of execution
#: contexts with a value, the sum of squares, min and max (mean, standard deviation and
#: coefficient of variation are formulas of these and the sum).
STAT_PARTIALS = (("1", Combine.SUM), ("$$^2", Combine.SUM), ("$$", Combine.MIN),
                 ("$$", Combine.MAX))


def stat_id(n_metrics: int, k: int, scope: int, j: int) -> int:
    """Summary id of partial ``j`` of :data:`STAT_PARTIALS` for metric ``k`` and a scope."""
    return N_SCOPES * n_metrics + ((k * N_SCOPES + scope) * len(STAT_PARTIALS) + j)


def make_metric(name: str, k: int, description: str = "", period: float = 1.0, *,
                stats: bool = False, n_metrics: int = 0) -> Metric:
    """Metric ``k`` with hpcprof's four scopes; propagated and summary ids ``4k .. 4k+3``;
    with ``stats`` also the partials of :data:`STAT_PARTIALS` (ids from :func:`stat_id`)."""
    insts = [ScopeInstance(i, N_SCOPES * k + i) for i in range(N_SCOPES)]
    sums = [SummaryStatistic(i, "$$", Combine.SUM, N_SCOPES * k + i) for i in range(N_SCOPES)]
    if stats:
        sums += [SummaryStatistic(i, f, c, stat_id(n_metrics, k, i, j))
                 for i in range(N_SCOPES) for j, (f, c) in enumerate(STAT_PARTIALS)]
    return Metric(name, insts, sums, description=description or name, period=period)


class Propagator:
    """Per-tree plans for the three propagations, reused for every execution context."""

    def __init__(self, cct: CCT) -> None:
        self.cct = cct
        kind, rel = cct.kind, cct.relation
        calls = (rel == Relation.CALL) | (rel == Relation.INLINED_CALL)
        self.is_loop = kind == NodeKind.LOOP
        noloops = (~calls & ~self.is_loop & (kind < NodeKind.ENTRY)).astype(np.uint16)
        self.noloop_tree = dataclasses.replace(cct, propagation=noloops, _exclusive_plans={})

    def matrix(self, points: list[npt.NDArray[np.float64]], *, summary: bool = False
               ) -> npt.NDArray[np.float64]:
        """From per-node point values of each metric (``points[k]``): the node × metric id
        matrix of the propagated values (column ``4k + scope``). Per execution context
        ``lex_aware`` equals ``function`` (hpcprof's quirk, see the module docstring); with
        ``summary`` it is the loop-aware value, as in hpcprof's summary profile."""
        cct = self.cct
        n = len(cct)
        out = np.empty((n, N_SCOPES * len(points)))
        for k, point in enumerate(points):
            function = cct.exclusive(point)
            out[:, N_SCOPES * k] = point
            out[:, N_SCOPES * k + 1] = function
            out[:, N_SCOPES * k + 2] = (np.where(self.is_loop, self.noloop_tree.exclusive(point),
                                                 function) if summary else function)
            out[:, N_SCOPES * k + 3] = cct.inclusive(point)
        return out


def dense_block(matrix: npt.NDArray[np.float64]) -> ProfileBlock:
    """The profile block of a node × metric id matrix (the tree's context ids are its node
    indices): row-major nonzeros are already sorted by context, then metric."""
    n_cols = matrix.shape[1]
    flat = matrix.ravel()
    idx = np.flatnonzero(flat)
    rows = idx // n_cols
    cols = (idx - rows * n_cols).astype(np.uint16)
    new_row = np.ones(len(rows), dtype=bool)
    new_row[1:] = rows[1:] != rows[:-1]
    starts = np.flatnonzero(new_row).astype(np.uint64)
    return ProfileBlock(rows[new_row].astype(np.uint32), starts, cols, flat[idx])


def summary_block(prop: Propagator, point_sums: list[npt.NDArray[np.float64]],
                  stats: StatsAccumulator | None = None) -> ProfileBlock:
    """The summary profile: the propagation of the point values summed over execution
    contexts (propagation is linear, so this is the sum of the contexts' propagated values,
    computed once), and the ``-M stats`` partials when ``stats`` is given. The summary
    statistic ids of the sums equal the propagated ids (:func:`make_metric`)."""
    out = prop.matrix(point_sums, summary=True)
    if stats is not None:
        out = np.concatenate([out, stats.columns()], axis=1)
    return dense_block(out)


class StatsAccumulator:
    """Count, sum of squares, min and max per node and propagated metric, over execution
    contexts added in order (``lex_aware``: each context's own value). Contexts without a
    value count as 0 for min and max."""

    def __init__(self, n: int, n_cols: int) -> None:
        self.n_contexts = 0
        self.count = np.zeros((n, n_cols))
        self.sq = np.zeros((n, n_cols))
        self.min = np.full((n, n_cols), np.inf)
        self.max = np.full((n, n_cols), -np.inf)

    def add(self, rows: npt.NDArray[np.int64], cols: npt.NDArray[np.int64],
            vals: npt.NDArray[np.float64]) -> None:
        self.n_contexts += 1
        self.count[rows, cols] += 1
        self.sq[rows, cols] += vals * vals
        self.min[rows, cols] = np.minimum(self.min[rows, cols], vals)
        self.max[rows, cols] = np.maximum(self.max[rows, cols], vals)

    def columns(self) -> npt.NDArray[np.float64]:
        """Columns in :func:`stat_id` order (after the sums)."""
        partial = self.count < self.n_contexts
        lo = np.where(partial, np.minimum(self.min, 0.0), self.min)
        hi = np.where(partial, np.maximum(self.max, 0.0), self.max)
        lo = np.where(self.count > 0, lo, 0.0)
        hi = np.where(self.count > 0, hi, 0.0)
        n, c = self.count.shape
        return np.stack([self.count, self.sq, lo, hi], axis=2).reshape(n, c * len(STAT_PARTIALS))
