"""The three views against the seed's worked example and against real HPCToolkit databases."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

import callpath
from callpath.analysis.bottomup import BottomUpView
from callpath.analysis.flat import FlatView, canonical_functions
from callpath.analysis.navigate import expand, hot_path
from callpath.analysis.nodes import ViewKind
from callpath.analysis.source import select_contexts, tree_source
from callpath.analysis.topdown import TopDownView, View
from callpath.model import Experiment, NodeKind, Relation
from conftest import V4_DATABASES, shared_path
from seedtrees import G1, G2, G3, seed_experiment


def _by_label(view: View, parent: int) -> dict[str, int]:
    return {view.label(int(k)): int(k) for k in view.children(parent)}


def _procedure(view: View, name: str) -> int:
    hits = [i for i in range(len(view)) if view.nodes.kind[i] == ViewKind.PROCEDURE
            and view.node_name(i) == name]
    assert len(hits) == 1, (name, hits)
    return hits[0]


@pytest.mark.parametrize("metric, scale", [(0, 3.0), (1, 3000.0)])
def test_seed_example_bottom_up_and_flat(metric: int, scale: float) -> None:
    """seeds/000 "Understanding Metrics": g_a = g_1 + g_3 = 6 + 3 = 9 (g_2 is inside g_1),
    the Flat g_x equals it, and exclusive costs add. Two threads with costs x1 and x2, so
    the summary is 3x the figure's numbers (and 3000x for the second metric)."""
    exp = seed_experiment()
    src = tree_source(exp)
    td = TopDownView(src)
    ti, te = td.inclusive(metric), td.exclusive(metric)
    assert (ti[G1], ti[G2], ti[G3]) == (6 * scale, 3 * scale, 3 * scale)

    bu = BottomUpView(src)
    roots = _by_label(bu, 0)
    assert set(roots) == {"m", "f", "g", "h"}
    bi, be = bu.inclusive(metric), bu.exclusive(metric)
    g_a = roots["g"]
    assert bi[g_a] == ti[G1] + ti[G3] == 9 * scale  # not + g_2
    assert be[g_a] == te[G1] + te[G2] + te[G3] == 3 * scale
    callers = _by_label(bu, g_a)
    bi, be = bu.inclusive(metric), bu.exclusive(metric)  # expansion added nodes
    assert set(callers) == {"[8] « m", "[2] « f", "[3] « g"}
    assert bi[callers["[8] « m"]] == ti[G1]
    assert bi[callers["[2] « f"]] == ti[G3]
    assert bi[callers["[3] « g"]] == ti[G2]
    # the caller chain of g_3 continues to m
    assert list(_by_label(bu, callers["[2] « f"])) == ["[7] « m"]

    flat = FlatView(src)
    fi, fe = flat.inclusive(metric), flat.exclusive(metric)
    g_x = _procedure(flat, "g")
    assert fi[g_x] == bi[g_a] == 9 * scale
    assert fe[g_x] == be[g_a]
    # exclusive costs add up: over procedures, over Bottom-up roots, over load modules
    procs = [_procedure(flat, n) for n in "mfgh"]
    assert fe[procs].sum() == ti[0] == 11 * scale
    assert sum(be[r] for r in roots.values()) == ti[0]
    modules = [i for i in range(len(flat)) if flat.nodes.kind[i] == ViewKind.MODULE]
    assert fe[modules].sum() == ti[0]
    # file2.c holds g and h: inclusive counts the outermost g/h frames once per path
    f2 = next(i for i in range(len(flat)) if flat.label(i) == "file2.c")
    assert fi[f2] == ti[G1] + ti[G3] and fe[f2] == fe[procs[2]] + fe[procs[3]]


def test_seed_flat_lines_and_call_sites() -> None:
    exp = seed_experiment()
    flat = FlatView(tree_source(exp))
    fi, fe = flat.inclusive(0), flat.exclusive(0)
    g = _procedure(flat, "g")
    kids = _by_label(flat, g)
    assert set(kids) == {"file2.c:3", "file2.c:4"}
    # line 3 of g: own cost in g_1, g_2, g_3 (1 each), inclusive of the outermost lines only
    assert fe[kids["file2.c:3"]] == 3 * 3
    assert fi[kids["file2.c:3"]] == (4 + 1) * 3
    site = _by_label(flat, kids["file2.c:4"])
    assert list(site) == ["[4] » h"]
    assert fi[site["[4] » h"]] == 6 * 3


def _check_invariants(exp: Experiment) -> None:
    """For every procedure: Flat exclusive = sum of its Top-down exclusive values; Bottom-up
    root inclusive = Flat inclusive (for procedures that are never inlined); and the Flat
    exclusive of procedures and inlined code sums to the root's inclusive value."""
    src = tree_source(exp)
    cct = exp.cct
    canon = canonical_functions(exp)
    flat = FlatView(src)
    bu = BottomUpView(src)
    is_fn = cct.kind == NodeKind.FUNCTION
    called = is_fn & (cct.relation != Relation.INLINED_CALL)
    inlined_fns = set(canon[cct.function[is_fn & ~called]].tolist())
    for k in range(len(exp.metrics)):
        te = src.exclusive(k)
        fi, fe = flat.inclusive(k), flat.exclusive(k)
        bi, be = bu.inclusive(k), bu.exclusive(k)
        td_sum: dict[int, float] = defaultdict(float)
        for node in np.nonzero(called & (cct.function >= 0))[0]:
            td_sum[int(canon[cct.function[node]])] += float(te[node])
        flat_proc = {int(canon[flat.nodes.function[i]]): i for i in range(len(flat))
                     if flat.nodes.kind[i] == ViewKind.PROCEDURE and flat.nodes.function[i] >= 0}
        bu_root = {int(canon[bu.nodes.function[i]]): int(i) for i in bu.children(0)
                   if bu.nodes.function[i] >= 0}
        assert set(td_sum) == set(flat_proc)
        for f, i in flat_proc.items():
            assert fe[i] == pytest.approx(td_sum[f], rel=1e-12, abs=1e-12)
            if f not in inlined_fns:
                r = bu_root[f]
                assert bi[r] == pytest.approx(fi[i], rel=1e-12, abs=1e-12)
        kinds = flat.nodes.kind
        total = fe[(kinds == ViewKind.PROCEDURE) | (kinds == ViewKind.INLINED)].sum()
        # cost outside any procedure (e.g. at a thread's entry) is not in a procedure
        outside = src.exclusive(k)[(cct.kind != NodeKind.FUNCTION)
                                   & (flat_anchor_is_top(exp))].sum()
        assert total + outside == pytest.approx(float(src.inclusive(k)[0]), rel=1e-9)
        assert be[bu.children(0)].sum() + outside == pytest.approx(float(src.inclusive(k)[0]),
                                                                   rel=1e-9)


def flat_anchor_is_top(exp: Experiment) -> np.ndarray:
    """Nodes whose cost belongs to no procedure: not below any function node."""
    from callpath.model.treeops import nearest_marked

    cct = exp.cct
    frame = nearest_marked(cct.parent, cct.kind == NodeKind.FUNCTION)
    return np.asarray(frame < 0)


@pytest.mark.parametrize("db", V4_DATABASES)
def test_view_invariants_on_hpctoolkit_databases(db: str) -> None:
    _check_invariants(callpath.open(shared_path("hpctoolkit", "dbase", db)))


def test_view_invariants_on_experiment_xml() -> None:
    _check_invariants(callpath.open(shared_path("hatchet", "hpctoolkit-cpi-database")))


def test_seed_invariants() -> None:
    _check_invariants(seed_experiment())


def test_hot_path_follows_children_above_threshold() -> None:
    exp = callpath.open(shared_path("hpctoolkit", "dbase", "small.d"))
    td = TopDownView(tree_source(exp))
    path = hot_path(td, 0, lambda: td.inclusive(0), 50.0)
    labels = [td.label(n) for n in path]
    # caller has 0.605316 of 1.210259 s = 50.015%, spinsleep called directly 49.985%
    assert labels == ["<program root>", "main thread", "» main", "small.c:11",
                      "[11] » caller", "small.c:7", "[7] » spinsleep", "loop at small.c:3",
                      "small.c:3"]
    assert hot_path(td, 0, lambda: td.inclusive(0), 51.0)[-1] == path[3]


def test_thread_view_sums_only_the_selected_contexts() -> None:
    exp = callpath.open(shared_path("hpctoolkit", "dbase", "loops-cputime-t.d"))
    sel = select_contexts(exp, "THREAD 0")
    assert len(sel) == 1
    one = tree_source(exp, sel)
    td = TopDownView(one)
    m = exp.metrics[0]
    direct = exp.values_in(sel[0], m, "execution")
    assert np.allclose(td.inclusive(0), direct, rtol=1e-12, atol=1e-12)
    both = select_contexts(exp, r"THREAD [02]", regex=True)
    assert len(both) == 2
    s2 = tree_source(exp, both)
    assert s2.inclusive(0)[0] == pytest.approx(sum(exp.values_in(p, m, "execution")[0]
                                                   for p in both))


def test_bottom_up_expands_lazily() -> None:
    exp = callpath.open(shared_path("hpctoolkit", "dbase", "loops-cputime-t.d"))
    bu = BottomUpView(tree_source(exp))
    n_roots = len(bu)
    rows = expand(bu, 0, lambda: bu.inclusive(0), depth=1)
    assert len(bu) == n_roots and len(rows) == n_roots  # depth 1: roots only
    expand(bu, 0, lambda: bu.inclusive(0), depth=3)
    assert len(bu) > n_roots
    # a child's inclusive never exceeds its parent's (instances are a subset)
    vals = bu.inclusive(0)
    par = bu.parent
    assert np.all(vals[1:] <= vals[par[1:]] + 1e-9)
