"""The calling context tree (CCT) as a struct of numpy arrays.

Nodes are stored in preorder, so the subtree of node ``i`` is the contiguous index range
``[i, subtree_end[i])``. That single property is what makes the hot operations linear and
vectorised: an inclusive sum is a difference of two prefix sums, a subtree filter is a slice,
and the children of every node come out of one stable sort of ``parent``.

Node 0 is always the implicit global context of HPCToolkit's databases (``ctx_id`` 0), the
parent of the entry points. Each node keeps the database's context identifier in ``ctx_id``;
metric values on disk are keyed by that identifier, not by the node index.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError

IntArray = npt.NDArray[np.int64]


class NodeKind(IntEnum):
    """What a node represents. The first four values are the v4 ``lexicalType`` values."""

    FUNCTION = 0
    LOOP = 1
    LINE = 2
    INSTRUCTION = 3
    ENTRY = 4  # an entry point ("main thread", "application thread", ...)
    ROOT = 5  # the implicit global context


class Relation(IntEnum):
    """How a node is reached from its parent (the v4 ``relation`` values, plus NONE)."""

    LEXICAL = 0
    CALL = 1
    INLINED_CALL = 2
    NONE = 255  # root and entry points


class EntryPoint(IntEnum):
    """The v4 ``entryPoint`` enumeration."""

    UNKNOWN = 0
    MAIN_THREAD = 1
    APPLICATION_THREAD = 2


KIND_NAMES = {
    NodeKind.FUNCTION: "function",
    NodeKind.LOOP: "loop",
    NodeKind.LINE: "line",
    NodeKind.INSTRUCTION: "instruction",
    NodeKind.ENTRY: "entry",
    NodeKind.ROOT: "root",
}

# Bits of the v4 context ``flags`` field: which optional fields are present.
HAS_FUNCTION = 1
HAS_SRCLOC = 2
HAS_POINT = 4


@dataclass
class CCT:
    """The calling context tree. All arrays have one element per node, in preorder.

    ``function``, ``file`` and ``module`` index the experiment's tables, -1 when absent;
    ``flags`` records which of them the source format stated (v4 ``hasFunction`` / ``hasSrcLoc``
    / ``hasPoint``) so that a database is written back exactly as it was read.
    """

    ctx_id: npt.NDArray[np.uint32]
    parent: IntArray  # -1 for the root
    kind: npt.NDArray[np.uint8]
    relation: npt.NDArray[np.uint8]
    flags: npt.NDArray[np.uint8]
    function: IntArray
    file: IntArray
    line: npt.NDArray[np.uint32]
    module: IntArray
    offset: npt.NDArray[np.uint64]
    propagation: npt.NDArray[np.uint16]
    entry_point: npt.NDArray[np.uint16]
    entry_names: dict[int, str] = field(default_factory=dict)  # node index -> pretty name
    # Derived from ``parent``; a reader that already knows them may pass them in.
    depth: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    subtree_end: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    # per propagation bit: (order, pos, end_pos) of CCT.exclusive, which depend on the tree
    # only; cached so that each further metric costs one cumulative sum
    _exclusive_plans: dict[int, tuple[IntArray, IntArray, IntArray]] = field(
        default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.ctx_id)
        arrays = (self.parent, self.kind, self.relation, self.flags, self.function, self.file,
                  self.line, self.module, self.offset, self.propagation, self.entry_point)
        if any(len(a) != n for a in arrays):
            raise CallpathError("calling context tree arrays differ in length")
        if n == 0 or self.parent[0] != -1:
            raise CallpathError("calling context tree must start with its root node")
        if n > 1 and np.any(self.parent[1:] >= np.arange(1, n)):
            raise CallpathError("calling context tree is not in preorder (parent after child)")
        if len(self.depth) != n:
            self.depth = _depths(self.parent)
        if len(self.subtree_end) != n:
            self.subtree_end = _subtree_ends(self.parent, self.depth)

    def __len__(self) -> int:
        return len(self.ctx_id)

    @classmethod
    def from_columns(
        cls,
        parent: npt.ArrayLike,
        kind: npt.ArrayLike,
        *,
        ctx_id: npt.ArrayLike | None = None,
        relation: npt.ArrayLike | None = None,
        function: npt.ArrayLike | None = None,
        file: npt.ArrayLike | None = None,
        line: npt.ArrayLike | None = None,
        module: npt.ArrayLike | None = None,
        offset: npt.ArrayLike | None = None,
        propagation: npt.ArrayLike | None = None,
        entry_point: npt.ArrayLike | None = None,
        entry_names: dict[int, str] | None = None,
        flags: npt.ArrayLike | None = None,
    ) -> CCT:
        """Build a tree from preorder columns, filling defaults the way HPCToolkit would.

        Defaults: ``ctx_id`` = node index; relation CALL for functions, LEXICAL otherwise;
        propagation bit 0 set on every non-call node (the "function" scope of v4 databases);
        flags derived from which of function / file / module are given.
        """
        par = np.asarray(parent, dtype=np.int64)
        n = len(par)
        knd = np.asarray(kind, dtype=np.uint8)

        def col(v: npt.ArrayLike | None, dtype: type, fill: int) -> npt.NDArray[Any]:
            return np.full(n, fill, dtype=dtype) if v is None else np.asarray(v, dtype=dtype)

        fn = col(function, np.int64, -1)
        fl = col(file, np.int64, -1)
        md = col(module, np.int64, -1)
        if relation is None:
            rel = np.where(knd == NodeKind.FUNCTION, Relation.CALL, Relation.LEXICAL)
            rel = np.where(knd >= NodeKind.ENTRY, Relation.NONE, rel).astype(np.uint8)
        else:
            rel = np.asarray(relation, dtype=np.uint8)
        if propagation is None:
            prop = ((rel == Relation.LEXICAL) & (knd < NodeKind.ENTRY)).astype(np.uint16)
        else:
            prop = np.asarray(propagation, dtype=np.uint16)
        if flags is None:
            flg = ((fn >= 0) * HAS_FUNCTION + (fl >= 0) * HAS_SRCLOC
                   + (md >= 0) * HAS_POINT).astype(np.uint8)
        else:
            flg = np.asarray(flags, dtype=np.uint8)
        return cls(
            ctx_id=col(ctx_id, np.uint32, 0) if ctx_id is not None
            else np.arange(n, dtype=np.uint32),
            parent=par,
            kind=knd,
            relation=rel,
            flags=flg,
            function=fn,
            file=fl,
            line=col(line, np.uint32, 0),
            module=md,
            offset=col(offset, np.uint64, 0),
            propagation=prop,
            entry_point=col(entry_point, np.uint16, 0),
            entry_names=dict(entry_names or {}),
        )

    # ---- navigation -------------------------------------------------------------------

    def children(self, node: int) -> IntArray:
        """Children of ``node`` in preorder (a small loop over siblings, not over the subtree)."""
        out: list[int] = []
        j = node + 1
        end = int(self.subtree_end[node])
        while j < end:
            out.append(j)
            j = int(self.subtree_end[j])
        return np.asarray(out, dtype=np.int64)

    def child_csr(self) -> tuple[IntArray, IntArray]:
        """All children at once: ``(offsets, children)`` with the children of node ``i`` in
        ``children[offsets[i]:offsets[i+1]]``, each group in preorder."""
        n = len(self)
        order = np.argsort(self.parent[1:], kind="stable") + 1
        counts = np.bincount(self.parent[1:], minlength=n) if n > 1 else np.zeros(n, np.int64)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return offsets, order.astype(np.int64)

    def node_of_ctx(self, n_slots: int | None = None) -> IntArray:
        """Map from context identifier to node index (-1 for identifiers not in the tree)."""
        size = int(self.ctx_id.max()) + 1 if len(self) else 0
        if n_slots is not None:
            size = max(size, n_slots)
        out = np.full(size, -1, dtype=np.int64)
        out[self.ctx_id.astype(np.int64)] = np.arange(len(self), dtype=np.int64)
        return out

    # ---- metric propagation ------------------------------------------------------------

    def inclusive(self, point: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Inclusive ("execution" scope) values from point values given per node: the sum
        over each subtree, as a difference of preorder prefix sums (one linear pass)."""
        csum = np.zeros(len(self) + 1, dtype=np.float64)
        np.cumsum(point, out=csum[1:])
        return csum[self.subtree_end] - csum[:-1]

    def exclusive(self, point: npt.NDArray[np.float64], bit: int = 0) -> npt.NDArray[np.float64]:
        """Exclusive values from point values given per node (v4 "function" scope).

        A value flows from a node to its parent while the node has propagation bit ``bit`` set,
        i.e. it is not reached by a call. So a node receives the point values of the descendants
        that share its *owner*, the nearest ancestor-or-self whose bit is clear. For a procedure
        that is its cost without callees; for a loop or line, the cost of the scope itself.
        Vectorised: owners by pointer jumping, then per-owner prefix sums over preorder ranges.
        """
        n = len(self)
        plan = self._exclusive_plans.get(bit)
        if plan is None:
            plan = self._exclusive_plan(bit)
            self._exclusive_plans[bit] = plan
        order, pos, end_pos = plan
        csum = np.zeros(n + 1, dtype=np.float64)
        np.cumsum(point[order], out=csum[1:])
        out: npt.NDArray[np.float64] = csum[end_pos] - csum[pos]
        return out

    def _exclusive_plan(self, bit: int) -> tuple[IntArray, IntArray, IntArray]:
        n = len(self)
        idx = np.arange(n, dtype=np.int64)
        passes = (self.propagation >> bit) & 1 == 1
        passes[0] = False
        owner = np.where(passes, self.parent, idx)
        while True:  # pointer jumping: O(log depth) rounds
            nxt = np.where(passes[owner], owner[owner], owner)
            if np.array_equal(nxt, owner):
                break
            owner = nxt
        order = np.lexsort((idx, owner))  # grouped by owner, preorder within a group
        grp = owner[order]
        # position of node v within the sorted order, and of the end of its subtree range
        pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n, dtype=np.int64)
        # members of v's group inside [v, subtree_end[v]) are contiguous from pos[v]
        key = grp * (n + 1) + order  # strictly increasing key for searchsorted
        end_key = owner * (n + 1) + self.subtree_end
        end_pos = np.searchsorted(key, end_key, side="left")
        return order.astype(np.int64), pos, end_pos.astype(np.int64)


def _depths(parent: IntArray) -> IntArray:
    """Depth of every node by pointer jumping over (ancestor, distance) pairs: O(n log depth)
    vectorised work instead of a Python loop over nodes."""
    n = len(parent)
    anc = parent.copy()
    anc[0] = 0
    dist = np.ones(n, dtype=np.int64)
    dist[0] = 0
    while True:
        active = anc != 0
        if not active.any():
            break
        a = anc[active]
        dist[active] += dist[a]
        anc[active] = anc[a]
    # nodes whose parent is the root end with anc == 0 and dist == 1 already
    return dist


def _subtree_ends(parent: IntArray, depth: IntArray) -> IntArray:
    """Preorder subtree end of every node: ``end[i] = i + size[i]``, with subtree sizes summed
    bottom-up one depth level at a time (one vectorised step per level, not per node)."""
    n = len(parent)
    size = np.ones(n, dtype=np.int64)
    if n > 1:
        max_depth = int(depth.max())
        order = np.argsort(depth, kind="stable")
        bounds = np.searchsorted(depth[order], np.arange(max_depth + 2))
        for d in range(max_depth, 0, -1):
            nodes = order[bounds[d]:bounds[d + 1]]
            np.add.at(size, parent[nodes], size[nodes])
    return np.arange(n, dtype=np.int64) + size
