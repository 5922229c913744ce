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

    def freeze(self, sort_keys: list[tuple[object, ...]]) -> tuple[CCT, npt.NDArray[np.int64]]:
        """The tree in preorder, and ``new_index[old_node]``. ``sort_keys[i]`` orders the
        children of one parent (a content key, independent of reading order)."""
        n = len(self.keys)
        cols = np.array(self.keys, dtype=np.int64).reshape(n, 8)
        parent = cols[:, 0]
        kids: list[list[int]] = [[] for _ in range(n)]
        for i in range(1, n):
            kids[int(parent[i])].append(i)
        order: list[int] = []
        stack = [0]
        while stack:
            v = stack.pop()
            order.append(v)
            ks = kids[v]
            if ks:
                ks.sort(key=lambda c: sort_keys[c])
                stack.extend(reversed(ks))
        perm = np.asarray(order, dtype=np.int64)
        new_index = np.empty(n, dtype=np.int64)
        new_index[perm] = np.arange(n, dtype=np.int64)
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
