"""``callpath lines`` on a Python profile names files by the paths they were measured at (not
the database's ``src/...`` copies) and lists them as the Flat view sorts them by default, by
cost, descending: a program whose own file costs most shows it first, although a library file
it imports has a path that sorts before it. ``--file`` takes that path, a unique suffix or the
base name (and still the copy's recorded path)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import callpath
from callpath.analysis import lines as L
from conftest import run_cli

BUSY = "def busy(n):\n    t = 0\n    for i in range(n):\n        t += i % 7\n    return t\n"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("linesfiles")
    (d / "aa").mkdir()
    (d / "zz").mkdir()
    helper = d / "aa" / "helper.py"
    helper.write_text(BUSY)
    main = d / "zz" / "main.py"
    main.write_text(f"import sys\nsys.path.insert(0, {str(d / 'aa')!r})\nimport helper\n"
                    + BUSY + "helper.busy(300_000)\nbusy(3_000_000)\n")
    out = d / "p.d"
    r = run_cli("profile", "-m", str(d / "p.m"), "-o", str(out), "--", sys.executable,
                str(main))
    assert r.returncode == 0, r.stderr
    return out, main, helper


def test_files_by_original_path_and_cost(db: tuple[Path, Path, Path]) -> None:
    # main's loop runs ten times as long as helper's (~0.2 s against ~0.02 s: hundreds of
    # samples against tens at 1 kHz), so that it sorts first fails with negligible odds
    out, main, helper = db
    r = run_cli("lines", str(out))
    assert r.returncode == 0, r.stderr
    heads = [ln[3:].split("  (")[0] for ln in r.stdout.splitlines() if ln.startswith("== ")]
    assert heads[0] == str(main), heads
    assert str(helper) in heads and not any(h.startswith("src/") for h in heads), heads
    # the database does hold copies under src/: the labels are not its table's paths
    exp = callpath.open(out)
    (rec,) = [f for f in exp.files if f.path.endswith("zz/main.py")]
    assert rec.copied and rec.path.startswith("src/") and rec.original == str(main)
    # every file's cost, in the order listed, never increases (each Python file is its own
    # load module, so the module order is the file order)
    doc = json.loads(run_cli("lines", str(out), "--format", "json", check=True).stdout)
    totals: dict[str, float] = {}
    for rec_ in doc["lines"]:
        totals[rec_["file"]] = totals.get(rec_["file"], 0.0) + rec_["sum"]
    costs = list(totals.values())
    assert next(iter(totals)) == str(main) and costs == sorted(costs, reverse=True), totals
    m = L.build_line_matrix(exp)
    assert m.file_labels[0] == str(main) and m.files[0] == rec.path


@pytest.mark.parametrize("name", ["{main}", "zz/main.py", "main.py", "{recorded}"])
def test_file_option_matches_the_original_path(db: tuple[Path, Path, Path], name: str) -> None:
    out, main, _ = db
    recorded = next(f.path for f in callpath.open(out).files if f.path.endswith("zz/main.py"))
    r = run_cli("lines", str(out), "--file", name.format(main=main, recorded=recorded))
    assert r.returncode == 0, r.stderr
    heads = [ln for ln in r.stdout.splitlines() if ln.startswith("== ")]
    assert heads == [f"== {main}"], r.stdout
    assert "t += i % 7" in r.stdout
