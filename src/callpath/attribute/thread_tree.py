"""Vectorised attribution of one thread's calling context tree.

The context (anchor) of a measured node depends only on its parent's anchor and on its own
frame (a module address, a Python line, ...). Both are turned into integers and the pair
``(parent anchor, frame)`` is looked up, one tree level at a time, in a sorted array of pairs
already seen: in an SPMD program nearly every thread repeats the call paths of the others, so
after the first thread almost every node is resolved by one ``searchsorted`` per level, and only
the pairs never seen before run Python code (structure chains, interning contexts).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from callpath.attribute.tree import TreeBuilder, levels

I64 = npt.NDArray[np.int64]
FRAME_BITS = 24  # frames per reduction: 16 M distinct (module, address) or (code, line)


class _SortedMemo:
    """int64 keys → int64 values: sorted arrays plus a dict of recent additions."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.int64)
        self.vals = np.zeros(0, dtype=np.int64)
        self.pending: dict[int, int] = {}

    def lookup(self, keys: I64) -> tuple[I64, npt.NDArray[np.bool_]]:
        self._flush()
        if len(self.keys) == 0:
            return np.zeros(len(keys), dtype=np.int64), np.zeros(len(keys), dtype=bool)
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        hit = self.keys[pos] == keys
        return self.vals[pos], hit

    def add(self, key: int, val: int) -> None:
        self.pending[key] = val

    def _flush(self) -> None:
        if not self.pending:
            return
        k = np.fromiter(self.pending.keys(), dtype=np.int64, count=len(self.pending))
        v = np.fromiter(self.pending.values(), dtype=np.int64, count=len(self.pending))
        self.pending = {}
        keys = np.concatenate([self.keys, k])
        vals = np.concatenate([self.vals, v])
        order = np.argsort(keys, kind="stable")
        self.keys, self.vals = keys[order], vals[order]


class Walker:
    """Anchors of threads' nodes in one :class:`TreeBuilder`, memoised across threads.

    A frame is a ``(kind, module, address)`` row; its steps are the contexts it adds below its
    parent's anchor, or a fixed anchor whatever its parent (the root of partial call paths).
    """

    def __init__(self, tb: TreeBuilder, top_level: Callable[[], int] | None = None,
                 entries: bool = False) -> None:
        self.tb = tb
        #: whether :meth:`anchors_and_entries` is used (the entries are then remembered too)
        self.track_entries = entries
        #: where frames found directly under the global root go instead (hpcprof puts such
        #: "top-level" machine code under an unknown caller); None: leave them there
        self.top_level = top_level
        self.frame_index: dict[tuple[int, int, int], int] = {}
        self.steps: list[tuple[tuple[int, ...], ...] | int] = []  # per frame id
        self.pairs = _SortedMemo()  # parent anchor << FRAME_BITS | frame id -> anchor
        self.entries = _SortedMemo()  # the same keys -> the first context the frame adds

    def frame_ids(self, kind: I64, module: I64, address: I64,
                  make: Callable[[int, int, int], tuple[tuple[int, ...], ...] | int]) -> I64:
        """Frame ids of the ``(kind, module, address)`` rows (one Python step per distinct
        row of this thread); ``make`` gives the steps of a frame never seen, or a fixed
        anchor (an int)."""
        rows = np.ascontiguousarray(np.stack([kind, module, address], axis=1), dtype=np.int64)
        view = rows.view(np.dtype((np.void, 24))).ravel()
        _, first, inverse = np.unique(view, return_index=True, return_inverse=True)
        ids = np.empty(len(first), dtype=np.int64)
        index = self.frame_index
        for j, (k, m, a) in enumerate(rows[first].tolist()):
            key = (k, m, a)
            fid = index.get(key)
            if fid is None:
                fid = len(self.steps)
                if fid >= 1 << FRAME_BITS:
                    raise OverflowError("too many distinct frames for one reduction")
                self.steps.append(make(k, m, a))
                index[key] = fid
            ids[j] = fid
        return ids[inverse.ravel()]

    def anchors(self, parent: I64, frame: I64, root_anchor: int) -> I64:
        """Anchor of every node (node 0 is the thread's root, anchored at ``root_anchor``);
        ``parent`` must list parents before children."""
        return self.anchors_and_entries(parent, frame, root_anchor, False)[0]

    def anchors_and_entries(self, parent: I64, frame: I64, root_anchor: int,
                            entries: bool = True) -> tuple[I64, I64]:
        """Anchors as :meth:`anchors`, and (with ``entries``) each node's *entry*: the first
        context its frame adds below its parent's anchor (the procedure a call enters; the
        anchor itself for a frame of one context or none). hpcprof attributes the values of
        metrics marked ``move2proc`` there (hpcrun's GPU times and counts: to the kernel's
        function, not to its line)."""
        assert self.track_entries or not entries, "Walker(entries=True) remembers entries"
        n = len(parent)
        anchor = np.full(n, -1, dtype=np.int64)
        entry = np.full(n if entries else 0, -1, dtype=np.int64)
        if n == 0:
            return anchor, entry
        anchor[0] = root_anchor
        if entries:
            entry[0] = root_anchor
        node = self.tb.node
        for kids in levels(parent):
            pa = anchor[parent[kids]]
            fr = frame[kids]
            key = (pa << FRAME_BITS) | fr
            got, hit = self.pairs.lookup(key)
            if not hit.all():
                miss_keys, first = np.unique(key[~hit], return_index=True)
                miss_idx = np.flatnonzero(~hit)[first]
                for k, i in zip(miss_keys.tolist(), miss_idx.tolist(), strict=True):
                    st = self.steps[int(fr[i])]
                    if isinstance(st, int):
                        a = e = st
                    else:
                        a = int(pa[i])
                        if a == 0 and st and self.top_level is not None:
                            a = self.top_level()
                        e = -1
                        for s in st:
                            a = node(a, *s)
                            if e < 0:
                                e = a
                        if e < 0:
                            e = a
                    self.pairs.add(k, a)
                    if self.track_entries:
                        self.entries.add(k, e)
                got, hit = self.pairs.lookup(key)
            anchor[kids] = got
            if entries:
                entry[kids] = self.entries.lookup(key)[0]
        return anchor, entry
