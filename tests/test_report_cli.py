"""``callpath report`` run as a real command on the real databases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import callpath
from conftest import ROOT, V4_DATABASES, run_cli, shared_path


@pytest.mark.parametrize("db", [*V4_DATABASES, "cpi"])
def test_report_succeeds_on_every_shared_database(db: str) -> None:
    path = (shared_path("hatchet", "hpctoolkit-cpi-database") if db == "cpi"
            else shared_path("hpctoolkit", "dbase", db))
    proc = run_cli("report", str(path), "--unsorted", "--keep-lineless")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    exp = callpath.open(path)
    assert len(lines) == 1 + len(exp.cct)  # header + one line per node (threshold 0)
    assert "<program root>" in lines[1] and "100.0%" in lines[1]


def test_rows_of_line_0_are_elided_by_default() -> None:
    """Code without line information (libgomp here) adds a `[lib]:0` row per call and a
    `loop at [lib]:0` row per loop; by default the callee hangs under the procedure."""
    path = shared_path("hpctoolkit", "dbase", "loops-cputime-t.d")
    exp = callpath.open(path)
    cct = exp.cct
    lineless = ((cct.kind == 1) | (cct.kind == 2)) & (cct.line == 0)
    assert lineless.sum() > 0
    keep = json.loads(run_cli("report", str(path), "--format", "json", "--unsorted",
                              "--keep-lineless", check=True).stdout)
    elided = json.loads(run_cli("report", str(path), "--format", "json", "--unsorted",
                                check=True).stdout)
    gone = {int(i) for i in cct.ctx_id[lineless]}
    assert [r["id"] for r in elided] == [r["id"] for r in keep if r["id"] not in gone]
    by_id = {r["id"]: r for r in keep}
    for r in elided:
        parent = by_id[r["id"]]["parent"]
        while parent in gone:  # the nearest kept ancestor becomes the parent
            parent = by_id[parent]["parent"]
        assert r["parent"] == parent
        # inclusive values do not change; exclusive values of the removed rows move up
        incl = "CPUTIME (sec) (I)"
        assert r["metrics"][incl] == pytest.approx(by_id[r["id"]]["metrics"][incl], rel=1e-9)
    excl = "CPUTIME (sec) (E)"
    for r in elided:  # a removed row's own cost goes to its nearest kept ancestor
        assert r["metrics"].get(excl, 0.0) >= by_id[r["id"]]["metrics"].get(excl, 0.0) - 1e-9
    text = run_cli("report", str(path), check=True).stdout
    assert not any(line.rstrip().endswith(":0") for line in text.splitlines())


def test_text_labels_follow_hpcviewer() -> None:
    out = run_cli("report", str(shared_path("hpctoolkit", "dbase", "small.d")), "--unsorted",
                  check=True).stdout
    labels = [line.split("  ")[-1].strip() for line in out.splitlines()[1:]]
    assert labels == [
        "<program root>", "main thread", "» main", "small.c:11", "[11] » caller", "small.c:7",
        "[7] » spinsleep", "small.c:1", "loop at small.c:3", "small.c:3", "[11] » spinsleep",
        "small.c:1", "loop at small.c:3", "small.c:3"]
    # indentation is two spaces per level of depth
    caller = next(line for line in out.splitlines() if line.endswith("[11] » caller"))
    assert caller.endswith("        [11] » caller")


@pytest.mark.parametrize("db", V4_DATABASES)
def test_json_is_preorder_with_all_metric_values(db: str) -> None:
    path = shared_path("hpctoolkit", "dbase", db)
    recs = json.loads(run_cli("report", str(path), "--format", "json", "--unsorted",
                              "--keep-lineless", check=True).stdout)
    exp = callpath.open(path)
    cct = exp.cct
    assert [r["id"] for r in recs] == cct.ctx_id.tolist()
    seen: dict[int, int] = {}
    for k, r in enumerate(recs):
        assert set(r) >= {"id", "parent", "depth", "type", "name", "module", "file", "line",
                          "metrics"}
        assert r["type"] in {"function", "loop", "line", "instruction", "entry"}
        if k == 0:
            assert r["parent"] is None and r["depth"] == 0
        else:
            assert r["parent"] in seen  # parents come before children
            assert r["depth"] == recs[seen[r["parent"]]]["depth"] + 1
        seen[r["id"]] = k
        for m in exp.metrics:
            assert r["metrics"][f"{m.name} (I)"] == float(exp.inclusive(m)[k])
            assert r["metrics"][f"{m.name} (E)"] == float(exp.exclusive(m)[k])


def test_json_fields_of_a_loop_and_a_function() -> None:
    path = shared_path("hpctoolkit", "dbase", "small.d")
    recs = {r["id"]: r for r in json.loads(run_cli("report", str(path), "-f", "json").stdout)}
    loop = recs[16]
    assert (loop["type"], loop["line"], loop["file"].endswith("small.c")) == ("loop", 3, True)
    assert loop["module"].endswith("testmeas-small")
    fn = recs[22]
    assert (fn["type"], fn["name"], fn["line"]) == ("function", "caller", 6)
    assert fn["metrics"]["CPUTIME (sec) (I)"] == pytest.approx(0.605316)


def test_depth_and_threshold_hide_nodes_and_their_subtrees() -> None:
    path = str(shared_path("hpctoolkit", "dbase", "small.d"))
    recs = json.loads(run_cli("report", path, "-f", "json", "--depth", "3").stdout)
    assert max(r["depth"] for r in recs) == 3 and len(recs) == 4
    # 0.604943 s of 1.210259 s is 49.98%: below a 50% threshold, and so is all below it.
    recs = json.loads(run_cli("report", path, "-f", "json", "--threshold", "50").stdout)
    assert 10 not in {r["id"] for r in recs}  # [11] » spinsleep hidden
    assert 9 not in {r["id"] for r in recs}  # ... with its subtree
    total = recs[0]["metrics"]["CPUTIME (sec) (I)"]
    assert all(r["metrics"]["CPUTIME (sec) (I)"] >= 0.5 * total for r in recs)
    assert {19, 16, 2} <= {r["id"] for r in recs}


def test_metric_choice_by_name_prefix_and_index() -> None:
    path = str(shared_path("hpctoolkit", "dbase", "small.d"))
    a = run_cli("report", path, "--metric", "CPUTIME (sec)", check=True).stdout
    b = run_cli("report", path, "--metric", "cputime", check=True).stdout
    c = run_cli("report", path, "--metric", "0", check=True).stdout
    assert a == b == c


def test_contexts_listing() -> None:
    out = run_cli("report", str(shared_path("hpctoolkit", "dbase", "loops-cputime-t.d")),
                  "--contexts", check=True).stdout
    rows = out.splitlines()
    assert "summary" in rows[1]
    threads = sorted(r.split()[-1] for r in rows if "THREAD" in r)
    assert threads == ["0", "1", "2", "3"]
    assert rows[-1] == "4 execution contexts"


@pytest.mark.parametrize("args, needle", [
    (["report", "/nonexistent/db"], "/nonexistent/db: no such file"),
    (["report", "{tmp}"], "not a performance database"),
    (["report", "{small}", "--metric", "cycles"], "unknown metric 'cycles'"),
    (["report", "{small}", "--depth", "-1"], "non-negative integer"),
    (["report", "{small}", "--threshold", "150"], "percentage"),
    (["report", "{small}", "--derived", "bad=$0 +"], "formula '$0 +', column 5"),
    (["report", "{small}", "--view", "flat", "--zoom", "99999"], "no node 99999"),
    (["report", "{small}", "--filter", "x:", "--threads", "RANK 9"], "selects no execution"),
    (["report", "{small}", "--view-config", "nosuch"], "no predefined view"),
    (["report", "{small}", "--columns", ",,"], "--columns ',,': expected a comma-separated"),
    (["report", "{small}", "--columns", ""], "--columns '': expected a comma-separated"),
])
def test_user_errors_are_one_line_and_exit_2(args: list[str], needle: str,
                                              tmp_path: object) -> None:
    small = str(shared_path("hpctoolkit", "dbase", "small.d"))
    argv = [a.format(tmp=tmp_path, small=small) for a in args]
    proc = run_cli(*argv)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_inclusive_is_consistent_with_children() -> None:
    """Inclusive cost of a node is at least the sum over its children (equal when the node
    itself has no cost of its own)."""
    exp = callpath.open(shared_path("hpctoolkit", "dbase", "loops-cputime-t.d"))
    inc = exp.inclusive(0)
    offsets, children = exp.cct.child_csr()
    sums = np.add.reduceat(np.append(inc[children], 0), offsets[:-1])
    has = np.diff(offsets) > 0
    assert np.all(inc[has] >= sums[has] - 1e-9)


def _cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.parametrize("args", [
    ["report", "{db}", "--format", "json"],
    ["export", "{db}", "--to", "speedscope", "-o", "-"],
    ["lines", "{db}"],
])
def test_closed_stdout_and_early_pipe_close_are_quiet(args: list[str], tmp_path: Path) -> None:
    """'callpath report DB >&-' raised AttributeError on sys.stdout None (a traceback), and
    '| head -c 1' must not print BrokenPipeError's: no reader, no error."""
    db = str(shared_path("hpctoolkit", "dbase", "loops-cputime-t.d"))
    argv = [sys.executable, "-m", "callpath", *[a.format(db=db) for a in args]]
    env = {**_cli_env(), "XDG_CONFIG_HOME": str(tmp_path)}
    closed = subprocess.run(argv, preexec_fn=lambda: os.close(1), stderr=subprocess.PIPE,
                            text=True, env=env, timeout=120, check=False)
    assert closed.returncode == 0 and "Traceback" not in closed.stderr, closed.stderr
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as p:
        assert p.stdout is not None and p.stderr is not None
        assert p.stdout.read(1)
        p.stdout.close()  # the reader goes away after one byte, like 'head -c 1'
        err = p.stderr.read().decode()
        assert p.wait(timeout=120) == 0 and "Traceback" not in err, err
