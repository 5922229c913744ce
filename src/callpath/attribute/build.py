"""From a built tree and per-thread samples to an :class:`Experiment`: preorder, propagated
metrics per execution context, the summary profile, traces. Shared by every input format."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.attribute.propagate import (
    N_SCOPES,
    SCOPES,
    GroupStats,
    Propagator,
    dense_block,
    group_stats,
    make_metric,
    stats_columns,
    summary_block,
)
from callpath.attribute.samples import Samples, release
from callpath.attribute.tree import TreeBuilder
from callpath.formats.v4.stream import Groups, Mapper, ValueSource, serial
from callpath.model import (
    CCT,
    ExecutionContext,
    Experiment,
    Function,
    Identifier,
    LoadModule,
    ProfileBlock,
    SourceFile,
    TraceLine,
    Traces,
)
from callpath.model.contexts import DEFAULT_ID_NAMES
from callpath.model.values import BlockStore, transpose

FunctionKey = tuple[str, int, int, int, int, int]


class Tables:
    """The database's module, file and function tables, interned.

    A function is keyed by its name, module, offset, file and line, plus a ``tag`` that is
    not written: two placeholders that hpcprof keeps apart under one name (hpcrun's
    ``GPUKernl`` and ``GPUTrace`` are both ``<gpu kernel>``) are two functions, and so two
    contexts, with the same content (their tags are hpcrun's placeholder codes)."""

    def __init__(self) -> None:
        self.modules: dict[str, int] = {}
        self.files: dict[str, int] = {}
        self.functions: dict[FunctionKey, int] = {}

    def module(self, path: str) -> int:
        return self.modules.setdefault(path, len(self.modules))

    def file(self, path: str) -> int:
        return self.files.setdefault(path, len(self.files))

    def function(self, name: str, module: int, offset: int, file: int, line: int,
                 tag: int = 0) -> int:
        return self.functions.setdefault((name, module, offset, file, line, tag),
                                         len(self.functions))


@dataclass
class ThreadData:
    """One execution context: its samples (builder node, metric index and value of each,
    usually spilled to disk: :mod:`callpath.attribute.samples`) and its trace (sample times
    and builder nodes) if recorded. Merging partial reductions renumbers nodes and metrics
    through ``node_map`` and ``metric_map`` instead of rewriting the samples."""

    ids: tuple[Identifier, ...]
    samples: Samples
    trace_times: npt.NDArray[np.uint64] | None = None
    trace_nodes: npt.NDArray[np.int64] | None = None
    node_map: npt.NDArray[np.int64] | None = None
    metric_map: npt.NDArray[np.int64] | None = None
    name: str = ""  # the thread's name as measured (ExecutionContext.name)

    def arrays(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                              npt.NDArray[np.float64]]:
        """Node, metric and value of every sample, renumbered."""
        a, m, v = self.samples.arrays()
        if self.node_map is not None:
            a = self.node_map[a]
        if self.metric_map is not None:
            m = self.metric_map[m]
        return a, m, v


def canonical_tables(tb: TreeBuilder, tables: Tables
                     ) -> tuple[Tables, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Sort the tables by content and renumber the tree's references, so that the database
    does not depend on the order in which contexts were met (workers, files). Returns the
    tables, the tree's key columns renumbered (:meth:`TreeBuilder.columns`) and the order
    key of siblings: kind, relation, function, file, line, module, offset, where function,
    file and module are ranks of their content (a missing one first), so that siblings are
    ordered by content."""
    mods = sorted(tables.modules)
    mod_map = np.array([mods.index(m) for m in tables.modules] + [-1], dtype=np.int64)
    fls = sorted(tables.files)
    file_map = np.array([fls.index(f) for f in tables.files] + [-1], dtype=np.int64)
    fn_keys = [(name, mods[mod_map[m]] if m >= 0 else "", off, fls[file_map[f]] if f >= 0
                else "", line, tag) for (name, m, off, f, line, tag) in tables.functions]
    fn_new = [(name, int(mod_map[m]), off, int(file_map[f]), line, tag)
              for (name, m, off, f, line, tag) in tables.functions]
    order = sorted(range(len(fn_keys)), key=lambda i: fn_keys[i])
    fn_map = np.full(len(fn_keys) + 1, -1, dtype=np.int64)
    fn_map[np.array(order, dtype=np.int64)] = np.arange(len(order))
    out = Tables()
    for m in mods:
        out.module(m)
    for f in fls:
        out.file(f)
    for i in order:
        out.function(*fn_new[i])
    cols = tb.columns()
    if len(cols) > 1:
        cols[1:, 3] = fn_map[cols[1:, 3]]
        cols[1:, 4] = file_map[cols[1:, 4]]
        cols[1:, 6] = mod_map[cols[1:, 6]]
    # sibling order: a missing function sorts as ("",), a missing file or module as ""
    fns = list(out.functions)
    fn_rank = _ranks([*fns, ("",)])
    file_rank = _ranks([*fls, ""])
    mod_rank = _ranks([*mods, ""])
    key = np.stack([cols[:, 1], cols[:, 2], fn_rank[cols[:, 3]], file_rank[cols[:, 4]],
                    cols[:, 5], mod_rank[cols[:, 6]], cols[:, 7]], axis=1)
    return out, cols, key


def _ranks(items: list[Any]) -> npt.NDArray[np.int64]:
    """Dense rank of each item among all (equal items, equal ranks); the last item is what
    index -1 stands for."""
    distinct = sorted(set(items))
    rank = {x: r for r, x in enumerate(distinct)}
    return np.array([rank[x] for x in items], dtype=np.int64)


@dataclass
class ReducedExperiment(Experiment):
    """An experiment from the reduction: its per-context blocks are computed when asked for,
    and :func:`callpath.formats.v4.writer.write_v4` streams them through ``value_source``
    (computed, written and transposed in parallel workers, never all held at once)."""

    value_source: ValueSource | None = None


#: patterns of sampled nodes whose size bounds :meth:`ContextValues.bound` keeps (per process)
BOUNDS_KEPT = 64


class ContextValues:
    """The propagated values of the execution contexts, computed on demand.

    A context's block takes ~30 ms to compute and more to pickle, so the writer's workers
    compute the blocks of their own contexts (the tree and the samples are shared with them
    copy-on-write) instead of receiving them. The summary's sums are the propagation of the
    point values summed over contexts in order (cheap, done here once); its ``-M stats``
    partials come from the transposed values (:func:`group_stats`)."""

    def __init__(self, cct: CCT, new_index: npt.NDArray[np.int64], threads: list[ThreadData],
                 nm: int, stats: bool) -> None:
        self.prop = Propagator(cct)
        self.n = len(cct)
        self.nm = nm
        self.stats = stats
        self.threads = threads
        self.new_index = new_index
        #: :meth:`bound` per pattern of sampled nodes (packed nonzero masks of the metrics)
        self._bounds: dict[bytes, tuple[int, int]] = {}
        # the spill files close when the experiment is gone
        weakref.finalize(self, release, [th.samples for th in threads])
        self.point_sums = [np.zeros(self.n) for _ in range(nm)]
        for th in threads:
            points = self.points(th)
            for k in range(nm):
                self.point_sums[k] += points[k]

    def points(self, th: ThreadData) -> list[npt.NDArray[np.float64]]:
        """Per metric, the node-ordered point values of one execution context."""
        anchor, metric, value = th.arrays()
        a = self.new_index[anchor]
        return [np.bincount(a[metric == k], weights=value[metric == k],
                            minlength=self.n).astype(np.float64) for k in range(self.nm)]

    def block(self, i: int) -> ProfileBlock:
        """Profile ``i``'s block: 0 is the summary, ``i`` the ``i``-th context in order."""
        if i == 0:
            return self.summary(self._groups_in_memory() if self.stats else [])
        return dense_block(self.prop.matrix(self.points(self.threads[i - 1])))

    def bound(self, i: int) -> tuple[int, int]:
        """Upper bounds of the value and context counts of profile ``i``'s block (``i`` > 0),
        which let the writer place every block before it is computed.

        They depend only on where the context has samples of each metric, and in SPMD runs
        many contexts sample the same places: the bounds are kept per pattern of sampled
        nodes (the nonzero masks, bit-packed: 26 KB per metric of a 208,000-node tree; at
        most :data:`BOUNDS_KEPT` patterns), so a repeated pattern costs its points and a
        dictionary look-up instead of the propagations (4 ms a profile on the bench)."""
        points = self.points(self.threads[i - 1])
        key = b"".join(np.packbits(p != 0).tobytes() for p in points)
        got = self._bounds.get(key)
        if got is None:
            got = self.prop.bound(points)
            if len(self._bounds) < BOUNDS_KEPT:
                self._bounds[key] = got
        return got

    def summary(self, groups: list[Any]) -> ProfileBlock:
        """The summary block, given the :func:`group_stats` of every transposed piece."""
        cols = None
        if self.stats:
            cols = stats_columns(groups, self.n, N_SCOPES * self.nm, len(self.threads))
        return summary_block(self.prop, self.point_sums, cols)

    def _groups_in_memory(self) -> list[GroupStats]:
        """The statistics without the writer: transpose every block here (small runs)."""
        store = BlockStore(len(self.threads) + 1, self.block)
        cm = transpose(store, self.n, {0})
        first = np.flatnonzero(np.r_[True, (cm.ctx[1:] != cm.ctx[:-1])
                                     | (cm.metric[1:] != cm.metric[:-1])]) if len(cm.ctx) \
            else np.zeros(0, np.int64)
        return [group_stats(Groups(cm.ctx[first], cm.metric[first],
                                   np.append(first, len(cm.ctx)), cm.prof, cm.values))]


def finish(tb: TreeBuilder, tables: Tables, threads: list[ThreadData],
           metric_names: list[tuple[str, str]], *, title: str, description: str,
           stats: bool = False, parallel: Mapper = serial) -> ReducedExperiment:
    """The experiment (with ``stats``, also hpcprof's ``-M stats`` partials): execution
    contexts ordered by identifier tuple, values propagated per execution context in that
    order, so the result does not depend on how the reduction was split. Its blocks are
    computed on demand; ``parallel`` maps the writer's work over forked workers."""
    tables, cols, order_key = canonical_tables(tb, tables)
    cct, new_index = tb.freeze(cols, order_key)
    nm = len(metric_names)
    order = sorted(range(len(threads)), key=lambda i: [(x.kind, x.logical_id, x.physical_id)
                                                       for x in threads[i].ids])
    ordered = [threads[i] for i in order]
    values = ContextValues(cct, new_index, ordered, nm, stats)
    contexts, lines = [], []
    for pi, th in enumerate(ordered):
        contexts.append(ExecutionContext(pi + 1, th.ids, name=th.name))
        if th.trace_times is not None and th.trace_nodes is not None:
            nodes = th.trace_nodes if th.node_map is None else th.node_map[th.trace_nodes]
            lines.append(TraceLine(pi + 1, th.trace_times, cct.ctx_id[new_index[nodes]]))
    traces = None
    nonempty = [t for t in lines if len(t.timestamps)]
    if nonempty:
        traces = Traces(min(int(t.timestamps.min()) for t in nonempty),
                        max(int(t.timestamps.max()) for t in nonempty), lines)
    metrics = [make_metric(name, k, desc, stats=stats, n_metrics=nm)
               for k, (name, desc) in enumerate(metric_names)]
    fn_table = [Function(name, mod, off, fl, line)
                for (name, mod, off, fl, line, _tag) in tables.functions]
    profs = [ExecutionContext(0, (), True, 1), *contexts]
    # kinds past HPCToolkit's own (PROCESS, see attribute.processes) are named in meta.db
    top = max((x.kind for c in contexts for x in c.ids), default=0)
    id_names = [*DEFAULT_ID_NAMES, "PROCESS"] if top >= len(DEFAULT_ID_NAMES) \
        else list(DEFAULT_ID_NAMES)
    source = ValueSource(values.block, parallel, group_stats if stats else None,
                         values.summary, values.bound)
    return ReducedExperiment(cct=cct, metrics=metrics, scopes=list(SCOPES), profiles=profs,
                             values=BlockStore(len(profs), values.block),
                             n_ctx_slots=int(cct.ctx_id.max()) + 1,
                             modules=[LoadModule(p) for p in tables.modules],
                             files=[SourceFile(p) for p in tables.files], functions=fn_table,
                             title=title, description=description, traces=traces,
                             id_names=id_names,
                             value_source=source)
