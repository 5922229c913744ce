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
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.formats.v4.stream import Groups
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

    def bound(self, points: list[npt.NDArray[np.float64]]) -> tuple[int, int]:
        """Upper bounds of the value and context counts of :meth:`matrix`'s block (per
        execution context), from where values can be: a metric's ``point`` values where it
        has one, ``function`` and ``lex_aware`` where one flows to, ``execution`` at their
        ancestors. Exact unless values cancel or vanish in rounding; propagating 0/1
        indicators costs less than half of the block."""
        cct = self.cct
        rows = np.zeros(len(cct), dtype=bool)
        n_values = 0
        seen: tuple[npt.NDArray[np.bool_], int] | None = None  # metrics often share a pattern
        for point in points:
            nz = point != 0
            if seen is not None and np.array_equal(nz, seen[0]):
                n_values += seen[1]
                continue
            n_point = int(np.count_nonzero(nz))
            count = 0
            if n_point:
                ind = nz.astype(np.float64)
                execution = cct.inclusive(ind) > 0
                count = n_point + 2 * int(np.count_nonzero(cct.exclusive(ind) > 0)) \
                    + int(np.count_nonzero(execution))
                rows |= execution
            n_values += count
            seen = (nz, count)
        return n_values, int(np.count_nonzero(rows))


def dense_block(matrix: npt.NDArray[np.float64]) -> ProfileBlock:
    """The profile block of a node × metric id matrix (the tree's context ids are its node
    indices): row-major nonzeros are already sorted by context, then metric."""
    n_cols = matrix.shape[1]
    flat = matrix.ravel()
    idx = np.flatnonzero(flat)
    rows = (idx // n_cols).astype(np.uint32)
    cols = (idx - rows.astype(np.int64) * n_cols).astype(np.uint16)
    new_row = np.ones(len(rows), dtype=bool)
    new_row[1:] = rows[1:] != rows[:-1]
    starts = np.flatnonzero(new_row).astype(np.uint64)
    # the context of every value is known here: hand it on (the writer needs it)
    return ProfileBlock(rows[new_row], starts, cols, flat[idx], rows)


def summary_block(prop: Propagator, point_sums: list[npt.NDArray[np.float64]],
                  stats: npt.NDArray[np.float64] | None = None) -> ProfileBlock:
    """The summary profile: the propagation of the point values summed over execution
    contexts (propagation is linear, so this is the sum of the contexts' propagated values,
    computed once), and the ``-M stats`` partials (:func:`stats_columns`) when given. The
    summary statistic ids of the sums equal the propagated ids (:func:`make_metric`)."""
    out = prop.matrix(point_sums, summary=True)
    if stats is not None:
        out = np.concatenate([out, stats], axis=1)
    return dense_block(out)


@dataclass
class GroupStats:
    """Count, sum of squares, min and max of the values of (context, metric) pairs over the
    execution contexts that have one."""

    ctx: npt.NDArray[np.uint32]
    metric: npt.NDArray[np.uint16]
    count: npt.NDArray[np.int64]
    sq: npt.NDArray[np.float64]
    min: npt.NDArray[np.float64]
    max: npt.NDArray[np.float64]


def group_stats(g: Groups) -> GroupStats:
    """The statistics of transposed pairs (``cct.db`` order: execution contexts ascending in a
    pair). Squares are summed one execution context after the other, in that order, so the
    sums do not depend on how the transpose was split into pieces or workers."""
    ng = len(g.ctx)
    sizes = np.diff(g.starts)
    vals = np.asarray(g.values, dtype=np.float64)
    sq = np.zeros(ng)
    if ng:
        gid = np.repeat(np.arange(ng), sizes)
        rank = np.arange(len(vals)) - np.repeat(g.starts[:-1], sizes)
        by_rank = np.argsort(rank, kind="stable")
        cut = np.searchsorted(rank[by_rank], np.arange(int(sizes.max()) + 1))
        for r in range(len(cut) - 1):
            sel = by_rank[cut[r]:cut[r + 1]]
            sq[gid[sel]] += vals[sel] * vals[sel]
        lo = np.minimum.reduceat(vals, g.starts[:-1])
        hi = np.maximum.reduceat(vals, g.starts[:-1])
    else:
        lo = hi = np.zeros(0)
    return GroupStats(np.asarray(g.ctx, dtype=np.uint32), np.asarray(g.metric, dtype=np.uint16),
                      sizes.astype(np.int64), sq, lo, hi)


def stats_columns(parts: list[GroupStats], n: int, n_cols: int, n_contexts: int
                  ) -> npt.NDArray[np.float64]:
    """The ``-M stats`` columns (:func:`stat_id` order, after the sums) of a tree of ``n``
    nodes with ``n_cols`` propagated metric ids: count, sum of squares, min and max over
    ``n_contexts`` execution contexts, where a context without a value counts as 0."""
    count = np.zeros((n, n_cols))
    sq = np.zeros((n, n_cols))
    mn = np.zeros((n, n_cols))
    mx = np.zeros((n, n_cols))
    for p in parts:
        r, c = p.ctx.astype(np.int64), p.metric.astype(np.int64)
        count[r, c] = p.count
        sq[r, c] = p.sq
        partial = p.count < n_contexts
        mn[r, c] = np.where(partial, np.minimum(p.min, 0.0), p.min)
        mx[r, c] = np.where(partial, np.maximum(p.max, 0.0), p.max)
    return np.stack([count, sq, mn, mx], axis=2).reshape(n, n_cols * len(STAT_PARTIALS))
