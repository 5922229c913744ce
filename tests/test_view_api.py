"""The viewer's JSON API, through HTTP on a real uvicorn server serving the real databases
in ../shared/data (fixture ``view_server`` in view_support.py): tree pages, sorting, state
parameters, CSV identical to ``callpath report --format csv``, hot path, Find, source,
per-context values, derived metrics, error messages, and the trace sampler against a
reference computed sample by sample in Python."""

from __future__ import annotations

import base64
import bisect
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callpath.engine.state import ViewState
from callpath.model import NodeKind
from callpath.view.server import BackgroundServer
from conftest import run_cli
from view_support import get_json, get_text, post_json, view_server_fixture  # noqa: F401

VIEWS = ["top-down", "bottom-up", "flat"]
SMALL, LOOPS, CPI = 0, 1, 2


def children(s: BackgroundServer, db: int, **params: Any) -> Any:
    return get_json(s.url, f"/api/db/{db}/children", **params)


def keys_to_depth(s: BackgroundServer, db: int, depth: int, **state: Any) -> list[str]:
    """Keys of every node above ``depth`` (what a user expanding every row would open)."""
    top = children(s, db, **state)
    opened = [top["root"]["key"]]
    frontier = [r for r in top["rows"] if r["has_children"]]
    for _ in range(depth - 1):
        nxt = []
        for r in frontier:
            opened.append(r["key"])
            page = children(s, db, node=r["key"], limit=1000, **state)
            nxt.extend(x for x in page["rows"] if x["has_children"])
        frontier = nxt
    return opened


# ---- databases, columns, children ------------------------------------------------------


def test_databases_list_describes_each_database(view_server: BackgroundServer) -> None:
    dbs = get_json(view_server.url, "/api/databases")
    assert [d["id"] for d in dbs] == [0, 1, 2]
    assert [d["name"] for d in dbs] == ["small.d", "loops-cputime-t.d",
                                        "hpctoolkit-cpi-database"]
    assert dbs[LOOPS]["contexts"] == 4 and dbs[LOOPS]["has_traces"]
    assert dbs[CPI]["contexts"] == 4 and not dbs[CPI]["has_traces"]
    assert dbs[SMALL]["metrics"][0]["name"] == "CPUTIME (sec)"


def test_columns_have_stable_keys_and_aggregates(view_server: BackgroundServer) -> None:
    cols = get_json(view_server.url, f"/api/db/{LOOPS}/columns",
                    derived=[{"name": "half", "formula": "$0/2", "format": "%.3f"}])
    assert [c["key"] for c in cols] == ["m0i", "m0e", "d0"]
    assert cols[0]["scope"] == "inclusive" and cols[2]["scope"] == "derived"
    assert cols[2]["aggregate"] == pytest.approx(cols[0]["aggregate"] / 2)
    assert cols[2]["aggregate_text"].strip() == f"{cols[0]['aggregate'] / 2:.3f}"


@pytest.mark.parametrize("view", VIEWS)
def test_children_are_sorted_and_paged_on_the_server(view_server: BackgroundServer,
                                                     view: str) -> None:
    s = view_server
    top = children(s, LOOPS, view=view)
    assert top["root"]["key"] == "r" and top["root"]["type"] == "root"
    node = max(top["rows"], key=lambda r: r["values"]["m0i"])["key"]
    whole = children(s, LOOPS, view=view, node=node, limit=1000)
    vals = [r["values"]["m0i"] for r in whole["rows"]]
    assert vals == sorted(vals, reverse=True) and whole["total"] == len(vals)
    asc = children(s, LOOPS, view=view, node=node, order="asc", sort="m0e", limit=1000)
    ex = [r["values"]["m0e"] for r in asc["rows"]]
    assert ex == sorted(ex)
    pages = [children(s, LOOPS, view=view, node=node, offset=o, limit=2)["rows"]
             for o in range(0, whole["total"] + 2, 2)]
    assert [r["key"] for p in pages for r in p] == [r["key"] for r in whole["rows"]]
    # a key resolves from scratch: asking for a child's children works, and its rows are
    # the same in a fresh server (keys do not depend on what was expanded before)
    for r in whole["rows"]:
        assert r["key"] != node and isinstance(r["label"], str) and "text" in r
        below = children(s, LOOPS, view=view, node=r["key"])
        assert r["has_children"] == (below["total"] > 0)


def test_keys_resolve_in_a_fresh_server(view_server: BackgroundServer) -> None:
    s = view_server
    deep = keys_to_depth(s, LOOPS, 4, view="bottom-up")[-1]
    first = children(s, LOOPS, view="bottom-up", node=deep)
    with BackgroundServer.start([str(s.dbs[0].path), str(s.dbs[1].path)]) as fresh:
        again = children(fresh, LOOPS, view="bottom-up", node=deep)
    assert again == first


def test_views_are_cached_per_state(view_server: BackgroundServer) -> None:
    db = view_server.dbs[LOOPS]
    with db.lock:
        a = db.build(ViewState("bottom-up"))
        b = db.build(ViewState("bottom-up"))
        c = db.build(ViewState("bottom-up", threads=(1,)))
    assert a.view is b.view and a.source is b.source
    assert c.view is not a.view


# ---- CSV equals the report -----------------------------------------------------------


CSV_CASES = [
    (SMALL, "top-down", {}, []),
    (LOOPS, "bottom-up", {}, []),
    (LOOPS, "flat", {}, []),
    (CPI, "top-down", {"sort": "m0e", "order": "asc"}, ["--sort", "$1", "--ascending"]),
    (LOOPS, "top-down",
     {"filters": [{"pattern": "func1", "type": "self", "enabled": True},
                  {"pattern": "gettime", "type": "all", "enabled": True}],
      "derived": [{"name": "twice", "formula": "2*$0", "format": "%.4f"}],
      "threads": [3]},
     ["--filter", "func1:self", "--filter", "gettime:self-and-descendants",
      "--derived", "twice=2*$0", "--derived-format", "twice=%.4f", "--threads", "THREAD 0"]),
    (LOOPS, "flat", {"flatten": 1}, ["--flatten", "1"]),
]


@pytest.mark.parametrize("db,view,state,args", CSV_CASES)
def test_csv_is_the_report_csv_for_the_same_selection(view_server: BackgroundServer, db: int,
                                                      view: str, state: dict[str, Any],
                                                      args: list[str]) -> None:
    s = view_server
    sort = {k: state[k] for k in ("sort", "order") if k in state}
    st = {k: v for k, v in state.items() if k not in ("sort", "order")}
    opened = keys_to_depth(s, db, 3, view=view, **st, **sort)
    status, text = get_text(s.url, f"/api/db/{db}/csv", view=view, expanded=opened, **st,
                            **sort)
    assert status == 200
    want = run_cli("report", str(s.dbs[db].path), "-v", view, "-f", "csv",
                   "--no-saved-filters", "--no-saved-derived", "--depth", "3",
                   "--keep-lineless", *args, check=True).stdout  # the viewer keeps them
    assert text == want


def test_csv_of_a_zoomed_subtree_and_chosen_columns(view_server: BackgroundServer) -> None:
    s = view_server
    top = children(s, LOOPS)
    zoom = top["rows"][0]["key"]  # a top-down key: t<context id>
    opened = keys_to_depth(s, LOOPS, 2, zoom=zoom)
    _, text = get_text(s.url, f"/api/db/{LOOPS}/csv", zoom=zoom, expanded=opened,
                       columns=["m0e"])
    want = run_cli("report", str(s.dbs[LOOPS].path), "-f", "csv", "--no-saved-filters",
                   "--zoom", zoom[1:], "--depth", "2", "--columns", "$1", check=True).stdout
    assert text == want


# ---- navigation ---------------------------------------------------------------------


def test_hot_path_is_the_reports_hot_path(view_server: BackgroundServer) -> None:
    s = view_server
    path = get_json(s.url, f"/api/db/{LOOPS}/hotpath", column="m0i", threshold=50)["path"]
    recs = json.loads(run_cli("report", str(s.dbs[LOOPS].path), "-f", "json",
                              "--no-saved-filters", "--hot-path", check=True).stdout)
    assert path[0] == "r"
    assert [k[1:] for k in path[1:]] == [str(r["id"]) for r in recs[1:]]
    # the front end expands along the path: each key is a child of the one before
    for par, child in itertools.pairwise(path):
        kids = children(s, LOOPS, node=par, limit=1000)["rows"]
        assert child in [r["key"] for r in kids]


@pytest.mark.parametrize("view", VIEWS)
def test_find_returns_paths_of_keys(view_server: BackgroundServer, view: str) -> None:
    s = view_server
    hits = get_json(s.url, f"/api/db/{LOOPS}/find", view=view, q="FUNC1")["matches"]
    assert hits
    for path in hits:
        node = "r"
        for key in path:  # every step is a child of the previous one
            kids = children(s, LOOPS, view=view, node=node, limit=1000)["rows"]
            row = next(r for r in kids if r["key"] == key)
            node = key
        assert "func1" in row["name"]
    none = get_json(s.url, f"/api/db/{LOOPS}/find", view=view, q="FUNC1", case=1)
    assert none["matches"] == []


def test_source_of_a_procedure_from_the_copied_sources(view_server: BackgroundServer
                                                       ) -> None:
    s = view_server
    path = get_json(s.url, f"/api/db/{CPI}/find", q="main", word=1)["matches"][0]
    src = get_json(s.url, f"/api/db/{CPI}/source", node=path[-1])
    disk = (s.dbs[CPI].path / "src" / "cpi.c").read_text().splitlines()
    assert src["file"] == "cpi.c" and src["lines"] == disk
    assert any("main" in ln for ln in disk[src["line"] - 2:src["line"]])  # 'main(...)\n{'
    # small.d records /builds/... which is not on this machine: a 404 naming the file
    deep = keys_to_depth(s, SMALL, 4)[-1]
    status, text = get_text(s.url, f"/api/db/{SMALL}/source", node=deep)
    assert status == 404 and "small.c" in json.loads(text)["error"]


def test_plot_values_add_up_to_the_summary(view_server: BackgroundServer) -> None:
    s = view_server
    top = children(s, LOOPS)
    node = top["rows"][0]["key"]
    p = get_json(s.url, f"/api/db/{LOOPS}/plot", node=node, column="m0i")
    assert len(p["values"]) == 4 == len(p["labels"]) == len(p["contexts"])
    assert sum(p["values"]) == pytest.approx(top["rows"][0]["values"]["m0i"])
    assert p["stats"]["max"] == max(p["values"])
    ctxs = get_json(s.url, f"/api/db/{LOOPS}/contexts")
    assert [c["label"] for c in ctxs] == p["labels"]
    # the Thread view of one context sums that context alone
    one = children(s, LOOPS, threads=[2])["root"]["values"]["m0i"]
    assert one == pytest.approx(p["values"][2] if node == "r" else
                                get_json(s.url, f"/api/db/{LOOPS}/plot", node="r")["values"][2])


def test_derived_check_and_save(view_server: BackgroundServer) -> None:
    s = view_server
    ok = post_json(s.url, f"/api/db/{SMALL}/derived/check", {"formula": "$0 / @0 * 100"})
    assert ok == (200, {"ok": True})
    status, bad = post_json(s.url, f"/api/db/{SMALL}/derived/check", {"formula": "$0 +* 2"})
    assert status == 200 and not bad["ok"] and bad["column"] == 5
    status, bad = post_json(s.url, f"/api/db/{SMALL}/derived/check", {"formula": "$9"})
    assert not bad["ok"] and "$9" in bad["error"]
    items = [{"name": "pct", "formula": "100*$0/@0", "format": "%.1f",
              "percent_annotation": False}]
    status, doc = post_json(s.url, f"/api/db/{SMALL}/derived/save", items)
    assert status == 200
    saved = s.dbs[SMALL].path / "callpath" / "derived-metrics.json"
    assert Path(doc["path"]) == saved and saved.is_file()
    assert get_json(s.url, "/api/databases")[SMALL]["derived"] == items
    status, err = post_json(s.url, f"/api/db/{SMALL}/derived/save",
                            [{"name": "x", "formula": "$5"}])
    assert status == 400 and "$5" in err["error"]
    assert get_json(s.url, "/api/databases")[SMALL]["derived"] == items


# ---- errors -------------------------------------------------------------------------


ERRORS = [
    ("children", {"view": "sideways"}, 400, "unknown view"),
    ("children", {"filters": "[{"}, 400, "not valid JSON"),
    ("children", {"filters": '[{"pattern": 3}]'}, 400, "pattern"),
    ("children", {"sort": "m7i"}, 400, "unknown column"),
    ("children", {"derived": '[{"name": "x", "formula": "$0 +"}]'}, 400, "column 5"),
    ("children", {"node": "t999999"}, 400, "no such node"),
    ("children", {"node": "../etc"}, 400, "node key"),
    ("children", {"view": "flat", "node": "p0.99"}, 400, "no such node"),
    ("children", {"offset": "-1"}, 400, "offset"),
    ("children", {"limit": "100000"}, 400, "limit"),
    ("children", {"threads": "[99]"}, 400, "context index"),
    ("children", {"order": "up"}, 400, "order"),
    ("hotpath", {"threshold": "150"}, 400, "threshold"),
    ("find", {"q": "("}, 400, "regular expression"),
    ("find", {}, 400, "'q'"),
    ("source", {"node": "r", "which": "both"}, 400, "which"),
    ("csv", {"expanded": '{"a": 1}'}, 400, "expanded"),
    ("trace/frame", {"width": "0"}, 400, "width"),
    ("trace/frame", {"t0": "5", "t1": "4"}, 400, "t0 < t1"),
    ("trace/frame", {"c0": "9"}, 400, "c0"),
]


@pytest.mark.parametrize("endpoint,params,status,text", ERRORS)
def test_bad_requests_are_one_line_errors(view_server: BackgroundServer, endpoint: str,
                                          params: dict[str, str], status: int, text: str
                                          ) -> None:
    db = LOOPS
    if endpoint == "find" and params.get("q") == "(":
        params = {**params, "regex": "1"}
    got, body = get_text(view_server.url, f"/api/db/{db}/{endpoint}", **params)
    assert got == status, body
    err = json.loads(body)["error"]
    assert text in err and "\n" not in err and "Traceback" not in err


def test_unknown_database_and_traces_absent_are_404(view_server: BackgroundServer) -> None:
    assert get_text(view_server.url, "/api/db/7/columns")[0] == 404
    status, body = get_text(view_server.url, f"/api/db/{CPI}/trace/meta")
    assert status == 404 and "no traces" in json.loads(body)["error"]


# ---- traces against a reference -------------------------------------------------------


def trace_order(exp: Any, prof_index: int) -> tuple[int, ...]:
    """hpctraceviewer's order of trace lines: rank, CPU threads before GPU streams, thread
    (or GPU context), stream."""
    ids = {exp.id_names[i.kind]: i.logical_id for i in exp.profiles[prof_index].ids}
    gpu = "GPUSTREAM" in ids or "GPUCONTEXT" in ids
    return (ids.get("RANK", -1), int(gpu), ids.get("GPUCONTEXT" if gpu else "THREAD", -1),
            ids.get("GPUSTREAM", -1), prof_index)


def reference_frame(s: BackgroundServer, db: int, t0: int, t1: int, width: int, depth: int
                    ) -> tuple[list[str], list[list[str | None]]]:
    """Name of the procedure at ``depth`` per (context, column), sample by sample: bisect on
    Python lists and a walk up the parent pointers, nothing shared with the server's code."""
    exp = s.dbs[db].exp
    cct = exp.cct
    node_of = {int(c): i for i, c in enumerate(cct.ctx_id.tolist())}
    from callpath.analysis.source import tree_source
    from callpath.analysis.topdown import TopDownView
    td = TopDownView(tree_source(exp))
    lines = sorted(exp.traces.lines, key=lambda ln: trace_order(exp, ln.prof_index))
    out = []
    for ln in lines:
        ts = [int(t) for t in ln.timestamps.tolist()]
        row: list[str | None] = []
        for col in range(width):
            mid = t0 + ((2 * col + 1) * (t1 - t0)) // (2 * width)
            i = bisect.bisect_right(ts, mid) - 1
            node = node_of.get(int(ln.ctx_ids[i])) if i >= 0 and ln.ctx_ids[i] else None
            if node is None:
                row.append(None)
                continue
            frames = []
            while node >= 0:
                if cct.kind[node] in (NodeKind.FUNCTION, NodeKind.ENTRY):
                    frames.append(node)
                node = int(cct.parent[node])
            frames.reverse()
            row.append(td.node_name(frames[min(depth, len(frames) - 1)]) if frames else None)
        out.append(row)
    return [exp.context_label(exp.profiles[ln.prof_index]) for ln in lines], out


def decode(frame: dict[str, Any]) -> list[list[str | None]]:
    grid = np.frombuffer(base64.b64decode(frame["grid"]), dtype="<i4").reshape(
        frame["height"], frame["width"])
    return [[frame["procedures"][g] if g >= 0 else None for g in row] for row in grid.tolist()]


@pytest.mark.parametrize("db", [SMALL, LOOPS])
def test_trace_frame_matches_a_sample_by_sample_reference(view_server: BackgroundServer,
                                                          db: int) -> None:
    s = view_server
    meta = get_json(s.url, f"/api/db/{db}/trace/meta")
    n = len(meta["contexts"])
    span = meta["t1"] - meta["t0"]
    windows = [(meta["t0"], meta["t1"], 97), (meta["t0"] + span // 3, meta["t0"] + span // 2,
                                               61)]
    for t0, t1, width in windows:
        for depth in range(meta["max_depth"] + 2):
            labels, ref = reference_frame(s, db, t0, t1, width, depth)
            assert meta["contexts"] == labels
            frame = get_json(s.url, f"/api/db/{db}/trace/frame", t0=t0, t1=t1, width=width,
                             height=n, depth=depth)
            assert frame["rows"] == list(range(n))
            assert decode(frame) == ref


def test_trace_rows_map_to_contexts_when_taller_or_shorter(view_server: BackgroundServer
                                                           ) -> None:
    s = view_server
    tall = get_json(s.url, f"/api/db/{LOOPS}/trace/frame", width=50, height=10, depth=2)
    assert tall["rows"] == [0, 0, 1, 1, 1, 2, 2, 3, 3, 3]  # the context at each row middle
    part = get_json(s.url, f"/api/db/{LOOPS}/trace/frame", width=50, height=2, c0=2, c1=4,
                    depth=2)
    full = decode(get_json(s.url, f"/api/db/{LOOPS}/trace/frame", width=50, height=4,
                           depth=2))
    assert part["rows"] == [2, 3] and decode(part) == full[2:]


def test_trace_depth_callpath_summary_and_stats(view_server: BackgroundServer) -> None:
    s = view_server
    meta = get_json(s.url, f"/api/db/{LOOPS}/trace/meta")
    t = (meta["t0"] + meta["t1"]) // 2
    cp = get_json(s.url, f"/api/db/{LOOPS}/trace/callpath", ctx=1, t=t)
    names = [f["name"] for f in cp["frames"]]
    assert [f["depth"] for f in cp["frames"]] == list(range(len(names)))
    dv = get_json(s.url, f"/api/db/{LOOPS}/trace/depth", ctx=1, t0=t, t1=t + 1, width=1)
    column = [row[0] for row in decode(dv)]
    assert column[:len(names)] == names and all(c is None for c in column[len(names):])
    summ = get_json(s.url, f"/api/db/{LOOPS}/trace/summary", width=40, depth=2)
    shares = np.array(summ["shares"])
    assert shares.shape == (len(summ["procedures"]), 40)
    assert np.all(shares.sum(axis=0) <= 1 + 1e-9)
    frame = decode(get_json(s.url, f"/api/db/{LOOPS}/trace/frame", width=40, height=4,
                            depth=2))
    for k, name in enumerate(summ["procedures"]):
        for col in range(40):
            assert shares[k, col] == pytest.approx(
                sum(row[col] == name for row in frame) / 4, abs=1e-4)
    st = get_json(s.url, f"/api/db/{LOOPS}/trace/stats", depth=2)["procedures"]
    assert 0.99 < sum(p["share"] for p in st) <= 1.0 + 1e-9
    assert [p["share"] for p in st] == sorted((p["share"] for p in st), reverse=True)


# ---- fuzz: any query string is a result or a one-line CallpathError ---------------------


PARAM_NAMES = ["view", "filters", "derived", "threads", "flatten", "zoom", "node", "sort",
               "order", "offset", "limit", "column", "threshold", "q", "regex", "expanded",
               "columns", "which"]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=st.dictionaries(
    st.sampled_from(PARAM_NAMES),
    st.one_of(st.text(max_size=30),
              st.sampled_from(["[]", "[0]", "[1, 2]", "[-1]", "[true]", '[{"pattern": "*"}]',
                               '[{"name": "a", "formula": "$0/0"}]', "r", "t1", "p0.0",
                               "p99", "m0i", "d0", "-5", "1e9", "bottom-up", "flat"])),
    max_size=5),
    endpoint=st.sampled_from(["columns", "children", "hotpath", "find", "source", "plot",
                              "csv"]))
def test_fuzzed_parameters_never_break_the_handlers(view_server: BackgroundServer,
                                                     params: dict[str, str], endpoint: str
                                                     ) -> None:
    from callpath.errors import CallpathError
    from callpath.view import api

    db = view_server.dbs[LOOPS]
    fn = {"columns": api.columns, "children": api.children, "hotpath": api.hotpath,
          "find": api.find_nodes, "source": api.source, "plot": api.plot,
          "csv": api.csv_text}[endpoint]
    try:
        with db.lock:
            fn(db, params, b"")
    except CallpathError as e:
        assert str(e) and "\n" not in str(e)


def test_large_responses_are_gzipped_for_clients_that_accept_it(view_server: BackgroundServer
                                                                ) -> None:
    import gzip
    import urllib.request

    url = f"{view_server.url}/api/db/{LOOPS}/trace/frame?width=2000&height=40&depth=2"
    with urllib.request.urlopen(url) as r:
        plain = r.read()
        assert r.headers.get("Content-Encoding") is None
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req) as r:
        packed = r.read()
        assert r.headers["Content-Encoding"] == "gzip"
    assert len(packed) < len(plain) // 4 and gzip.decompress(packed) == plain


def test_path_to_a_node_from_the_trace_call_path(view_server: BackgroundServer) -> None:
    s = view_server
    meta = get_json(s.url, f"/api/db/{LOOPS}/trace/meta")
    cp = get_json(s.url, f"/api/db/{LOOPS}/trace/callpath", ctx=0,
                  t=(meta["t0"] + meta["t1"]) // 2)
    path = get_json(s.url, f"/api/db/{LOOPS}/path", node=cp["node"])["path"]
    assert path[-1] == cp["node"]
    parent = "r"
    for key in path:  # each step is a child of the one before, as the tree expands them
        assert key in [r["key"] for r in children(s, LOOPS, node=parent, limit=1000)["rows"]]
        parent = key
    status, body = get_text(s.url, f"/api/db/{LOOPS}/path", node=cp["node"], zoom=path[-1])
    assert status == 200 and json.loads(body)["path"] == []
    other = children(s, LOOPS)["rows"]
    outside = next(r["key"] for r in other if r["key"] != path[0])
    status, body = get_text(s.url, f"/api/db/{LOOPS}/path", node=cp["node"], zoom=outside)
    assert status == 400 and "zoomed subtree" in json.loads(body)["error"]


@pytest.mark.parametrize("view", VIEWS)
def test_find_within_a_zoomed_subtree(view_server: BackgroundServer, view: str) -> None:
    s = view_server
    everywhere = get_json(s.url, f"/api/db/{LOOPS}/find", view=view, q="func",
                          limit=1000)["matches"]
    zoom = everywhere[0][0]  # a child of the root holding at least one match
    inside = get_json(s.url, f"/api/db/{LOOPS}/find", view=view, q="func", zoom=zoom,
                      limit=1000)["matches"]
    assert inside == [m[1:] for m in everywhere if m[0] == zoom and len(m) > 1]
    assert get_json(s.url, f"/api/db/{LOOPS}/find", view=view, q="func", zoom=zoom,
                    limit=1)["matches"] == inside[:1]


def test_csv_of_a_large_expansion_by_post_and_by_a_long_url(view_server: BackgroundServer
                                                            ) -> None:
    s = view_server
    opened = keys_to_depth(s, LOOPS, 12)
    _, want = get_text(s.url, f"/api/db/{LOOPS}/csv", expanded=opened)
    # the same keys repeated make a URL of ~0.5 MB: the server still reads it
    status, text = get_text(s.url, f"/api/db/{LOOPS}/csv", expanded=opened * 300)
    assert status == 200 and text == want
    import urllib.request

    req = urllib.request.Request(f"{s.url}/api/db/{LOOPS}/csv",
                                 data=json.dumps({"expanded": opened}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req) as r:
        assert r.read().decode() == want


def test_traces_with_an_empty_line_and_unknown_contexts(view_server: BackgroundServer) -> None:
    """A context with no samples and samples of context ids the tree does not have: blank
    pixels and empty call paths, never an error."""
    import dataclasses

    from callpath.engine.database import Database
    from callpath.model import TraceLine, Traces
    from callpath.view import traces_api as traces

    exp = view_server.dbs[LOOPS].exp
    good = int(exp.cct.ctx_id[len(exp.cct) - 1])
    lines = [TraceLine(1, np.zeros(0, np.uint64), np.zeros(0, np.uint32)),
             TraceLine(2, np.array([100, 200, 300], np.uint64),
                       np.array([good, 4_000_000, 0], np.uint32))]
    db = Database(9, view_server.dbs[LOOPS].path,
                  dataclasses.replace(exp, traces=Traces(50, 400, lines)))
    with db.lock:
        # rows in hpctraceviewer's order: find the empty line's row and the other's
        pos = {c.index: i for i, c in enumerate(exp.contexts)}
        meta = traces.meta(db, {}, b"")
        empty, full = (meta["context_index"].index(pos[k]) for k in (1, 2))
        assert meta["row_samples"][empty] == 0 and meta["row_samples"][full] == 1
        frame = traces.frame(db, {"width": "7", "height": "2", "depth": "1"}, b"")
        grid = np.frombuffer(base64.b64decode(frame["grid"]), "<i4").reshape(2, 7)
        assert (grid[empty] == -1).all()
        # columns of 50 ns from 50: midpoints 75, 125, ..., 375; the known sample holds over
        # [100, 200) (125 and 175), an unknown context over [200, 300), then idle (id 0)
        assert (grid[full] >= 0).tolist() == [False, True, True, False, False, False, False]
        assert traces.callpath(db, {"ctx": str(empty), "t": "120"}, b"")["frames"] == []
        assert traces.callpath(db, {"ctx": str(full), "t": "250"}, b"")["frames"] == []
        assert traces.callpath(db, {"ctx": str(full), "t": "150"}, b"")["frames"]
        st = traces.stats(db, {}, b"")["procedures"]
        assert sum(p["time_ns"] for p in st) == 100
        traces.summary(db, {"width": "5"}, b"")
        traces.depth(db, {"ctx": str(empty), "width": "5"}, b"")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-50, 50), max_size=200), st.lists(st.integers(-60, 60), max_size=40))
def test_trace_search_equals_searchsorted(stamps: list[int], queries: list[int]) -> None:
    """The coarse-index search of the trace view gives exactly numpy's searchsorted answer,
    with duplicate timestamps, times before the first and after the last sample, on a
    strided view like trace.db's interleaved records."""
    from callpath.engine.traces import COARSE, last_at_or_before

    rec = np.zeros(len(stamps), dtype=[("t", "<i8"), ("ctx", "<u4")])  # 12-byte records
    rec["t"] = np.sort(np.array(stamps, dtype=np.int64))
    ts = rec["t"]
    times = np.array(queries, dtype=np.int64)
    got = last_at_or_before(ts, np.ascontiguousarray(ts[::COARSE]), times)
    assert got.tolist() == (np.searchsorted(ts, times, side="right") - 1).tolist()
