"""The Lines tab's HTTP API (/api/db/{db}/lines/...) on a real uvicorn server over the real
databases of ../shared/data (``view_server``: 0 small.d, 1 loops-cputime-t.d, 2 the Hatchet
cpi database). Each answer is compared with what :mod:`callpath.analysis.lines` computes from
the same database opened in the test process; malformed parameters are one-line 400s."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import callpath
from callpath.analysis import lines as lm
from view_support import get_json, get_text, view_server_fixture  # noqa: F401

SMALL, LOOPS, CPI = 0, 1, 2


@pytest.fixture(scope="module")
def experiments(view_server: Any) -> Iterator[dict[int, Any]]:
    yield {i: callpath.open(str(view_server.dbs[i].path)) for i in (SMALL, LOOPS, CPI)}


def lines(s: Any, db: int, what: str, **params: Any) -> Any:
    return get_json(s.url, f"/api/db/{db}/lines/{what}", **params)


@pytest.mark.parametrize("db", [SMALL, LOOPS, CPI])
def test_meta_and_window_are_the_library_s(view_server: Any, experiments: dict[int, Any],
                                           db: int) -> None:
    m = lm.build_line_matrix(experiments[db], 0)
    meta = lines(view_server, db, "meta")
    assert meta["rows"] == m.n_rows and meta["contexts"] == m.labels
    assert meta["short"] == m.short_labels
    assert meta["max"] == pytest.approx(float(m.vals.max()))
    assert meta["total"] == pytest.approx(m.total)
    assert [f["file"] for f in meta["files"]] == m.files
    assert [f["first_row"] for f in meta["files"]] == m.file_start[:-1].tolist()
    hot = meta["hottest_row"]
    assert float(lm.window(m, hot, 1).max()) == pytest.approx(float(m.vals.max()))
    start = max(0, hot - 5)
    doc = lines(view_server, db, "window", start=start, count=25)
    dense = lm.window(m, start, 25)
    st = lm.line_stats(m, np.arange(start, start + len(dense)))
    assert doc["start"] == start and doc["count"] == len(dense)
    assert doc["max_window"] == pytest.approx(float(dense.max()))
    for i, r in enumerate(doc["rows"]):
        assert r["row"] == start + i
        assert r["values"] == pytest.approx(dense[i].tolist())
        assert r["line"] == int(m.line_of_row[start + i])
        assert r["file"] == m.files[int(m.file_of_row[start + i])]
        for k in ("sum", "min", "max", "mean", "stdev"):
            assert r[k] == pytest.approx(float(st[k][i]))
        assert r["min_context"] == m.labels[int(st["min_context"][i])]
        assert r["max_context"] == m.labels[int(st["max_context"][i])]
        p = int(m.row_proc[start + i])
        assert r["procedure"] == (m.procedures[p] if p >= 0 else None)


def test_thread_selection_and_column_bins(view_server: Any,
                                         experiments: dict[int, Any]) -> None:
    """The Thread view's contexts are the matrix's columns; ``cbins`` shows the window in
    fewer columns, each the max of its contexts, while min/max still name single contexts."""
    exp = experiments[LOOPS]
    sel = [0, 2]
    m = lm.build_line_matrix(exp, 0, "none", [exp.contexts[i].index for i in sel])
    meta = lines(view_server, LOOPS, "meta", threads=json.dumps(sel))
    assert meta["contexts"] == m.labels and len(m.labels) == 2
    doc = lines(view_server, LOOPS, "window", threads=json.dumps(sel), start=0, count=38)
    np.testing.assert_allclose([r["values"] for r in doc["rows"]], lm.window(m, 0, 38))
    full = lm.build_line_matrix(exp, 0)
    doc = lines(view_server, LOOPS, "window", start=0, count=38, cbins=2)
    dense = lm.window(full, 0, 38)
    assert doc["binned"] and [(c["first"], c["last"]) for c in doc["columns"]] == [(0, 1), (2, 3)]
    want = np.stack([dense[:, :2].max(axis=1), dense[:, 2:].max(axis=1)], axis=1)
    np.testing.assert_allclose([r["values"] for r in doc["rows"]], want)
    st = lm.line_stats(full, np.arange(38))
    assert [r["max_context"] for r in doc["rows"]] == \
        [full.labels[int(c)] for c in st["max_context"]]


def test_window_source_text_is_the_database_copy(view_server: Any,
                                                 experiments: dict[int, Any]) -> None:
    m = lm.build_line_matrix(experiments[CPI], 0)
    fi = next(i for i, ok in enumerate(m.readable) if ok)
    text = lm.source_text(m, fi)
    assert text
    first = int(m.file_start[fi])
    doc = lines(view_server, CPI, "window", start=first, count=len(text))
    assert [r["text"] for r in doc["rows"]] == text
    # a file the viewer cannot read: no text, but its rows are there
    fo = next(i for i, ok in enumerate(m.readable) if not ok)
    doc = lines(view_server, CPI, "window", start=int(m.file_start[fo]), count=1)
    assert doc["rows"][0]["text"] is None


@pytest.mark.parametrize("params", [
    {"skip": 50, "bin": 4, "reduce": "max", "strip": 80, "cbins": 64},
    {"skip": 0, "bin": 3, "reduce": "sum", "strip": 2, "cbins": 2},
    {"skip": 1, "bin": 1, "reduce": "max", "strip": 5, "cbins": 3},
    {"skip": 50, "bin": 2, "reduce": "sum", "strip": 4, "cbins": 2, "ctop": 1},
])
def test_overview_grid_maps_and_rectangles(view_server: Any, experiments: dict[int, Any],
                                           params: dict[str, Any]) -> None:
    """The grid is the library's overview (float32), the inverse map its first row per bin,
    and every rectangle the library's wrapping of the same rows."""
    m = lm.build_line_matrix(experiments[LOOPS], 0)
    kw = {"top_contexts" if params.get("ctop") else "context_bins": params["cbins"]}
    ov = lm.overview(m, params["skip"], params["bin"], params["reduce"], params["strip"], **kw)
    doc = lines(view_server, LOOPS, "overview", values=1, **params)
    grid = np.frombuffer(base64.b64decode(doc["values"]), dtype="<f4")
    levels = np.frombuffer(base64.b64decode(doc["levels"]), dtype=np.uint8)
    # colour levels: 0 exactly where there is no cost, else ceil(255 v / max)
    mx = ov.values.max()
    want = np.where(ov.values > 0, np.clip(np.ceil(ov.values * 255 / mx), 1, 255), 0)
    assert levels.reshape(ov.values.shape).tolist() == want.astype(np.uint8).tolist()
    assert doc["bins"] == ov.n_orows and doc["strips"] == ov.n_strips
    assert doc["columns"] == ov.values.shape[1] == min(params["cbins"], m.n_cols)
    assert grid.reshape(ov.values.shape) == pytest.approx(ov.values.astype(np.float32))
    assert doc["bin_row"] == ov.inv_first.tolist()
    assert doc["top"] == bool(params.get("ctop"))
    assert doc["kept"] == int(ov.kept.sum())
    segs = [[0, m.n_rows - 1], [3, 9], [10, 10], [m.n_rows - 2, m.n_rows - 1]]
    got = lines(view_server, LOOPS, "rects", segments=json.dumps(segs), **params)["rects"]
    assert got == [[list(r) for r in ov.rectangles(a, b)] for a, b in segs]
    # the whole axis: one piece per strip, together every bin
    assert [p[0] for p in got[0]] == list(range(ov.n_strips))
    assert sum(p[2] for p in got[0]) == ov.n_orows


def test_ranked_and_the_procedure_of_a_line(view_server: Any,
                                            experiments: dict[int, Any]) -> None:
    m = lm.build_line_matrix(experiments[LOOPS], 0)
    top = lm.ranked_procedures(m, 3)
    doc = lines(view_server, LOOPS, "ranked", n=3)
    assert [(p["procedure"], p["first_row"], p["last_row"]) for p in doc["procedures"]] == \
        [(p["procedure"], p["first_row"], p["last_row"]) for p in top]
    assert [p["sum"] for p in doc["procedures"]] == pytest.approx([p["sum"] for p in top])
    for p in doc["procedures"]:  # the hottest row of the segment
        seg = m.row_sum[p["first_row"]:p["last_row"] + 1]
        assert m.row_sum[p["hot_row"]] == seg.max()
    # a line of the second procedure: selected in place; of a procedure outside: appended
    row = top[1]["first_row"]
    doc = lines(view_server, LOOPS, "ranked", n=3, row=row)
    assert doc["selected"] == 1 and doc["extra"] is None
    names = {p["procedure"] for p in top}
    row = next(r for r in range(m.n_rows) if int(m.row_proc[r]) >= 0
               and m.procedures[int(m.row_proc[r])] not in names)
    doc = lines(view_server, LOOPS, "ranked", n=3, row=row)
    assert doc["selected"] == 3
    assert doc["extra"]["procedure"] == lm.procedure_at(m, row)["procedure"]


def test_locate_from_files_and_tree_scopes(view_server: Any,
                                           experiments: dict[int, Any]) -> None:
    """(file, line) and the keys of the trees' scopes land on the right row; a procedure
    scope lands on its segment's hottest line."""
    s = view_server
    m = lm.build_line_matrix(experiments[LOOPS], 0)
    row = int(np.argmax(m.row_sum))
    f, line = m.files[int(m.file_of_row[row])], int(m.line_of_row[row])
    doc = lines(s, LOOPS, "locate", file=f, line=line)
    assert doc["row"] == row and doc["procedure"]["index"] == int(m.row_proc[row])
    assert lines(s, LOOPS, "locate", file="loops.c", line=line)["row"] == row  # base name
    # every statement and procedure of the first levels of the Top-down and Flat trees
    for view in ("top-down", "flat"):
        frontier = [get_json(s.url, f"/api/db/{LOOPS}/children", view=view)["root"]]
        seen = procs = 0
        for _ in range(6):
            nxt = []
            for r in frontier:
                if r["has_children"]:
                    nxt += get_json(s.url, f"/api/db/{LOOPS}/children", view=view,
                                    node=r["key"], limit=1000)["rows"]
            frontier = nxt
            for r in nxt:
                if r["type"] == "statement" and r["file"]:
                    got = lines(s, LOOPS, "locate", view=view, node=r["key"])
                    assert (got["file"], got["line"]) == (r["file"], r["line"])
                    seen += 1
                if r["type"] in ("procedure", "activation") and r["file"] and \
                        r["file"] in m.files:
                    got = lines(s, LOOPS, "locate", view=view, node=r["key"])
                    pr = got["procedure"]
                    if pr is not None and pr["procedure"] == r["name"]:
                        assert pr["first_row"] <= got["row"] <= pr["last_row"]
                        assert got["row"] == pr["hot_row"]
                        procs += 1
        assert seen > 0 and procs > 0, f"no statement or procedure scope checked in {view}"


def test_calling_contexts_of_a_line(view_server: Any, experiments: dict[int, Any]) -> None:
    """The Top-down keys of a line's scopes, hottest first; each opens in the Top-down tree."""
    exp = experiments[LOOPS]
    m = lm.build_line_matrix(exp, 0)
    row = int(np.argmax(m.row_sum))
    doc = lines(view_server, LOOPS, "contexts", row=row)
    nodes = np.nonzero(m.node_rows() == row)[0]
    assert len(doc["nodes"]) == len(nodes) > 1
    ex = exp.exclusive(0)
    by_key = {f"t{int(exp.cct.ctx_id[n])}": float(ex[n]) for n in nodes.tolist()}
    assert {n["key"] for n in doc["nodes"]} == set(by_key)
    vals = [n["value"] for n in doc["nodes"]]
    assert vals == sorted(vals, reverse=True)
    assert vals == pytest.approx([by_key[n["key"]] for n in doc["nodes"]])
    for n in doc["nodes"][:3]:
        path = get_json(view_server.url, f"/api/db/{LOOPS}/path", view="top-down",
                        node=n["key"])["path"]
        assert path[-1] == n["key"]


def test_columns_name_their_contexts_and_thread_view_contexts(
        view_server: Any, experiments: dict[int, Any]) -> None:
    """``context_index`` names each column's contexts in /contexts terms; the calling
    contexts of a line in the Thread view of one context are ordered by that context's own
    exclusive values."""
    exp = experiments[CPI]
    for group in ("none", "rank"):
        m = lm.build_line_matrix(exp, 0, group)
        meta = lines(view_server, CPI, "meta", group=group)
        labels = [c["label"] for c in get_json(view_server.url, f"/api/db/{CPI}/contexts")]
        assert len(meta["context_index"]) == m.n_cols
        for c, idx in enumerate(meta["context_index"]):
            assert sorted(exp.contexts[i].index for i in idx) == sorted(m.column_profiles[c])
            if group == "none":
                assert [labels[i] for i in idx] == [m.labels[c]]
    exp = experiments[LOOPS]
    m = lm.build_line_matrix(exp, 0)
    row = int(np.argmax(m.row_sum))
    nodes = np.nonzero(m.node_rows() == row)[0]
    for t in range(len(exp.contexts)):
        doc = lines(view_server, LOOPS, "contexts", row=row, threads=json.dumps([t]))
        own = exp.values_in(exp.contexts[t].index, 0, "function")
        want = {f"t{int(exp.cct.ctx_id[n])}": float(own[n]) for n in nodes.tolist()}
        vals = [n["value"] for n in doc["nodes"]]
        assert vals == sorted(vals, reverse=True)
        assert vals == pytest.approx([want[n["key"]] for n in doc["nodes"]])


def test_assembler(view_server: Any, experiments: dict[int, Any]) -> None:
    exp = experiments[LOOPS]
    m = lm.build_line_matrix(exp, 0)
    row = int(np.argmax(m.row_sum))
    f, line = m.files[int(m.file_of_row[row])], int(m.line_of_row[row])
    doc = lines(view_server, LOOPS, "asm", row=row, around=2)
    listing = lm.line_instructions(exp, f, line, 2)
    assert (doc["file"], doc["line"], doc["around"]) == (f, line, 2)
    assert len(doc["instructions"]) == len(listing)
    if not listing:
        assert doc["error"] == listing.reason and doc["error"]


@pytest.mark.parametrize(("what", "params", "name"), [
    ("meta", {"metric": 9}, "metric"),
    ("meta", {"metric": "cpu"}, "metric"),
    ("meta", {"group": "socket"}, "group"),
    ("meta", {"threads": "[99]"}, "threads"),
    ("window", {"start": -1}, "start"),
    ("window", {"count": 401}, "count"),
    ("window", {"count": "many"}, "count"),
    ("overview", {"reduce": "mean"}, "reduce"),
    ("overview", {"skip": -1}, "skip"),
    ("overview", {"bin": 0}, "bin"),
    ("overview", {"strip": "x"}, "strip"),
    ("overview", {"cbins": 0}, "cbins"),
    ("overview", {"ctop": "yes"}, "ctop"),
    ("rects", {"segments": "[[1]]"}, "segments"),
    ("rects", {"segments": "[[1, 2"}, "segments"),
    ("ranked", {"n": 0}, "n"),
    ("ranked", {"row": 10**6}, "row"),
    ("asm", {}, "row"),
    ("asm", {"row": 1, "around": 51}, "around"),
    ("contexts", {"row": "first"}, "row"),
    ("locate", {}, "file"),
    ("locate", {"file": "nowhere.c", "line": 3}, "nowhere.c"),
    ("locate", {"node": "t999999", "view": "top-down"}, "t999999"),
])
def test_bad_parameters_are_one_line_400s(view_server: Any, what: str, params: dict[str, Any],
                                          name: str) -> None:
    status, text = get_text(view_server.url, f"/api/db/{LOOPS}/lines/{what}", **params)
    assert status == 400, text
    msg = json.loads(text)["error"]
    assert name in msg and "\n" not in msg


def test_unknown_database_is_404(view_server: Any) -> None:
    status, text = get_text(view_server.url, "/api/db/7/lines/meta")
    assert status == 404 and "database" in json.loads(text)["error"]
