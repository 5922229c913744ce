"""Merging partial trees (``TreeBuilder.absorb``, what ``callpath prof -j N`` does with the
workers' trees): the same nodes and the same map as interning the other tree's nodes one at a
time, for random overlapping trees, with the real row hash and with one that collides on
purpose (the path that compares every row sharing a hash); and the sealed form that a worker
pickles back."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callpath.attribute import tree as tree_mod
from callpath.attribute.tree import Key, TreeBuilder

Keys = list[tuple[int, int, int, int, int, int]]


def _build(paths: list[tuple[int, Keys]]) -> TreeBuilder:
    """A builder interning ``(parent choice, key)`` steps: each step is put under one of the
    nodes made so far (its index modulo their number), as the attribution does."""
    tb = TreeBuilder()
    made = [0]
    for choice, steps in paths:
        node = made[choice % len(made)]
        for kind, rel, fn, fl, line, off in steps:
            node = tb.node(node, kind, rel, fn, fl, line, -1 if fn < 0 else 0, off)
            made.append(node)
    return tb


small = st.integers(-1, 2)
step = st.tuples(st.integers(1, 3), st.integers(0, 1), small, small, st.integers(0, 3), small)
trees = st.lists(st.tuples(st.integers(0, 50), st.lists(step, min_size=1, max_size=4)),
                 max_size=25)


def _reference(out: TreeBuilder, other: TreeBuilder) -> tuple[list[Key], list[int]]:
    """Intern ``other``'s nodes into a copy of ``out`` one at a time (parents first)."""
    ref = TreeBuilder()
    for key in out.keys[1:]:
        ref.node(*key)
    node_map = [0] * len(other.keys)
    for i, (par, *rest) in enumerate(other.keys[1:], start=1):
        node_map[i] = ref.node(node_map[par], *rest)
    return ref.keys, node_map


def _check(a: list[tuple[int, Keys]], b: list[tuple[int, Keys]]) -> None:
    out, other = _build(a), _build(b)
    want_keys, want_map = _reference(out, other)
    got_map = out.absorb(other.columns())
    got = out.columns()
    # the same set of nodes (new ones may be numbered in another order) and a consistent map
    assert len(got) == len(want_keys)
    assert sorted(map(tuple, _resolve(got))) == sorted(map(tuple, _resolve(
        np.array(want_keys, dtype=np.int64).reshape(-1, 8))))
    assert got_map[0] == 0
    for i in range(1, len(other.keys)):
        par, *rest = other.keys[i]
        assert tuple(got[got_map[i]]) == (got_map[par], *rest)
    assert len(set(got_map.tolist())) == len(want_map)  # distinct nodes stay distinct


def _resolve(cols: np.ndarray) -> list[tuple[int, ...]]:
    """Each node as its path of keys from the root (numbering-independent)."""
    paths: list[tuple[int, ...]] = [()]
    for row in cols[1:].tolist():
        paths.append((*paths[row[0]], *row[1:]))
    return paths


@settings(max_examples=150, deadline=None)
@given(trees, trees)
def test_absorb_interns_like_one_node_at_a_time(a: list[tuple[int, Keys]],
                                                b: list[tuple[int, Keys]]) -> None:
    _check(a, b)


@settings(max_examples=60, deadline=None)
@given(trees, trees)
def test_absorb_with_colliding_hashes(a: list[tuple[int, Keys]], b: list[tuple[int, Keys]]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        # four hash values for every row: most lookups land on other rows first
        mp.setattr(tree_mod, "_row_hash", lambda rows: (rows[:, 5] % 4).astype(np.uint64))
        _check(a, b)


def test_sealed_builder_pickles_as_one_array_and_interns_again() -> None:
    tb = _build([(0, [(1, 0, 1, 1, 2, 0), (2, 1, 0, -1, 3, 1)]), (1, [(1, 0, 2, 0, 1, 0)])])
    tb.entry(7, "main thread")
    keys = list(tb.keys)
    got = pickle.loads(pickle.dumps(tb))
    assert got.sealed is not None and got.keys == [] and got.index == {}
    assert got.columns().tolist() == [list(k) for k in keys]
    assert got.entry_names == tb.entry_names and got.entry_points == tb.entry_points
    tb.seal()
    assert tb.sealed is not None and tb.sealed.tolist() == [list(k) for k in keys]
    # interning into a sealed builder finds the old nodes and appends new ones after them
    assert tb.node(*keys[2]) == 2
    assert tb.node(0, 3, 0) == len(keys)
    assert tb.sealed is None and tb.keys[:len(keys)] == keys
