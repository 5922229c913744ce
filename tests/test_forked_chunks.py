"""How the parallel reduction and writer cut their work into one contiguous chunk per worker."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from callpath.attribute.forked import chunks


def test_equal_counts_without_weights() -> None:
    assert [list(c) for c in chunks(list(range(7)), 3)] == [[0, 1], [2, 3, 4], [5, 6]]


def test_weights_cut_at_equal_cost() -> None:
    # the first items cost three times more (as the transpose's pieces of interior contexts)
    w = [3.0] * 4 + [1.0] * 12
    assert [len(c) for c in chunks(list(range(16)), 2, w)] == [4, 12]
    assert [len(c) for c in chunks(list(range(16)), 3, w)] == [3, 5, 8]  # cuts at 9, 16 of 24


@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=60), st.integers(1, 8))
def test_chunks_cover_the_items_in_order(weights: list[float], n: int) -> None:
    items = list(range(len(weights)))
    got = chunks(items, n, weights)
    assert len(got) == n
    assert [x for c in got for x in c] == items
    # no chunk's cost exceeds its share by more than the costliest item
    total = sum(weights)
    for c in got:
        assert sum(weights[i] for i in c) <= total / n + max(weights) + 1e-6 * total
    assert np.all(np.diff([len(c) for c in chunks(items, n)]) <= 1) or n > len(items)
