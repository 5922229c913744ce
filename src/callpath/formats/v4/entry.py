"""The synthetic entry point a v4 database needs above contexts that hang from the root.

Databases read from ``experiment.xml`` (and trees built without entry points) have procedures
directly below the global context; v4's context tree puts every context below an entry point,
so the writer adds an "unknown entry" there. That entry is a context with values of its own:
without them a reader (ours, hpcviewer) shows it with zero cost above all of the program's
cost. Its inclusive ("execution" scope) values are the root's, in every profile and in every
summary statistic of that scope (min, max, mean over contexts are the root's too, since the
entry's value equals the root's in each context); its exclusive, point and lexical values are
zero because it runs no code of its own.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from callpath.formats.v4.stream import ValueSource
from callpath.model.cct import NodeKind
from callpath.model.experiment import Experiment
from callpath.model.values import ProfileBlock

__all__ = ["needs_synthetic_entry", "with_entry_values"]


def needs_synthetic_entry(exp: Experiment) -> bool:
    """Whether some context (not an entry point) is a child of the global context."""
    cct = exp.cct
    return bool(np.any((cct.kind <= NodeKind.INSTRUCTION) & (cct.parent == 0)))


def _execution_ids(exp: Experiment) -> tuple[np.ndarray, np.ndarray]:
    """Metric ids of the execution scope: (propagated ids, summary statistic ids)."""
    scopes = {i for i, s in enumerate(exp.scopes) if s.name == "execution"}
    prop = [i.prop_metric_id for m in exp.metrics for i in m.scope_insts if i.scope in scopes]
    stat = [s.stat_metric_id for m in exp.metrics for s in m.summaries if s.scope in scopes]
    return np.asarray(prop, dtype=np.int64), np.asarray(stat, dtype=np.int64)


def _add_entry(blk: ProfileBlock, ids: np.ndarray, ctx: int) -> ProfileBlock:
    """``blk`` with the root's values of metric ``ids`` copied to context ``ctx``."""
    c = blk.ctx_of_values().astype(np.int64)
    m = np.asarray(blk.metric_ids, dtype=np.int64)
    v = np.asarray(blk.values, dtype=np.float64)
    root = (c == 0) & np.isin(m, ids)
    if not root.any():
        return blk  # the root has no values of these metrics: neither has the entry
    return ProfileBlock.from_triples(np.append(c, np.full(int(root.sum()), ctx)),
                                     np.append(m, m[root]), np.append(v, v[root]))


def with_entry_values(exp: Experiment, source: ValueSource, ctx: int) -> ValueSource:
    """``source`` whose blocks also give the synthetic entry ``ctx`` its values: the root's
    execution-scope values (propagated ids in profiles, statistic ids in the summary)."""
    prop, stat = _execution_ids(exp)
    summary_index = {p.index for p in exp.profiles if p.is_summary}
    inner = source.block

    def block(i: int) -> ProfileBlock:
        return _add_entry(inner(i), stat if i in summary_index else prop, ctx)

    out = replace(source, block=block)
    if source.summary is not None:
        summarize = source.summary
        out = replace(out, summary=lambda parts: _add_entry(summarize(parts), stat, ctx))
    return out
