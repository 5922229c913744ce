"""Vectorised operations on preorder trees that several views share.

Both are whole-tree passes with O(log depth) numpy rounds or one sort, instead of a Python
loop over nodes: they are what keeps Bottom-up and Flat interactive at 10^6 nodes.

In ``model/`` because they depend on nothing but numpy and both the exporters
(:mod:`callpath.formats`) and the views (:mod:`callpath.analysis`) use them: data flows one
way, from ``model/`` up.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
Bool = npt.NDArray[np.bool_]


def nearest_marked(parent: I64, mark: Bool) -> I64:
    """For every node, its nearest ancestor-or-self with ``mark`` set (-1 if none).

    Pointer jumping: each round replaces an unmarked candidate by the candidate of that
    candidate, so the distance covered doubles per round."""
    n = len(parent)
    res = np.where(mark, np.arange(n, dtype=np.int64), parent).astype(np.int64)
    while True:
        safe = np.maximum(res, 0)
        bad = (res >= 0) & ~mark[safe]
        if not bad.any():
            return res
        res[bad] = res[res[bad]]


def outermost(group: I64, node: I64, subtree_end: I64) -> Bool:
    """Which (group, node) members have no *ancestor* member in the same group.

    This is hpcviewer's recursion rule: a scope's inclusive cost counts only the outermost
    instance on each path (g_1 + g_3, not g_2 nested in g_1). Members sorted by (group,
    preorder); a member is nested when some earlier member of its group has a subtree that
    extends past it, i.e. when the running maximum of ``group * N + subtree_end`` exceeds
    ``group * N + node`` (the group term keeps groups apart without resetting the maximum)."""
    m = len(node)
    out = np.ones(m, dtype=bool)
    if m == 0:
        return out
    big = np.int64(len(subtree_end) + 1)
    # one int64 key (group, node) and one sort: faster than a two-key lexsort
    order = np.argsort(group.astype(np.int64) * big + node)  # keys are distinct
    g = group[order].astype(np.int64)
    v = node[order].astype(np.int64)
    run = np.maximum.accumulate(g * big + subtree_end[v])
    nested = np.zeros(m, dtype=bool)
    nested[1:] = run[:-1] > g[1:] * big + v[1:]
    out[order] = ~nested
    return out


def group_rows(*cols: npt.NDArray[np.int64], stable: bool = False) -> tuple[I64, I64]:
    """Number distinct rows of equal-length integer columns: ``(row_id, first)`` where
    ``row_id[i]`` is the id of row ``i`` (ids in sorted order of the rows) and ``first[k]`` is
    the index of one row with id ``k`` -- its first occurrence with ``stable`` (for callers
    whose output depends on which row represents a group: an export frame's name). One
    lexsort, no hashing of Python tuples."""
    m = len(cols[0])
    if m == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    packed = _pack(cols)
    change = np.zeros(m, dtype=bool)
    change[0] = True
    if packed is not None:  # the rows fit one int64 key: one sort instead of a lexsort
        # unstable unless asked: any row of a group may represent it, and it is faster
        order = np.argsort(packed, kind="stable" if stable else None)
        s = packed[order]
        change[1:] = s[1:] != s[:-1]
    else:
        order = np.lexsort(cols[::-1])
        for c in cols:
            s = c[order]
            change[1:] |= s[1:] != s[:-1]
    ids_sorted = np.cumsum(change) - 1
    row_id = np.empty(m, dtype=np.int64)
    row_id[order] = ids_sorted
    first = order[change]
    return row_id, first.astype(np.int64)


def _pack(cols: tuple[npt.NDArray[np.int64], ...]) -> npt.NDArray[np.int64] | None:
    """The rows as one int64 each (mixed radix over the columns' ranges), or None if the
    ranges multiply past 2^62."""
    key = np.zeros(len(cols[0]), dtype=np.int64)
    total = 1
    for c in cols:
        lo, hi = int(c.min()), int(c.max())
        span = hi - lo + 1
        total *= span
        if total >= 1 << 62:
            return None
        key = key * span + (c.astype(np.int64) - lo)
    return key


def group_sum(group: I64, weights: npt.NDArray[np.float64], n: int) -> npt.NDArray[np.float64]:
    """Sum of ``weights`` per group id (0..n-1): one bincount."""
    out: npt.NDArray[np.float64] = np.bincount(group, weights=weights, minlength=n).astype(
        np.float64, copy=False)
    return out


def csr(parent: I64, n: int) -> tuple[I64, I64]:
    """Children lists of a parent array (any order of nodes): ``(offsets, children)``, each
    child list in increasing node number."""
    has = parent >= 0
    kids = np.nonzero(has)[0]
    order = np.argsort(parent[kids], kind="stable")
    kids = kids[order]
    counts = np.bincount(parent[has], minlength=n)
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    return off, kids.astype(np.int64)
