"""The merged calling context tree under construction.

Contexts are interned by ``(parent, kind, relation, function, file, line, module, offset)``, so
the same calling context reached from different threads, processes or files becomes one node;
that is the merge of all execution contexts. Nodes are appended parents-first and put in
preorder once at the end (children in a canonical order, so that the result does not depend on
the order in which measurements were read: what makes parallel reduction give an identical
database).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.model import CCT, NodeKind, Relation
from callpath.model.cct import HAS_FUNCTION, HAS_POINT, HAS_SRCLOC

Key = tuple[int, int, int, int, int, int, int, int]
I64 = npt.NDArray[np.int64]


@dataclass
class TreeBuilder:
    """Interns contexts; node 0 is the global root.

    While contexts are interned the keys are tuples with a dictionary over them; once a
    partial reduction is done it is **sealed** (:meth:`seal`): the keys become one
    ``n × 8`` array (:meth:`columns`), which is what a worker pickles back (a few
    milliseconds instead of a tenth of a second each way for a 200,000-node tree) and what
    :meth:`absorb` merges, level by level, without a Python step per node. Interning into
    a sealed builder rebuilds the tuples first (nothing on the reduction's path does)."""

    keys: list[Key] = field(default_factory=lambda: [(-1, int(NodeKind.ROOT), 255, -1, -1, 0,
                                                      -1, 0)])
    index: dict[Key, int] = field(default_factory=dict)
    entry_names: dict[int, str] = field(default_factory=dict)
    entry_points: dict[int, int] = field(default_factory=dict)
    sealed: I64 | None = field(default=None, repr=False)

    def node(self, parent: int, kind: int, relation: int, function: int = -1, file: int = -1,
             line: int = 0, module: int = -1, offset: int = 0) -> int:
        if self.sealed is not None:
            self._unseal()
        key = (parent, kind, relation, function, file, line, module, offset)
        got = self.index.get(key)
        if got is None:
            got = len(self.keys)
            self.keys.append(key)
            self.index[key] = got
        return got

    def entry(self, entry_point: int, name: str) -> int:
        n = self.node(0, int(NodeKind.ENTRY), int(Relation.NONE), line=entry_point)
        self.entry_names[n] = name
        self.entry_points[n] = entry_point
        return n

    def seal(self) -> None:
        """Hold the keys as one array from now on, dropping the tuples and the dictionary."""
        if self.sealed is None:
            self.sealed = self._key_array()
            self.keys, self.index = [], {}

    def _unseal(self) -> None:
        assert self.sealed is not None
        self.keys = [tuple(r) for r in self.sealed.tolist()]
        self.index = {k: i for i, k in enumerate(self.keys) if i}
        self.sealed = None

    def _key_array(self) -> I64:
        return np.fromiter(itertools.chain.from_iterable(self.keys), dtype=np.int64,
                           count=8 * len(self.keys)).reshape(len(self.keys), 8)

    def columns(self) -> I64:
        """The interned keys as an ``n × 8`` array (parent, kind, relation, function, file,
        line, module, offset); a copy, for the caller to renumber."""
        return self.sealed.copy() if self.sealed is not None else self._key_array()

    def __getstate__(self) -> dict[str, Any]:
        return {"cols": self.sealed if self.sealed is not None else self._key_array(),
                "entry_names": self.entry_names, "entry_points": self.entry_points}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.keys, self.index = [], {}
        self.sealed = state["cols"]
        self.entry_names = state["entry_names"]
        self.entry_points = state["entry_points"]

    def absorb(self, cols: I64) -> I64:
        """Intern every node of another tree, given as its key columns (:meth:`columns`: row
        0 its root, parents before children, function, file and module already in this
        builder's tables); returns the node each of its nodes became here. Seals this
        builder.

        A node can only be here already if its parent is, so the other tree is matched one
        level at a time: its rows under nodes that were here are looked up by a hash of the
        whole row in this builder's sorted row hashes (and compared whole), every other row
        is new and appended, in the other tree's order."""
        self.seal()
        assert self.sealed is not None
        mine = self.sealed
        n0 = len(mine)
        node_map = np.zeros(len(cols), dtype=np.int64)
        hashes = _row_hash(mine)
        order = np.argsort(hashes, kind="stable")
        hashes = hashes[order]
        added = []
        top = n0
        for level in levels(cols[:, 0]):
            rows = cols[level]
            rows[:, 0] = node_map[rows[:, 0]]
            found = np.full(len(level), -1, dtype=np.int64)
            cand = np.flatnonzero(rows[:, 0] < n0)
            if len(cand):
                h = _row_hash(rows[cand])
                pos = np.searchsorted(hashes, h)
                at = np.minimum(pos, n0 - 1)
                hit = hashes[at] == h
                ids = order[at]
                same = hit & np.all(mine[ids] == rows[cand], axis=1)
                found[cand[same]] = ids[same]
                # a hash shared by several rows here, and the first is not this row
                for i in np.flatnonzero(hit & ~same).tolist():
                    j = int(pos[i]) + 1
                    while j < n0 and hashes[j] == h[i]:
                        if np.array_equal(mine[order[j]], rows[cand[i]]):
                            found[cand[i]] = order[j]
                            break
                        j += 1
            new = found < 0
            k = int(np.count_nonzero(new))
            found[new] = np.arange(top, top + k)
            top += k
            if k:
                added.append(rows[new])
            node_map[level] = found
        if added:
            self.sealed = np.concatenate([mine, *added])
        return node_map

    def freeze(self, cols: npt.NDArray[np.int64], order_key: npt.NDArray[np.int64]
               ) -> tuple[CCT, npt.NDArray[np.int64]]:
        """The tree in preorder, and ``new_index[old_node]``. ``cols`` are the key columns
        (:meth:`columns`, tables renumbered as they should appear); ``order_key`` (``n × k``)
        orders the children of one parent by its columns, left to right (a content key,
        independent of reading order; ties keep creation order).

        Vectorised: siblings sorted by one ``lexsort``, then subtree sizes bottom-up and
        preorder positions top-down, one numpy step per tree level (not per node)."""
        n = len(cols)
        parent = cols[:, 0]
        pos = preorder_positions(parent, order_key)
        perm = np.empty(n, dtype=np.int64)
        perm[pos] = np.arange(n, dtype=np.int64)
        new_index = pos
        c = cols[perm]
        kind = c[:, 1]
        rel = c[:, 2]
        new_parent = np.where(c[:, 0] >= 0, new_index[np.maximum(c[:, 0], 0)], -1)
        is_entry = kind == NodeKind.ENTRY
        line = np.where(is_entry, 0, c[:, 5])
        flags = np.zeros(n, dtype=np.uint8)
        flags |= np.where(c[:, 3] >= 0, HAS_FUNCTION, 0).astype(np.uint8)
        flags |= np.where((c[:, 4] >= 0) & ~is_entry, HAS_SRCLOC, 0).astype(np.uint8)
        flags |= np.where(c[:, 6] >= 0, HAS_POINT, 0).astype(np.uint8)
        calls = (rel == Relation.CALL) | (rel == Relation.INLINED_CALL)
        plain = (kind != NodeKind.ROOT) & ~is_entry & ~calls
        entry_point = np.zeros(n, dtype=np.int64)
        names = {}
        for old, ep in self.entry_points.items():
            entry_point[new_index[old]] = ep
            names[int(new_index[old])] = self.entry_names[old]
        cct = CCT.from_columns(new_parent, kind, relation=rel, function=c[:, 3], file=c[:, 4],
                               line=line, module=c[:, 6], offset=np.maximum(c[:, 7], 0),
                               propagation=plain.astype(np.int64), entry_point=entry_point,
                               entry_names=names, flags=flags)
        return cct, new_index


def preorder_positions(parent: npt.NDArray[np.int64], order_key: npt.NDArray[np.int64]
                       ) -> npt.NDArray[np.int64]:
    """Preorder position of every node of a tree given by ``parent`` (node 0 the root,
    parents before children), children visited in the order of their ``order_key`` rows
    (ties: lower index first)."""
    n = len(parent)
    pos = np.zeros(n, dtype=np.int64)
    if n <= 1:
        return pos
    idx = np.arange(1, n, dtype=np.int64)
    keys = [idx] + [order_key[1:, j] for j in range(order_key.shape[1] - 1, -1, -1)]
    sib = np.lexsort([*keys, parent[1:]]) + 1  # children grouped by parent, in order
    by_level = levels(parent, sib)
    size = np.ones(n, dtype=np.int64)
    for kids in reversed(by_level):
        size += np.bincount(parent[kids], weights=size[kids], minlength=n).astype(np.int64)
    for kids in by_level:
        # siblings before a child: the sizes of their subtrees, summed within the group
        before = np.cumsum(size[kids]) - size[kids]
        par = parent[kids]
        group = np.flatnonzero(np.r_[True, par[1:] != par[:-1]])
        start = np.repeat(before[group], np.diff(np.r_[group, len(kids)]))
        pos[kids] = pos[par] + 1 + before - start
    return pos


def levels(parent: I64, sib: I64 | None = None) -> list[I64]:
    """The nodes below the root (node 0) of the tree given by ``parent`` (parents before
    children), one array per depth, each grouped by parent in the order of the level above;
    within a parent, children in the order of ``sib`` (all nodes but the root, grouped by
    parent; default: by index)."""
    n = len(parent)
    if n <= 1:
        return []
    if sib is None:
        sib = np.argsort(parent[1:], kind="stable") + 1
    first = np.searchsorted(parent[sib], np.arange(n + 1))  # CSR over ``sib``
    out = []
    level = np.zeros(1, dtype=np.int64)
    while len(level):
        counts = first[level + 1] - first[level]
        total = int(counts.sum())
        if not total:
            break
        ends = np.cumsum(counts)
        at = np.repeat(first[level] - (ends - counts), counts) + np.arange(total)
        level = sib[at]
        out.append(level)
    return out


def _row_hash(rows: I64) -> npt.NDArray[np.uint64]:
    """A 64-bit hash of each row (multiply and xor-shift per column, wrapping)."""
    h = np.full(len(rows), 0x9E3779B97F4A7C15, dtype=np.uint64)
    for j in range(rows.shape[1]):
        h ^= rows[:, j].astype(np.uint64)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
    return h
