"""The v4 reader against HPCToolkit's own text dumps of the same databases.

``small.yaml`` and ``small.nostruct.yaml`` were written by HPCToolkit's format library from
``small.d`` and ``small.nostruct.d``: every context, metric value and trace element. The tests
compare all of them with what callpath reads, field by field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import callpath
from callpath.model import Experiment, NodeKind
from conftest import shared_path
from hpcyaml import load_dump, walk_contexts

SCOPE_TYPES = {"custom": 0, "point": 1, "execution": 2, "transitive": 3}
RELATIONS = {"lexical": 0, "call": 1, "inlined_call": 2}
LEXICAL = {"function": 0, "loop": 1, "line": 2, "instruction": 3}
ENTRY_POINTS = {"unknown_entry": 0, "main_thread": 1, "application_thread": 2}
CTX_FLAGS = {"has_function": 1, "has_srcloc": 2, "has_point": 4}

CASES = [("small.d", "small.yaml"), ("small.nostruct.d", "small.nostruct.yaml")]


@pytest.fixture(params=CASES, ids=[c[0] for c in CASES])
def pair(request: pytest.FixtureRequest) -> tuple[Experiment, dict[str, Any]]:
    db, dump = request.param
    exp = callpath.open(shared_path("hpctoolkit", "dbase", db))
    return exp, load_dump(shared_path("hpctoolkit", "dbase", dump))


def test_meta_tables(pair: tuple[Experiment, dict[str, Any]]) -> None:
    exp, dump = pair
    meta = dump["meta"]
    assert exp.title == meta["general"]["title"]
    assert exp.description == meta["general"]["description"]
    assert exp.id_names == meta["id_names"]["names"]
    scopes = meta["metrics"]["scopes"]
    assert [(s.name, int(s.type), s.propagation_index) for s in exp.scopes] == [
        (s["scope_name"], SCOPE_TYPES[s["type"]], s["propagation_index"]) for s in scopes]
    assert len(exp.metrics) == len(meta["metrics"]["metrics"])
    for m, dm in zip(exp.metrics, meta["metrics"]["metrics"], strict=True):
        assert m.name == dm["name"]
        assert [(exp.scopes[i.scope].name, i.prop_metric_id) for i in m.scope_insts] == [
            (d["scope"]["scope_name"], d["prop_metric_id"]) for d in dm["scope_insts"]]
        assert [(exp.scopes[s.scope].name, s.formula, s.combine.name.lower(), s.stat_metric_id)
                for s in m.summaries] == [
            (d["scope"]["scope_name"], d["formula"], d["combine"], d["stat_metric_id"])
            for d in dm["summaries"]]
    assert [m.path for m in exp.modules] == [m["path"] for m in meta["modules"]["modules"]]
    assert [f.path for f in exp.files] == [f["path"] for f in meta["files"]["files"]]
    assert [f.copied for f in exp.files] == ["copied" in f["flags"] for f in meta["files"]["files"]]
    funcs = meta["functions"]["functions"]
    assert len(exp.functions) == len(funcs)
    for f, df in zip(exp.functions, funcs, strict=True):
        assert f.name == df["name"]
        assert exp.modules[f.module].path == df["module"]["path"]
        assert f.offset == df["offset"]
        assert exp.files[f.file].path == df["file"]["path"]
        assert f.line == df["line"]


def test_context_tree(pair: tuple[Experiment, dict[str, Any]]) -> None:
    exp, dump = pair
    cct = exp.cct
    expected = walk_contexts(dump["meta"]["context"]["entry_points"])
    # Our tree is the dump's tree in the same preorder, below the implicit global root.
    assert len(cct) == len(expected) + 1
    assert cct.kind[0] == NodeKind.ROOT and cct.ctx_id[0] == 0
    for k, (node, parent) in enumerate(expected, start=1):
        assert int(cct.ctx_id[k]) == node["ctx_id"]
        assert int(cct.ctx_id[cct.parent[k]]) == parent
        if "entry_point" in node:
            assert cct.kind[k] == NodeKind.ENTRY
            assert int(cct.entry_point[k]) == ENTRY_POINTS[node["entry_point"]]
            assert cct.entry_names[k] == node["pretty_name"]
            continue
        assert int(cct.kind[k]) == LEXICAL[node["lexical_type"]]
        assert int(cct.relation[k]) == RELATIONS[node["relation"]]
        assert int(cct.flags[k]) == sum(CTX_FLAGS[f] for f in node["flags"])
        assert int(cct.propagation[k]) == node["propagation"]
        fn = node["function"]
        assert (exp.functions[cct.function[k]].name if cct.function[k] >= 0 else None) == (
            fn["name"] if fn else None)
        fi = node["file"]
        assert (exp.files[cct.file[k]].path if cct.file[k] >= 0 else None) == (
            fi["path"] if fi else None)
        if node["line"] is not None:
            assert int(cct.line[k]) == node["line"]
        mo = node["module"]
        assert (exp.modules[cct.module[k]].path if cct.module[k] >= 0 else None) == (
            mo["path"] if mo else None)
        if node["offset"] is not None:
            assert int(cct.offset[k]) == node["offset"]
    # children come out of the CSR form in the same order
    offsets, children = cct.child_csr()
    for k in range(len(cct)):
        assert list(children[offsets[k]:offsets[k + 1]]) == list(cct.children(k))


def test_every_profile_value(pair: tuple[Experiment, dict[str, Any]]) -> None:
    exp, dump = pair
    profiles = dump["profile"]["profile_infos"]["profiles"]
    assert len(exp.profiles) == len(profiles)
    for p, dp in zip(exp.profiles, profiles, strict=True):
        assert p.is_summary == ("is_summary" in dp["flags"])
        ids = (dp["id_tuple"] or {}).get("ids", [])
        assert [(i.kind, i.logical_id, i.physical_id, i.is_physical) for i in p.ids] == [
            (d["kind"], d["logical_id"], d["physical_id"], "is_physical" in d["flags"])
            for d in ids]
        block = exp.values[p.index]
        got = {(int(c), int(m)): float(v) for c, m, v in
               zip(block.ctx_of_values(), block.metric_ids, block.values, strict=True)}
        want = {(int(c), int(m)): float(v) for c, vals in (dp["values"] or {}).items()
                for m, v in (vals or {}).items()}
        assert got == want


def test_every_context_value(pair: tuple[Experiment, dict[str, Any]]) -> None:
    exp, dump = pair
    contexts = dump["context"]["ctx_infos"]["contexts"]
    store = exp.context_values
    assert store is not None and len(store) == len(contexts) == exp.n_ctx_slots
    for c, dc in enumerate(contexts):
        blk = store[c]
        got = {(int(m), int(p)): float(v) for m, p, v in
               zip(blk.metric_of_values(), blk.prof_indices, blk.values, strict=True)}
        want = {(int(m), int(p)): float(v) for m, vals in (dc["values"] or {}).items()
                for p, v in (vals or {}).items()}
        assert got == want


def test_traces(pair: tuple[Experiment, dict[str, Any]]) -> None:
    exp, dump = pair
    tr = dump["trace"]["ctx_traces"]
    assert exp.traces is not None
    assert exp.traces.min_timestamp == tr["timestamp_range"]["min"]
    assert exp.traces.max_timestamp == tr["timestamp_range"]["max"]
    assert len(exp.traces.lines) == len(tr["traces"])
    for line, dl in zip(exp.traces.lines, tr["traces"], strict=True):
        assert line.prof_index == dl["prof_index"]
        assert list(map(int, line.timestamps)) == [e["timestamp"] for e in dl["line"]]
        assert list(map(int, line.ctx_ids)) == [e["ctx_id"] for e in dl["line"]]


def test_inclusive_exclusive_come_from_summary(pair: tuple[Experiment, dict[str, Any]]) -> None:
    exp, dump = pair
    summary = dump["profile"]["profile_infos"]["profiles"][0]["values"]
    m = exp.metrics[0]
    inc_id = m.stat_id(exp.scopes, "execution")
    exc_id = m.stat_id(exp.scopes, "function")
    inc, exc = exp.inclusive(m), exp.exclusive(m)
    for k, c in enumerate(exp.cct.ctx_id.tolist()):
        vals = summary.get(c) or {}
        assert inc[k] == vals.get(inc_id, 0.0)
        assert exc[k] == vals.get(exc_id, 0.0)


def test_recomputed_exclusive_matches_hpcprof_where_no_hidden_contexts() -> None:
    """On the no-structure database every measured context is in the tree, so propagating
    the point values with the tree's own propagation bits must reproduce hpcprof's numbers."""
    exp = callpath.open(shared_path("hpctoolkit", "dbase", "small.nostruct.d"))
    m = exp.metrics[0]
    point_id = m.stat_id(exp.scopes, "point")
    assert point_id is not None
    point = exp.summary(point_id)[exp.cct.ctx_id.astype(np.int64)]
    np.testing.assert_allclose(exp.cct.inclusive(point), exp.inclusive(m), rtol=1e-12)
    np.testing.assert_allclose(exp.cct.exclusive(point), exp.exclusive(m), rtol=1e-12)


def test_open_accepts_a_file_inside_the_database(tmp_path: Path) -> None:
    db = shared_path("hpctoolkit", "dbase", "small.d")
    exp = callpath.open(db / "meta.db")
    assert exp.path == db and len(exp.cct) == 14


def test_tree_shape_arrays_from_reader_match_recomputation(v4_db: Path) -> None:
    """The reader hands the tree its depths and subtree ends; they must equal what the model
    computes from the parent array alone."""
    from callpath.model.cct import _depths, _subtree_ends

    cct = callpath.open(v4_db).cct
    np.testing.assert_array_equal(cct.depth, _depths(cct.parent))
    np.testing.assert_array_equal(cct.subtree_end, _subtree_ends(cct.parent, cct.depth))


def test_transposed_profiles_equal_cct_db(v4_db: Path) -> None:
    """Deriving context-major values from profile.db (what an in-memory experiment does) gives
    exactly what hpcprof stored in cct.db."""
    from callpath.model.values import transpose

    exp = callpath.open(v4_db)
    assert exp.context_values is not None
    summaries = {p.index for p in exp.profiles if p.is_summary}
    derived = transpose(exp.values, exp.n_ctx_slots, summaries).store()
    for c in range(exp.n_ctx_slots):
        a, b = derived[c], exp.context_values[c]
        np.testing.assert_array_equal(a.metric_ids, b.metric_ids)
        np.testing.assert_array_equal(a.starts, b.starts)
        np.testing.assert_array_equal(a.prof_indices, b.prof_indices)
        np.testing.assert_array_equal(a.values, b.values)
