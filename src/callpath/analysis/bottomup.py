"""The Bottom-up view: procedures at the roots, and under each the calling contexts that
reach it, apportioning the procedure's cost among them.

A Bottom-up node stands for a set of *instances* — top-down procedure frames of the root's
procedure — together with, for each instance, the frame the chain has climbed to (its
*cursor*). Expanding a node moves every cursor one caller up and groups the instances by
(caller procedure, call-site line): that is one vectorised step per expansion, so the view
is built lazily as the user (or the report) opens nodes, never as a whole tree.

Values: exclusive = sum of the instances' exclusive values; inclusive = sum over the
instances that are outermost within the node (the recursion rule), both relative to the
top-down tree.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from callpath.analysis.flat import canonical_functions, procedure_keys, procedure_locations
from callpath.analysis.nodes import NodeTable, ViewKind
from callpath.analysis.source import TreeSource, call_sites
from callpath.analysis.topdown import View
from callpath.model import NodeKind
from callpath.model.treeops import group_rows, group_sum, nearest_marked, outermost

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


class BottomUpView(View):
    name = "bottom-up"

    def __init__(self, source: TreeSource) -> None:
        super().__init__(source)
        exp = source.exp
        cct = source.cct
        self._kind = source.column("kind")
        self._function = source.column("function")
        self._module = source.column("module")
        self._file = source.column("file")
        self._line = source.column("line").astype(np.int64)
        self._offset = source.column("offset")
        parent = cct.parent
        is_fn = self._kind == NodeKind.FUNCTION
        frame = nearest_marked(parent, is_fn)
        # the frame that called each frame, and the line it called from
        self._caller = np.where(parent >= 0, frame[np.maximum(parent, 0)], -1)
        self._site_line = call_sites(self._kind, self._file, self._line, parent)[0]
        self._pkey = procedure_keys(self._function, self._module, canonical_functions(exp))
        self._pmod, self._pfile, self._pline = procedure_locations(
            exp, self._function, self._module, self._file, self._line)
        self._subtree_end = cct.subtree_end

        # materialized nodes: table, parent, and member (instance, cursor) lists
        one = np.array([-1], np.int64)
        self._nodes = NodeTable(np.array([ViewKind.ROOT], np.uint8), one, one, one,
                                np.zeros(1, np.int64), np.zeros(1, np.uint64), one.copy())
        self._parents: list[I64] = [np.array([-1], np.int64)]
        self._mem_inst: list[I64] = [np.zeros(1, np.int64)]
        self._mem_cur: list[I64] = [np.zeros(1, np.int64)]
        self._mem_group: list[I64] = [np.zeros(1, np.int64)]
        self._kids: dict[int, I64] = {}
        # node -> (chunk, lo, hi): its members are _mem_*[chunk][lo:hi]
        self._chunk: list[int] = [0]
        self._lo: list[int] = [0]
        self._hi: list[int] = [1]
        self._flat_cache: tuple[I64, I64, I64, npt.NDArray[np.bool_]] | None = None

        frames = np.nonzero(is_fn)[0]
        self._kids[0] = self._materialize(0, frames, frames, self._pkey[frames],
                                          np.full(len(frames), -1, np.int64), root_level=True)

    # ---- materialization -----------------------------------------------------------------

    def _materialize(self, parent_node: int, inst: I64, cur: I64, key_a: I64, key_b: I64,
                     root_level: bool = False) -> I64:
        """Create one child of ``parent_node`` per distinct (key_a, key_b) among the given
        instances; returns the new node numbers."""
        if not len(inst):
            return np.zeros(0, np.int64)
        rid, first = group_rows(key_a, key_b)
        order = np.argsort(rid, kind="stable")  # each new node's members contiguous
        rid, inst, cur = rid[order], inst[order], cur[order]
        key_b = key_b[order]
        first = np.searchsorted(rid, np.arange(len(first)))
        base = len(self._nodes)
        rep = cur[first]
        count = len(first)
        if root_level:
            kinds = np.full(count, ViewKind.PROCEDURE, np.uint8)
            call_line = np.full(count, -1, np.int64)
        else:
            kinds = np.full(count, ViewKind.CALLER, np.uint8)
            call_line = key_b[first]
        self._nodes.extend(NodeTable(kinds, self._function[rep], self._pmod[rep],
                                     self._pfile[rep], self._pline[rep], self._offset[rep],
                                     call_line))
        self._parents.append(np.full(count, parent_node, np.int64))
        self._mem_inst.append(inst)
        self._mem_cur.append(cur)
        self._mem_group.append(base + rid)
        chunk = len(self._mem_inst) - 1
        ends = np.append(first[1:], len(rid))
        self._chunk.extend([chunk] * count)
        self._lo.extend(first.tolist())
        self._hi.extend(ends.tolist())
        self._flat_cache = None
        return np.arange(base, base + count, dtype=np.int64)

    def _members(self) -> tuple[I64, I64, I64, npt.NDArray[np.bool_]]:
        if self._flat_cache is None:
            group = np.concatenate(self._mem_group)
            inst = np.concatenate(self._mem_inst)
            cur = np.concatenate(self._mem_cur)
            outer = outermost(group, inst, self._subtree_end)
            self._flat_cache = (group, inst, cur, outer)
        return self._flat_cache

    # ---- View interface --------------------------------------------------------------------

    @property
    def nodes(self) -> NodeTable:
        return self._nodes

    @property
    def parent(self) -> I64:
        if len(self._parents) > 1:
            self._parents = [np.concatenate(self._parents)]
        return self._parents[0]

    def children(self, node: int) -> I64:
        self.check_node(node)
        kids = self._kids.get(node)
        if kids is None:
            chunk, lo, hi = self._chunk[node], self._lo[node], self._hi[node]
            inst_n = self._mem_inst[chunk][lo:hi]
            cur_n = self._mem_cur[chunk][lo:hi]
            caller = self._caller[cur_n]
            keep = caller >= 0
            inst_n, cur_n, caller = inst_n[keep], cur_n[keep], caller[keep]
            kids = self._materialize(node, inst_n, caller, self._pkey[caller],
                                     self._site_line[cur_n])
            self._kids[node] = kids
        return kids

    def has_children(self, nodes: I64) -> npt.NDArray[np.bool_]:
        """A node has children when some member's cursor has a caller: answered from the
        members, without materializing the children (which would grow the view)."""
        out = np.zeros(len(nodes), dtype=bool)
        for i, n in enumerate(nodes.tolist()):
            self.check_node(n)
            kids = self._kids.get(n)
            if kids is not None:
                out[i] = len(kids) > 0
            else:
                cur = self._mem_cur[self._chunk[n]][self._lo[n]:self._hi[n]]
                out[i] = bool((self._caller[cur] >= 0).any())
        return out

    def aggregate(self, incl: F64, excl: F64) -> tuple[F64, F64]:
        group, inst, _, outer = self._members()
        n = len(self._nodes)
        vi = group_sum(group[outer], incl[inst[outer]], n)
        ve = group_sum(group, excl[inst], n)
        return vi, ve

    def members(self, node: int) -> I64:
        """The top-down procedure frames (instances) a Bottom-up node apportions."""
        self.check_node(node)
        chunk, lo, hi = self._chunk[node], self._lo[node], self._hi[node]
        return np.sort(self._mem_inst[chunk][lo:hi])

    def expand_all(self, max_depth: int) -> None:
        """Materialize every node down to ``max_depth`` (the root is depth 0)."""
        frontier = [0]
        for _ in range(max_depth):
            nxt: list[int] = []
            for v in frontier:
                nxt.extend(self.children(v).tolist())
            frontier = nxt
            if not frontier:
                break
