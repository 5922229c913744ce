"""The vectorised algorithms of comparisons and flame graphs against plain Python versions, on
the real HPCToolkit databases in ../shared/data: the union tree (hashes along paths, one
unique, preorder by levels) against a dictionary of root paths, and the flame layout
(Euler-tour prefix sums) against placing children one by one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import callpath
from callpath.analysis.compare import union_tree
from callpath.analysis.flame import topdown_frame
from callpath.analysis.source import tree_source
from callpath.analysis.topdown import TopDownView
from callpath.model import Experiment, NodeKind
from conftest import shared_path
from view_support import get_text, post_json, serve

DBS = ["small.d", "small.nostruct.d", "loops-cputime-t.d"]


def _paths(exp: Experiment) -> list[tuple[object, ...]]:
    """Each node's description chained from the root, as plain tuples (the offset only for
    code without source information, as the hashes)."""
    c = exp.cct
    out: list[tuple[object, ...]] = []
    for i in range(len(c)):
        f, m, fl = int(c.function[i]), int(c.module[i]), int(c.file[i])
        own = (int(c.kind[i]), int(c.relation[i]), int(c.entry_point[i]),
               exp.functions[f].name if f >= 0 else None,
               os.path.basename(exp.modules[m].path) if m >= 0 else None,
               os.path.basename(exp.files[fl].path) if fl >= 0 else None,
               int(c.line[i]), c.entry_names.get(i))
        kind, line = int(c.kind[i]), int(c.line[i])
        if (kind == NodeKind.INSTRUCTION and line == 0) or (
                kind == NodeKind.FUNCTION and not (f >= 0 and exp.functions[f].name)):
            own = (*own, int(c.offset[i]))  # no source information: known by its address
        p = int(c.parent[i])
        out.append((*out[p], own) if p >= 0 else (own,))
    return out


@pytest.mark.parametrize("a, b", [("small.d", "small.nostruct.d"),
                                  ("small.d", "loops-cputime-t.d"),
                                  ("small.nostruct.d", "small.nostruct.d"),
                                  ("loops-cputime-t.d", "loops-cputime-t.d")])
def test_union_tree_is_the_union_of_root_paths(a: str, b: str) -> None:
    inputs = [callpath.open(shared_path("hpctoolkit", "dbase", n)) for n in (a, b)]
    union, _mods, _files, _fns = union_tree(inputs)
    paths = [_paths(e) for e in inputs]
    # the union's own paths, described through its merged tables
    fake = Experiment(cct=union.cct, metrics=[], scopes=[], profiles=[],
                      values=None,  # type: ignore[arg-type]
                      n_ctx_slots=len(union.cct), modules=_mods, files=_files, functions=_fns)
    upaths = _paths(fake)
    assert len(set(upaths)) == len(upaths)  # one node per distinct path
    assert set(upaths) == set(paths[0]) | set(paths[1])
    for p, m in zip(paths, union.maps, strict=True):
        assert [upaths[u] for u in m.tolist()] == p  # every node maps to its own path
    # preorder with the first input's order kept, where it has no siblings that are the same
    # thing (loops.c has two loops on line 1000 in one procedure: one context of the union)
    if len(set(paths[0])) == len(paths[0]):
        assert np.all(np.diff(union.maps[0]) > 0)
    else:
        assert a == "loops-cputime-t.d" and len(set(paths[0])) == len(paths[0]) - 10
    c = union.cct
    assert np.all(c.parent[1:] < np.arange(1, len(c)))
    assert np.array_equal(c.subtree_end, type(c).from_columns(c.parent, c.kind).subtree_end)


def _naive_layout(view: TopDownView, incl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n = len(incl)
    x = np.zeros(n)
    nxt = np.zeros(n)  # where the next child of each node goes
    depth = np.zeros(n, np.int64)
    par = view.source.cct.parent
    for i in range(1, n):
        p = int(par[i])
        x[i] = x[p] + nxt[p]
        nxt[p] += max(float(incl[i]), 0.0)
        depth[i] = depth[p] + 1
    return x, depth


@pytest.mark.parametrize("name", DBS)
def test_flame_layout_matches_placing_children_one_by_one(name: str) -> None:
    exp = callpath.open(shared_path("hpctoolkit", "dbase", name))
    view = TopDownView(tree_source(exp, None))
    incl = exp.inclusive(0)
    frame = topdown_frame(view, incl, 0, 0.0)
    assert len(frame) == len(incl)  # nothing below zero width to drop
    x, depth = _naive_layout(view, incl)
    np.testing.assert_allclose(frame.x * frame.total, x[frame.nodes], rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(frame.depth, depth[frame.nodes])
    np.testing.assert_allclose(frame.w * frame.total, incl[frame.nodes])
    # only boxes of a pixel: the kept set is exactly the nodes at least 1/200 wide
    small = topdown_frame(view, incl, 0, 1 / 200)
    assert set(small.nodes.tolist()) == set(np.flatnonzero(incl >= incl[0] / 200).tolist())
    # zoomed on a node: its subtree, shifted to start at 0
    z = int(np.argsort(incl)[len(incl) // 2])
    zf = topdown_frame(view, incl, z, 0.0)
    if incl[z] > 0:
        sub = zf.nodes
        np.testing.assert_allclose(zf.x * zf.total, x[sub] - x[z], atol=1e-12)


def test_flame_and_compare_api_errors_are_one_line(tmp_path: Path) -> None:
    dbs = [shared_path("hpctoolkit", "dbase", n) for n in ("small.d", "loops-cputime-t.d")]
    with serve(dbs) as s:
        for params in ({"column": "m0e"}, {"width": "5"}, {"column": "zz"},
                       {"node": "t999999"}, {"view": "bottom-up", "column": "d0"}):
            status, text = get_text(s.url, "/api/db/1/flame", **params)
            err = json.loads(text)["error"]
            assert status == 400 and "\n" not in err, (params, status, text)
        f = json.loads(get_text(s.url, "/api/db/1/flame", view="top-down", width=800)[1])
        assert f["key"][0] == "r" and len(f["key"]) == len(f["x"]) == len(f["name"])
        for doc in ({"base": 0, "new": 0}, {"base": 0}, {"base": 0, "new": 9}, [1, 2]):
            status, body = post_json(s.url, "/api/compare", doc)
            assert status == 400 and "compare" in body["error"], (doc, status, body)
        status, body = post_json(s.url, "/api/compare", {"base": 0, "new": 1})
        assert status == 200 and body["id"] == 2 and body["compare"] == {"base": 0, "new": 1}
        assert [m["name"] for m in body["metrics"]][:2] == ["CPUTIME (sec) [base]",
                                                           "CPUTIME (sec) [new]"]
        # the new database answers like any other (its saved delta and ratio come with its
        # entry, as for any database), and the same pair is not built twice
        assert [d["name"] for d in body["derived"]][:2] == ["CPUTIME (sec) [delta] (I)",
                                                            "CPUTIME (sec) [ratio] (I)"]
        f = json.loads(get_text(s.url, "/api/db/2/flame", view="top-down",
                                derived=body["derived"])[1])
        assert f["color_name"] == "CPUTIME (sec) [delta] (I)"
        assert post_json(s.url, "/api/compare", {"base": 0, "new": 1})[1]["id"] == 2


def test_each_server_has_its_own_comparisons() -> None:
    """Two servers of one process (a test run, a notebook) each compare their own databases
    0 and 1: the second gets a tab of its own, not the first server's tab id (which on the
    second server names another database: the page then switched to that database and the
    comparison tab never appeared)."""
    names = ("small.d", "loops-cputime-t.d", "small.nostruct.d")
    dbs = [shared_path("hpctoolkit", "dbase", n) for n in names]
    with serve(dbs[:2]) as s:
        status, body = post_json(s.url, "/api/compare", {"base": 0, "new": 1})
        assert status == 200 and body["id"] == 2, body
    with serve(dbs[::-1]) as s:
        status, body = post_json(s.url, "/api/compare", {"base": 0, "new": 1})
        assert status == 200 and body["id"] == 3, body
        assert body["name"] == "small.nostruct.d → loops-cputime-t.d"
        listed = json.loads(get_text(s.url, "/api/databases")[1])
        assert [d["name"] for d in listed] == [*names[::-1], body["name"]]


def test_merge_of_disjoint_blocks_equals_the_sort() -> None:
    """The summary's merge without a sort (per-input blocks of other metrics) gives exactly
    the block a sort of all triples gives, and declines when two blocks share a key."""
    from callpath.analysis.compare import _merge_disjoint, sorted_block

    rng = np.random.default_rng(1)
    declined = 0
    for trial in range(200):
        blocks = []
        for i in range(int(rng.integers(1, 4))):
            n = int(rng.integers(0, 50))
            c = rng.integers(0, 30, n)
            m = rng.choice([3 * i, 3 * i + 1, 3 * i + 2], n) if trial % 2 else \
                rng.integers(0, 9, n)
            blocks.append(sorted_block(c, m, rng.random(n) + 0.1))
        got = _merge_disjoint(blocks)
        allc = np.concatenate([b.ctx_of_values() for b in blocks]).astype(np.int64)
        allm = np.concatenate([b.metric_ids for b in blocks]).astype(np.int64)
        ref = sorted_block(allc, allm, np.concatenate([b.values for b in blocks]))
        key = allc * 65536 + allm
        if len(np.unique(key)) != len(key):
            assert got is None
            declined += 1
            continue
        assert got is not None
        for f in ("ctx_ids", "starts", "metric_ids", "values"):
            np.testing.assert_array_equal(getattr(got, f), getattr(ref, f))
    assert 0 < declined < 200
