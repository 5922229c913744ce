"""``callpath report`` options of the analysis engine, run as real commands on real databases:
views in JSON and CSV, derived metrics saved with a database, view configurations,
per-context statistics and plots, Find and flatten."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import callpath
from conftest import run_cli, shared_path

LOOPS = shared_path("hpctoolkit", "dbase", "loops-cputime-t.d")
SMALL = shared_path("hpctoolkit", "dbase", "small.d")


@pytest.mark.parametrize("view", ["top-down", "bottom-up", "flat"])
def test_json_schema_and_tree_shape_in_every_view(view: str) -> None:
    recs = json.loads(run_cli("report", str(LOOPS), "-v", view, "-f", "json", "-d", "4",
                              check=True).stdout)
    assert recs[0]["parent"] is None and recs[0]["name"] == "<program root>"
    depth_of = {}
    for r in recs:
        assert set(r) >= {"id", "parent", "depth", "type", "name", "label", "module", "file",
                          "line", "metrics"}
        if r["parent"] is not None:
            assert r["depth"] == depth_of[r["parent"]] + 1
        depth_of[r["id"]] = r["depth"]
        # a child never costs more than its parent (inclusive)
    by_id = {r["id"]: r for r in recs}
    for r in recs[1:]:
        par = by_id[r["parent"]]
        assert r["metrics"]["CPUTIME (sec) (I)"] <= par["metrics"]["CPUTIME (sec) (I)"] + 1e-9
    if view == "bottom-up":
        assert any(" « " in r["label"] for r in recs)
    if view == "flat":
        assert {"module", "file", "function", "loop", "line"} <= {r["type"] for r in recs}


@pytest.mark.parametrize("view", ["top-down", "bottom-up", "flat"])
def test_csv_export_matches_the_text_report(view: str) -> None:
    args = ["report", str(LOOPS), "-v", view, "-d", "3", "-t", "1"]
    text = run_cli(*args, check=True).stdout.splitlines()
    rows = list(csv.reader(io.StringIO(run_cli(*args, "-f", "csv", check=True).stdout)))
    assert rows[0] == ["Scope", "CPUTIME (sec) (I)", "CPUTIME (sec) (E)"]
    assert rows[1][0] == "<program root>"  # the aggregate row first
    assert len(rows) == len(text)  # header + the same rows as the text report
    for line, row in zip(text[1:], rows[1:], strict=True):
        assert line.rstrip().endswith(row[0])
        assert f"{float(row[1]):.2e}" in line or float(row[1]) == 0


def test_derived_metric_values_and_persistence(tmp_path: Path) -> None:
    db = tmp_path / "small.d"
    shutil.copytree(SMALL, db)
    out = run_cli("report", str(db), "--derived", "double=2*$0", "--derived", "share=$0/@0",
                  "--derived-format", "share=%.4f", "--save-derived", "-f", "json",
                  "--unsorted", check=True).stdout
    recs = json.loads(out[out.index("["):])
    for r in recs:
        i = r["metrics"]["CPUTIME (sec) (I)"]
        assert r["metrics"]["double"] == pytest.approx(2 * i)
        assert r["metrics"]["share"] == pytest.approx(i / recs[0]["metrics"]["CPUTIME (sec) (I)"])
    assert (db / "callpath" / "derived-metrics.json").is_file()
    # reopened without --derived: the saved metrics are columns again
    listing = run_cli("report", str(db), "--list-metrics", check=True).stdout
    assert "$2  double = 2*$0" in listing and "$3  share = $0/@0" in listing
    text = run_cli("report", str(db), "-m", "share", "-d", "0", check=True).stdout
    assert "1.0000" in text.splitlines()[1]
    run_cli("report", str(db), "--remove-derived", "double", check=True)
    assert "double" not in run_cli("report", str(db), "--list-metrics", check=True).stdout


def test_division_by_zero_is_an_empty_cell() -> None:
    rows = list(csv.reader(io.StringIO(run_cli(
        "report", str(SMALL), "--derived", "r=$0/$1", "-f", "csv", "--unsorted",
        check=True).stdout)))
    col = rows[0].index("r")
    # the exclusive value is 0 at the root: 1.21/0 is undefined, shown empty
    assert rows[1][col] == ""
    assert any(r[col] for r in rows[2:])


def test_view_configuration_columns_per_thread_add_up() -> None:
    rows = list(csv.reader(io.StringIO(run_cli(
        "report", str(LOOPS), "--view-config", "CPU time per thread", "-f", "csv", "-d", "3",
        check=True).stdout)))
    head = rows[0]
    per_thread = [i for i, t in enumerate(head) if t.startswith("CPU time [THREAD") and
                  t.endswith("(I)")]
    assert len(per_thread) == 4
    total = head.index("CPUTIME (sec) (I)")
    for r in rows[1:]:
        assert sum(float(r[i]) for i in per_thread) == pytest.approx(float(r[total]))


def test_view_configuration_not_offered_says_why() -> None:
    proc = run_cli("report", str(LOOPS), "--view-config", "IPC")
    assert proc.returncode == 2
    assert "needs event 'CPU_clocks'" in proc.stderr and "CPUTIME (sec)" in proc.stderr


def test_per_context_statistics_add_up_to_the_summary() -> None:
    exp = callpath.open(LOOPS)
    out = run_cli("report", str(LOOPS), "-v", "flat", "--stats", "0", check=True).stdout
    vals = [float(line.split()[-1]) for line in out.splitlines() if "THREAD" in line]
    assert len(vals) == 4
    stats = {k.strip(): float(v) for k, v in (line.split(":") for line in out.splitlines()
                                              if ":" in line and "THREAD" not in line
                                              and " at " not in line)}
    assert stats["sum"] == pytest.approx(float(exp.inclusive(0)[0]), rel=1e-5)
    assert stats["mean"] == pytest.approx(np.mean(vals), rel=1e-5)
    assert stats["stddev"] == pytest.approx(np.std(vals), rel=1e-4)
    assert stats["cv"] == pytest.approx(np.std(vals) / np.mean(vals), rel=1e-3)


@pytest.mark.parametrize("kind", ["plot", "sorted", "histogram"])
def test_plot_writes_a_png(kind: str, tmp_path: Path) -> None:
    out = tmp_path / f"{kind}.png"
    run_cli("report", str(LOOPS), "--plot", "0", "--kind", kind, "-o", str(out), check=True)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


def test_find_flatten_and_zoom() -> None:
    found = run_cli("report", str(LOOPS), "-v", "flat", "--find", "func?", "--find-regex",
                    check=True).stdout.splitlines()[1:]
    # the procedures and their call sites (`[line] » func1`) both match
    assert {line.split()[-1] for line in found} == {"func1", "func2"}
    assert any(line.endswith("  func1") for line in found)
    assert any("» func1" in line for line in found)
    none = run_cli("report", str(LOOPS), "--find", "FUNC1", "--find-case")
    assert none.returncode == 1 and "no node" in none.stdout
    flat = run_cli("report", str(LOOPS), "-v", "flat", "--flatten", "2", "-d", "1",
                   check=True).stdout.splitlines()[2:]
    names = {line.split()[-1] for line in flat}
    assert {"func1", "func2", "test_separated_loops"} <= names  # procedures at the top
    recs = json.loads(run_cli("report", str(SMALL), "-f", "json", "--zoom", "22",
                              check=True).stdout)
    assert recs[0]["id"] == 22 and recs[0]["name"] == "caller"
