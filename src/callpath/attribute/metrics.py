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
    summarize,
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


def make_metric(name: str, k: int, description: str = "", period: float = 1.0) -> Metric:
    """Metric ``k`` with hpcprof's four scopes; propagated and summary ids ``4k .. 4k+3``."""
    insts = [ScopeInstance(i, N_SCOPES * k + i) for i in range(N_SCOPES)]
    sums = [SummaryStatistic(i, "$$", Combine.SUM, N_SCOPES * k + i) for i in range(N_SCOPES)]
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

    def block(self, points: list[npt.NDArray[np.float64]]
              ) -> tuple[ProfileBlock, list[npt.NDArray[np.float64]]]:
        """A profile block from per-node point values of each metric (``points[k]``), and
        per metric the node-ordered ``lex_aware`` values that the summary sums."""
        cct = self.cct
        ids = cct.ctx_id.astype(np.int64)
        cs, ms, vs = [], [], []
        lex_summary = []
        for k, point in enumerate(points):
            function = cct.exclusive(point)
            lex_summary.append(np.where(self.is_loop, self.noloop_tree.exclusive(point),
                                        function))
            for j, vals in enumerate((point, function, function, cct.inclusive(point))):
                nz = np.flatnonzero(vals != 0)
                cs.append(ids[nz])
                ms.append(np.full(len(nz), N_SCOPES * k + j, dtype=np.int64))
                vs.append(vals[nz])
        if not cs:
            return ProfileBlock.empty(), lex_summary
        return (ProfileBlock.from_triples(np.concatenate(cs), np.concatenate(ms),
                                          np.concatenate(vs)), lex_summary)


def summary_block(cct: CCT, metrics: list[Metric], blocks: list[ProfileBlock],
                  lex_sums: list[npt.NDArray[np.float64]]) -> ProfileBlock:
    """The summary profile: :func:`summarize` of the per-context blocks, with the ``lex_aware``
    sums replaced by ``lex_sums`` (per metric, node-ordered; see the module docstring)."""
    base = summarize(metrics, SCOPES, blocks)
    ctx = base.ctx_of_values().astype(np.int64)
    mid = np.asarray(base.metric_ids, dtype=np.int64)
    lex_ids = [N_SCOPES * k + 2 for k in range(len(metrics))]
    keep = ~np.isin(mid, lex_ids)
    cs, ms, vs = [ctx[keep]], [mid[keep]], [np.asarray(base.values)[keep]]
    ids = cct.ctx_id.astype(np.int64)
    for k, vals in enumerate(lex_sums):
        nz = np.flatnonzero(vals != 0)
        cs.append(ids[nz])
        ms.append(np.full(len(nz), lex_ids[k], dtype=np.int64))
        vs.append(vals[nz])
    return ProfileBlock.from_triples(np.concatenate(cs), np.concatenate(ms), np.concatenate(vs))
