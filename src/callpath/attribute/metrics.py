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

    def matrix(self, points: list[npt.NDArray[np.float64]]
               ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """From per-node point values of each metric (``points[k]``): the node × metric id
        matrix of this execution context's values (column ``4k + scope``), and the node ×
        metric matrix of the ``lex_aware`` values that the summary sums."""
        cct = self.cct
        n = len(cct)
        out = np.zeros((n, N_SCOPES * len(points)))
        lex = np.zeros((n, len(points)))
        for k, point in enumerate(points):
            function = cct.exclusive(point)
            lex[:, k] = np.where(self.is_loop, self.noloop_tree.exclusive(point), function)
            out[:, N_SCOPES * k] = point
            out[:, N_SCOPES * k + 1] = function
            out[:, N_SCOPES * k + 2] = function
            out[:, N_SCOPES * k + 3] = cct.inclusive(point)
        return out, lex


def dense_block(matrix: npt.NDArray[np.float64]) -> ProfileBlock:
    """The profile block of a node × metric id matrix (the tree's context ids are its node
    indices): row-major nonzeros are already sorted by context, then metric."""
    nz = matrix != 0
    rows = np.flatnonzero(nz.any(axis=1))
    sub = nz[rows]
    r, c = np.nonzero(sub)
    counts = sub.sum(axis=1)
    starts = np.zeros(len(rows), dtype=np.uint64)
    if len(rows) > 1:
        starts[1:] = np.cumsum(counts[:-1])
    return ProfileBlock(rows.astype(np.uint32), starts, c.astype(np.uint16),
                        matrix[rows[r], c].astype(np.float64))


def summary_block(sums: npt.NDArray[np.float64], lex_sums: npt.NDArray[np.float64],
                  stats: StatsAccumulator | None = None) -> ProfileBlock:
    """The summary profile from the node × metric id sums over execution contexts, with the
    ``lex_aware`` columns taken from ``lex_sums`` (node × metric; see the module docstring),
    and the ``-M stats`` partials when ``stats`` is given. The summary statistic ids of the
    sums equal the propagated ids (:func:`make_metric`)."""
    out = sums.copy()
    for k in range(lex_sums.shape[1]):
        out[:, N_SCOPES * k + 2] = lex_sums[:, k]
    if stats is not None:
        out = np.concatenate([out, stats.columns()], axis=1)
    return dense_block(out)


class StatsAccumulator:
    """Count, sum of squares, min and max per node and propagated metric, over execution
    contexts added in order. As in the summary sums, the ``lex_aware`` scope uses the summary's
    own values. Contexts without a value count as 0 for min and max."""

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
