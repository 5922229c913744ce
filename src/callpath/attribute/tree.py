"""The merged calling context tree under construction.

Contexts are interned by ``(parent, kind, relation, function, file, line, module, offset)``, so
the same calling context reached from different threads, processes or files becomes one node;
that is the merge of all execution contexts. Nodes are appended parents-first and put in
preorder once at the end (children in a canonical order, so that the result does not depend on
the order in which measurements were read: what makes parallel reduction give an identical
database).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from callpath.model import CCT, NodeKind, Relation
from callpath.model.cct import HAS_FUNCTION, HAS_POINT, HAS_SRCLOC

Key = tuple[int, int, int, int, int, int, int, int]


@dataclass
class TreeBuilder:
    """Interns contexts; node 0 is the global root."""

    keys: list[Key] = field(default_factory=lambda: [(-1, int(NodeKind.ROOT), 255, -1, -1, 0,
                                                      -1, 0)])
    index: dict[Key, int] = field(default_factory=dict)
    entry_names: dict[int, str] = field(default_factory=dict)
    entry_points: dict[int, int] = field(default_factory=dict)

    def node(self, parent: int, kind: int, relation: int, function: int = -1, file: int = -1,
             line: int = 0, module: int = -1, offset: int = 0) -> int:
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

    def columns(self) -> npt.NDArray[np.int64]:
        """The interned keys as an ``n × 8`` array (parent, kind, relation, function, file,
        line, module, offset)."""
        return np.array(self.keys, dtype=np.int64).reshape(len(self.keys), 8)

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
    first = np.searchsorted(parent[sib], np.arange(n + 1))  # CSR over ``sib``
    levels = []
    level = np.zeros(1, dtype=np.int64)
    while len(level):
        counts = first[level + 1] - first[level]
        total = int(counts.sum())
        if not total:
            break
        ends = np.cumsum(counts)
        at = np.repeat(first[level] - (ends - counts), counts) + np.arange(total)
        level = sib[at]  # the next level, grouped by parent, siblings in order
        levels.append(level)
    size = np.ones(n, dtype=np.int64)
    for kids in reversed(levels):
        size += np.bincount(parent[kids], weights=size[kids], minlength=n).astype(np.int64)
    for kids in levels:
        # siblings before a child: the sizes of their subtrees, summed within the group
        before = np.cumsum(size[kids]) - size[kids]
        par = parent[kids]
        group = np.flatnonzero(np.r_[True, par[1:] != par[:-1]])
        start = np.repeat(before[group], np.diff(np.r_[group, len(kids)]))
        pos[kids] = pos[par] + 1 + before - start
    return pos
