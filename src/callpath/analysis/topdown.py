"""The common shape of the three views, and the Top-down view itself.

A view is a tree of *materialized* nodes, numbered from 0 (the root, whose values are the
aggregates). Every view knows how to turn top-down inclusive/exclusive arrays (one value per
node of the source tree) into its own inclusive/exclusive arrays (one value per materialized
node) — :meth:`View.aggregate`. Everything else (metric columns for any context selection,
derived metrics, sorting, hot path, find, CSV) is built on that one operation, so it is
written once for all views.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.analysis.nodes import NodeTable, ViewKind
from callpath.analysis.source import TreeSource, call_sites
from callpath.errors import CallpathError
from callpath.model import Metric, NodeKind, Relation

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

VIEW_NAMES = ("top-down", "bottom-up", "flat")


@dataclass(frozen=True)
class Location:
    """Where a node is in the source: its own file/line, and for a procedure activation or a
    caller also the call site (the line in the calling procedure)."""

    module: str | None
    file: str | None
    line: int | None
    call_file: str | None = None
    call_line: int | None = None


class View(ABC):
    """A tree over a :class:`TreeSource`, expanded lazily node by node."""

    name: str = ""

    def __init__(self, source: TreeSource) -> None:
        self.source = source
        self.exp = source.exp
        self._cache: dict[tuple[int, str, int], F64] = {}

    # ---- structure (materialized nodes) -------------------------------------------------

    @property
    @abstractmethod
    def nodes(self) -> NodeTable:
        """Description columns of the materialized nodes."""

    @property
    @abstractmethod
    def parent(self) -> I64:
        """Parent of each materialized node (-1 for the root)."""

    @abstractmethod
    def children(self, node: int) -> I64:
        """Children of ``node`` (materializing them if needed), in a stable order."""

    @abstractmethod
    def aggregate(self, incl: F64, excl: F64) -> tuple[F64, F64]:
        """This view's inclusive and exclusive values of every materialized node, given the
        top-down values of every source-tree node."""

    def __len__(self) -> int:
        return len(self.nodes)

    def check_node(self, node: int) -> int:
        if not 0 <= node < len(self):
            raise CallpathError(f"{self.name} view has no node {node} "
                                f"(materialized nodes are 0..{len(self) - 1})")
        return node

    def depth(self, node: int) -> int:
        d = 0
        par = self.parent
        while par[node] >= 0:
            node = int(par[node])
            d += 1
        return d

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root down to ``node``."""
        out = [node]
        par = self.parent
        while par[out[-1]] >= 0:
            out.append(int(par[out[-1]]))
        return out[::-1]

    def has_children(self, nodes: I64) -> npt.NDArray[np.bool_]:
        """Whether each node has children, without materializing them where a view can tell
        more cheaply (a viewer asks this for every row it shows)."""
        return np.array([len(self.children(int(n))) > 0 for n in nodes.tolist()], dtype=bool)

    def members(self, node: int) -> I64:
        """The source-tree nodes whose values this node sums (itself, in Top-down)."""
        return np.array([self.check_node(node)], dtype=np.int64)

    def stable_id(self, node: int) -> int:
        """An identifier that does not depend on how far the view was expanded (the calling
        context id in Top-down; the node number elsewhere, deterministic for a database)."""
        return node

    def find_stable(self, ident: int) -> int:
        """The node with a given :meth:`stable_id`."""
        return self.check_node(ident)

    # ---- labels --------------------------------------------------------------------------

    def label(self, node: int) -> str:
        return self.nodes.label(self.exp, node)

    def node_name(self, node: int) -> str:
        return self.nodes.name(self.exp, node)

    def node_type(self, node: int) -> str:
        from callpath.analysis.nodes import KIND_TYPES
        return KIND_TYPES[ViewKind(int(self.nodes.kind[node]))]

    def location(self, node: int) -> Location:
        t = self.nodes
        exp = self.exp
        m, f, ln = int(t.module[node]), int(t.file[node]), int(t.line[node])
        fn = int(t.function[node])
        kind = ViewKind(int(t.kind[node]))
        if fn >= 0 and kind in (ViewKind.PROCEDURE, ViewKind.ACTIVATION, ViewKind.INLINED,
                                ViewKind.CALLER):
            func = exp.functions[fn]
            if m < 0:
                m = func.module
            if f < 0 and func.file >= 0:
                f, ln = func.file, func.line
        cl = int(t.call_line[node])
        call_file = self._call_file(node)
        return Location(
            module=exp.modules[m].path if m >= 0 else None,
            file=exp.files[f].path if f >= 0 else None,
            line=ln if f >= 0 else None,
            call_file=call_file if cl >= 0 else None,
            call_line=cl if cl >= 0 else None,
        )

    def _call_file(self, node: int) -> str | None:
        return None

    # ---- metric columns ------------------------------------------------------------------

    def inclusive(self, metric: str | int | Metric) -> F64:
        return self._values(metric)[0]

    def exclusive(self, metric: str | int | Metric) -> F64:
        return self._values(metric)[1]

    def _values(self, metric: str | int | Metric) -> tuple[F64, F64]:
        k = self.source.metric_index(metric)
        n = len(self)
        hit_i = self._cache.get((k, "i", n))
        hit_e = self._cache.get((k, "e", n))
        if hit_i is None or hit_e is None:
            hit_i, hit_e = self.aggregate(self.source.inclusive(k), self.source.exclusive(k))
            self._cache = {key: v for key, v in self._cache.items() if key[2] == n}
            self._cache[(k, "i", n)] = hit_i
            self._cache[(k, "e", n)] = hit_e
        return hit_i, hit_e

    def values_for(self, source: TreeSource, metric: str | int | Metric) -> tuple[F64, F64]:
        """Inclusive and exclusive values computed from another source over the same tree
        (another context selection): used for per-context and per-group columns."""
        if source.cct is not self.source.cct:
            raise CallpathError("values_for needs a source over the same tree")
        k = source.metric_index(metric)
        return self.aggregate(source.inclusive(k), source.exclusive(k))


class TopDownView(View):
    """The calling context tree itself: node ``i`` is node ``i`` of the source tree."""

    name = "top-down"

    def __init__(self, source: TreeSource) -> None:
        super().__init__(source)
        cct = source.cct
        exp = source.exp
        orig = source.orig
        occt = exp.cct
        kind = occt.kind[orig]
        rel = occt.relation[orig]
        vk = np.full(len(cct), ViewKind.LINE, dtype=np.uint8)
        vk[kind == NodeKind.ROOT] = ViewKind.ROOT
        vk[kind == NodeKind.ENTRY] = ViewKind.ENTRY
        vk[kind == NodeKind.LOOP] = ViewKind.LOOP
        vk[kind == NodeKind.INSTRUCTION] = ViewKind.INSTRUCTION
        is_fn = kind == NodeKind.FUNCTION
        vk[is_fn] = ViewKind.ACTIVATION
        vk[is_fn & (rel == Relation.INLINED_CALL)] = ViewKind.INLINED
        # call sites from the original tree: a filter does not move a call
        site_line, site_file = call_sites(occt.kind, occt.file, occt.line, occt.parent)
        call_line = np.where(is_fn, site_line[orig], -1)
        self._parent_file = np.where(is_fn, site_file[orig], -1)
        entry_names = {}
        if occt.entry_names:
            pos = {int(o): i for i, o in enumerate(orig.tolist())} if len(orig) != len(occt) \
                else None
            for o, nm in occt.entry_names.items():
                i = o if pos is None else pos.get(o)
                if i is not None:
                    entry_names[i] = nm
        self._nodes = NodeTable(
            kind=vk,
            function=occt.function[orig],
            module=occt.module[orig],
            file=occt.file[orig],
            line=occt.line[orig].astype(np.int64),
            offset=occt.offset[orig],
            call_line=call_line.astype(np.int64),
            entry_names=entry_names,
        )
        self._csr: tuple[I64, I64] | None = None

    @property
    def nodes(self) -> NodeTable:
        return self._nodes

    @property
    def parent(self) -> I64:
        return self.source.cct.parent

    def children(self, node: int) -> I64:
        if self._csr is None:
            self._csr = self.source.cct.child_csr()
        off, ch = self._csr
        return ch[off[node]:off[node + 1]]

    def aggregate(self, incl: F64, excl: F64) -> tuple[F64, F64]:
        return incl, excl

    def depth(self, node: int) -> int:
        return int(self.source.cct.depth[node])

    def stable_id(self, node: int) -> int:
        return int(self.source.exp.cct.ctx_id[self.source.orig[node]])

    def find_stable(self, ident: int) -> int:
        hits = np.nonzero(self.source.exp.cct.ctx_id[self.source.orig] == ident)[0]
        if not len(hits):
            raise CallpathError(f"top-down view has no node with context id {ident}")
        return int(hits[0])

    def launch_line(self, node: int) -> int | None:
        """The nearest ancestor of ``node`` with a source file and a line: for a scope that has
        no place in the source (``<gpu kernel>`` and what hangs below it, a frame of a
        library without line information), the line that called or launched it."""
        parent = self.parent
        n = int(parent[node])
        while n > 0:
            loc = self.location(n)
            if loc.file and loc.line:
                return n
            n = int(parent[n])
        return None

    def _call_file(self, node: int) -> str | None:
        f = int(self._parent_file[node])
        return self.exp.files[f].path if f >= 0 else None
