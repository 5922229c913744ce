"""The experiment: everything one database holds, whatever format it came from.

An :class:`Experiment` is plain data (tree, tables, metric descriptors, execution contexts,
sparse value stores, traces) plus a few accessors that turn the summary profile into dense
per-node arrays. Readers in :mod:`callpath.formats` build it; views and renderers consume it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.model.cct import CCT
from callpath.model.contexts import DEFAULT_ID_NAMES, ExecutionContext, node_texts
from callpath.model.metrics import (
    EXECUTION,
    FUNCTION,
    POINT,
    Combine,
    Metric,
    PropagationScope,
    ScopeInstance,
    SummaryStatistic,
    resolve_name,
)
from callpath.model.tables import Function, LoadModule, SourceFile
from callpath.model.values import (
    BlockStore,
    ContextStore,
    ProfileBlock,
    ProfileStore,
    Traces,
    transpose,
)

F64 = npt.NDArray[np.float64]


@dataclass
class Experiment:
    """A performance database in memory (values stay on disk until asked for)."""

    cct: CCT
    metrics: list[Metric]
    scopes: list[PropagationScope]
    profiles: list[ExecutionContext]  # profile.db order; index 0 is the summary profile
    values: ProfileStore  # one block per profile, same order as ``profiles``
    n_ctx_slots: int  # number of context identifiers (the cct.db context count)
    modules: list[LoadModule] = field(default_factory=list)
    files: list[SourceFile] = field(default_factory=list)
    functions: list[Function] = field(default_factory=list)
    id_names: list[str] = field(default_factory=lambda: list(DEFAULT_ID_NAMES))
    title: str = ""
    description: str = ""
    context_values: ContextStore | None = None  # cct.db; derived from ``values`` if None
    traces: Traces | None = None
    metrics_yaml: str | None = None  # metrics/default.yaml as found on disk
    path: Path | None = None
    format: str = "memory"
    #: where to copy a source from when its recorded path is not on this machine (a
    #: comparison names each input's copied source by the path it was measured at, and its
    #: copy lives in that input's database): recorded path -> file
    source_copies: dict[str, Path] = field(default_factory=dict, repr=False)
    _summary_cache: dict[int, F64] = field(default_factory=dict, repr=False)
    _node_of_ctx: npt.NDArray[np.int64] | None = field(default=None, repr=False)
    _node_texts: tuple[tuple[int, int], dict[int, str]] | None = field(default=None, repr=False)

    # ---- lookup ------------------------------------------------------------------------

    @property
    def contexts(self) -> list[ExecutionContext]:
        """The measured execution contexts (summary profiles excluded)."""
        return [p for p in self.profiles if not p.is_summary]

    def context_label(self, ctx: ExecutionContext) -> str:
        """The label a person reads for an execution context of this experiment: the node
        left out when every context ran on one node, a host id in hex otherwise
        (:func:`~callpath.model.contexts.node_texts`); ``NODE 8323328 THREAD 0`` read
        ``THREAD 0``."""
        return ctx.label(self.id_names, self.node_texts())

    def node_texts(self) -> dict[int, str]:
        """How each NODE identifier reads in :meth:`context_label` ("" for left out)."""
        key = (id(self.profiles), len(self.profiles))
        if self._node_texts is None or self._node_texts[0] != key:
            self._node_texts = (key, node_texts(self.profiles, self.id_names))
        return self._node_texts[1]

    def metric(self, key: str | int) -> Metric:
        """A metric by index or by name: exact, then an index written as digits, then
        case-insensitive, then unique case-insensitive prefix (see :func:`resolve_name`)."""
        if isinstance(key, int):
            if 0 <= key < len(self.metrics):
                return self.metrics[key]
            raise CallpathError(f"metric index {key} out of range (0..{len(self.metrics) - 1})")
        return self.metrics[resolve_name(key, [m.name for m in self.metrics])]

    def node_of_ctx(self) -> npt.NDArray[np.int64]:
        if self._node_of_ctx is None:
            self._node_of_ctx = self.cct.node_of_ctx(self.n_ctx_slots)
        return self._node_of_ctx

    # ---- summary values ------------------------------------------------------------------

    def summary(self, stat_metric_id: int) -> F64:
        """Values of one summary statistic for every context identifier (dense, cached)."""
        arr = self._summary_cache.get(stat_metric_id)
        if arr is None:
            arr = self.values[0].dense(stat_metric_id, self.n_ctx_slots)
            self._summary_cache[stat_metric_id] = arr
        return arr

    def _scoped(self, metric: str | int | Metric, scope: str) -> F64:
        m = metric if isinstance(metric, Metric) else self.metric(metric)
        sid = m.stat_id(self.scopes, scope, Combine.SUM)
        if sid is not None:
            return self.summary(sid)[self.cct.ctx_id.astype(np.int64)]
        pid = m.stat_id(self.scopes, "point", Combine.SUM)
        if pid is None:
            raise CallpathError(f"metric {m.name!r} has no {scope} values and no point values "
                                "to derive them from")
        point = self.summary(pid)[self.cct.ctx_id.astype(np.int64)]
        return self.cct.inclusive(point) if scope == "execution" else self.cct.exclusive(point)

    def inclusive(self, metric: str | int | Metric) -> F64:
        """Summed inclusive values per node (preorder), from the summary profile."""
        return self._scoped(metric, "execution")

    def exclusive(self, metric: str | int | Metric) -> F64:
        """Summed exclusive values per node: cost without callees (see CCT.exclusive)."""
        return self._scoped(metric, "function")

    # ---- per execution context -----------------------------------------------------------

    def context_store(self) -> ContextStore:
        """Context-major values, from ``cct.db`` or by transposing the profiles."""
        if self.context_values is None:
            summaries = {p.index for p in self.profiles if p.is_summary}
            self.context_values = transpose(self.values, self.n_ctx_slots, summaries).store()
        return self.context_values

    def values_in(self, profile: int, metric: str | int | Metric, scope: str) -> F64:
        """Per-node values of one execution context for a metric's propagated scope."""
        m = metric if isinstance(metric, Metric) else self.metric(metric)
        pid = m.prop_id(self.scopes, scope)
        if pid is None:
            raise CallpathError(f"metric {m.name!r} has no {scope!r} values per context")
        dense = self.values[profile].dense(pid, self.n_ctx_slots)
        return dense[self.cct.ctx_id.astype(np.int64)]


def standard_metric(name: str, first_id: int, scopes: list[PropagationScope],
                    description: str = "", unit: str = "", period: float = 1.0) -> Metric:
    """A metric with the three standard scopes (point, function, execution) and their sums,
    using ids ``first_id .. first_id+2`` for both propagated and summary values. ``scopes``
    must hold POINT, FUNCTION and EXECUTION (see :func:`standard_scopes`)."""
    idx = {s.name: i for i, s in enumerate(scopes)}
    insts, sums = [], []
    for k, sc in enumerate((POINT, FUNCTION, EXECUTION)):
        insts.append(ScopeInstance(idx[sc.name], first_id + k))
        sums.append(SummaryStatistic(idx[sc.name], "$$", Combine.SUM, first_id + k))
    return Metric(name, insts, sums, description=description, unit=unit, period=period)


def standard_scopes() -> list[PropagationScope]:
    return [POINT, FUNCTION, EXECUTION]


def summarize(metrics: list[Metric], scopes: list[PropagationScope],
              profiles: list[ProfileBlock]) -> ProfileBlock:
    """The canonical summary profile from per-execution-context profiles.

    For every summary statistic whose formula is ``$$`` (sum, min or max of the propagated
    values over contexts), combine the matching propagated values. Vectorised over all values;
    contexts without a value count as 0 for min and max, as in hpcprof."""
    stat_of_prop: dict[int, list[SummaryStatistic]] = {}
    for m in metrics:
        for s in m.summaries:
            if s.formula != "$$":
                continue
            for inst in m.scope_insts:
                if inst.scope == s.scope:
                    stat_of_prop.setdefault(inst.prop_metric_id, []).append(s)
    if not profiles:
        return ProfileBlock.empty()
    ctx = np.concatenate([p.ctx_of_values() for p in profiles]).astype(np.uint64)
    met = np.concatenate([np.asarray(p.metric_ids) for p in profiles])
    val = np.concatenate([np.asarray(p.values) for p in profiles])
    n_prof = len(profiles)
    out_c, out_m, out_v = [], [], []
    for prop_id, stats in stat_of_prop.items():
        sel = met == prop_id
        c = ctx[sel]
        v = val[sel]
        uc, inv = np.unique(c, return_inverse=True)
        counts = np.bincount(inv, minlength=len(uc))
        for s in stats:
            if s.combine == Combine.SUM:
                r = np.zeros(len(uc))
                np.add.at(r, inv, v)
            elif s.combine == Combine.MIN:
                r = np.full(len(uc), np.inf)
                np.minimum.at(r, inv, v)
                r = np.where(counts < n_prof, np.minimum(r, 0.0), r)
            else:
                r = np.full(len(uc), -np.inf)
                np.maximum.at(r, inv, v)
                r = np.where(counts < n_prof, np.maximum(r, 0.0), r)
            out_c.append(uc)
            out_m.append(np.full(len(uc), s.stat_metric_id, dtype=np.uint64))
            out_v.append(r)
    if not out_c:
        return ProfileBlock.empty()
    return ProfileBlock.from_triples(np.concatenate(out_c), np.concatenate(out_m),
                                     np.concatenate(out_v))


def build_experiment(cct: CCT, metrics: list[Metric], scopes: list[PropagationScope],
                     contexts: list[ExecutionContext], blocks: list[ProfileBlock], *,
                     modules: list[LoadModule] | None = None,
                     files: list[SourceFile] | None = None,
                     functions: list[Function] | None = None,
                     id_names: list[str] | None = None, title: str = "",
                     description: str = "", traces: Traces | None = None,
                     path: Path | None = None, format: str = "memory") -> Experiment:
    """An in-memory experiment from per-context profiles; prepends the summary profile."""
    summary = summarize(metrics, scopes, blocks)
    profs = [ExecutionContext(0, (), True, 1)]
    profs += [ExecutionContext(i + 1, c.ids, False, c.flags) for i, c in enumerate(contexts)]
    n_slots = int(cct.ctx_id.max()) + 1
    for b in blocks:
        if len(b.ctx_ids):
            n_slots = max(n_slots, int(b.ctx_ids.max()) + 1)
    return Experiment(cct=cct, metrics=metrics, scopes=scopes, profiles=profs,
                      values=BlockStore.of([summary, *blocks]), n_ctx_slots=n_slots,
                      modules=modules or [], files=files or [], functions=functions or [],
                      id_names=list(id_names) if id_names else list(DEFAULT_ID_NAMES),
                      title=title, description=description, traces=traces, path=path,
                      format=format)


def propagate(cct: CCT, metrics: list[Metric], scopes: list[PropagationScope],
              block: ProfileBlock) -> ProfileBlock:
    """Add the ``function`` (exclusive) and ``execution`` (inclusive) values of every metric to a
    profile that holds only ``point`` values, as hpcprof does per execution context."""
    node = cct.node_of_ctx()
    ctx_all = block.ctx_of_values().astype(np.int64)
    parts_c = [ctx_all]
    parts_m = [np.asarray(block.metric_ids, dtype=np.int64)]
    parts_v = [np.asarray(block.values)]
    ctx_ids = cct.ctx_id.astype(np.int64)
    for m in metrics:
        pid = m.prop_id(scopes, "point")
        if pid is None:
            continue
        sel = block.metric_ids == pid
        c = ctx_all[sel]
        inside = (c < len(node)) & (node[np.minimum(c, len(node) - 1)] >= 0)
        point = np.zeros(len(cct))
        np.add.at(point, node[c[inside]], block.values[sel][inside])
        for scope, fn in (("function", cct.exclusive), ("execution", cct.inclusive)):
            target = m.prop_id(scopes, scope)
            if target is None:
                continue
            vals = fn(point)
            nz = vals != 0
            parts_c.append(ctx_ids[nz])
            parts_m.append(np.full(int(nz.sum()), target, dtype=np.int64))
            parts_v.append(vals[nz])
    return ProfileBlock.from_triples(np.concatenate(parts_c), np.concatenate(parts_m),
                                     np.concatenate(parts_v))
