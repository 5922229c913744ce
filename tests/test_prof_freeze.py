"""The vectorised preorder of the merged tree (``callpath.attribute.tree``): the same order as a
depth-first walk that visits each node's children sorted by their content key."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from callpath.attribute.tree import preorder_positions


def _reference(parent: list[int], key: list[tuple[int, ...]]) -> list[int]:
    kids: list[list[int]] = [[] for _ in parent]
    for i in range(1, len(parent)):
        kids[parent[i]].append(i)
    order: list[int] = []
    stack = [0]
    while stack:
        v = stack.pop()
        order.append(v)
        stack.extend(reversed(sorted(kids[v], key=lambda c: (key[c], c))))
    pos = [0] * len(parent)
    for p, v in enumerate(order):
        pos[v] = p
    return pos


@st.composite
def trees(draw: st.DrawFn) -> tuple[list[int], list[tuple[int, ...]]]:
    n = draw(st.integers(1, 60))
    parent = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    width = draw(st.integers(1, 3))
    key = [tuple(draw(st.integers(-1, 3)) for _ in range(width)) for _ in range(n)]
    return parent, key


@settings(max_examples=200, deadline=None)
@given(trees())
def test_preorder_matches_a_sorted_depth_first_walk(case: tuple[list[int], list[tuple[int, ...]]]
                                                    ) -> None:
    parent, key = case
    got = preorder_positions(np.array(parent, dtype=np.int64), np.array(key, dtype=np.int64))
    assert got.tolist() == _reference(parent, key)


def test_a_deep_chain_and_a_wide_fan() -> None:
    n = 5000
    chain = np.arange(-1, n - 1, dtype=np.int64)
    assert preorder_positions(chain, np.zeros((n, 1), np.int64)).tolist() == list(range(n))
    fan = np.zeros(n, dtype=np.int64)
    fan[0] = -1
    key = (-np.arange(n, dtype=np.int64)).reshape(n, 1)  # children in reverse index order
    pos = preorder_positions(fan, key)
    assert pos[0] == 0 and pos[1:].tolist() == list(range(n - 1, 0, -1))
