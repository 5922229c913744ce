"""The line × context views (PerfVisS, seeds/003) on databases with known costs: the seed's
Figure 1 built from the seed's own text, Figure 4's overview arithmetic on a generated
94,824-line program against a direct (loop-by-loop) computation, and every database of
../shared/data against the Flat view's line scopes."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import callpath
from callpath.analysis import lines as L
from callpath.analysis.flat import FlatView
from callpath.analysis.nodes import ViewKind
from callpath.analysis.source import tree_source
from callpath.cli.main import main
from callpath.formats.v4.writer import write_v4
from conftest import ROOT, run_cli
from lines_support import (
    FIG4_LINES,
    figure1,
    figure4_program,
    lines_experiment,
    write_figure1_database,
)

DATA = ROOT.parent / "shared" / "data"
SHARED_DBS = [DATA / "hpctoolkit" / "dbase" / n for n in
              ("small.d", "small.nostruct.d", "loops-cputime-t.d")] + [
    DATA / "hatchet" / "hpctoolkit-cpi-database"]


@pytest.fixture(scope="module")
def fig1(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    try:
        return write_figure1_database(tmp_path_factory.mktemp("fig1"))
    except FileNotFoundError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def fig4(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return figure4_program(tmp_path_factory.mktemp("fig4"))


# ---- Figure 1 ----------------------------------------------------------------------------

def test_figure1_table_reproduced(fig1: tuple[Path, Path]) -> None:
    """The text table prints the seed's tick counts, source and min/max with processor
    numbers, line for line (ties as the seed breaks them: ``0 1 0 0`` → ``min 0(3)``)."""
    db, _ = fig1
    ticks, source, minmax = figure1()
    assert len(ticks) == 36
    p = run_cli("lines", str(db), "--file", "fig1.f90", "--from", "1", "--to", "36",
                check=True)
    rows = [s for s in p.stdout.splitlines() if re.match(r"^\s*\d+\s+\d+\s+\d+\s+\d+\s+\d+",
                                                       s)]
    assert len(rows) == 36
    for k, row in enumerate(rows):
        cols = row.split()
        assert [int(x) for x in cols[:4]] == ticks[k]
        assert int(cols[4]) == k + 1
        if source[k]:
            assert source[k] in row
        got = re.search(r"min (\d+)\((\d+)\) max (\d+)\((\d+)\)", row)
        want = minmax[k]
        if want is None:
            assert got is None, row
        else:
            assert got is not None, row
            assert tuple(int(x) for x in got.groups()) == want


def test_figure1_json_shape_and_statistics(fig1: tuple[Path, Path]) -> None:
    db, _ = fig1
    ticks, _, _ = figure1()
    arr = np.asarray(ticks, dtype=float)
    p = run_cli("lines", str(db), "--format", "json", check=True)
    doc = json.loads(p.stdout)
    assert set(doc) == {"metric", "contexts", "lines"}
    assert doc["metric"] == "ticks"
    assert doc["contexts"] == ["RANK 0", "RANK 1", "RANK 2", "RANK 3"]
    nz = np.nonzero(arr.any(axis=1))[0]
    assert [e["line"] for e in doc["lines"]] == (nz + 1).tolist()  # every line with cost
    for e in doc["lines"]:
        assert set(e) == {"file", "line", "values", "sum", "min", "min_context", "max",
                          "max_context", "mean", "stdev"}
        v = arr[e["line"] - 1]
        assert e["values"] == v.tolist()
        assert e["sum"] == v.sum() and e["min"] == v.min() and e["max"] == v.max()
        assert math.isclose(e["mean"], v.mean()) and math.isclose(e["stdev"], v.std())
        assert e["max_context"] == f"RANK {int(np.argmax(v))}"
    # --from/--to: every line of the range, zero lines included
    p = run_cli("lines", str(db), "-f", "json", "--file", "fig1.f90", "--from", "5",
                "--to", "9", check=True)
    assert [e["line"] for e in json.loads(p.stdout)["lines"]] == [5, 6, 7, 8, 9]


def test_figure1_csv_and_png(fig1: tuple[Path, Path], tmp_path: Path) -> None:
    import csv

    import matplotlib.image as mpimg

    db, _ = fig1
    ticks, _, _ = figure1()
    p = run_cli("lines", str(db), "-f", "csv", check=True)
    rows = list(csv.reader(p.stdout.splitlines()))
    assert rows[0][:6] == ["file", "line", "RANK 0", "RANK 1", "RANK 2", "RANK 3"]
    for r in rows[1:]:
        assert [float(x) for x in r[2:6]] == ticks[int(r[1]) - 1]
    png = tmp_path / "detail.png"
    run_cli("lines", str(db), "--file", "fig1.f90", "--from", "1", "--to", "36", "--png",
            str(png), check=True)
    img = mpimg.imread(png)
    assert img.shape[0] > 300 and img.shape[1] > 600
    # the heat map uses the seed's palette: red for the hottest cell (249 in context 0)
    reds = (img[..., 0] > 0.45) & (img[..., 1] < 0.1) & (img[..., 2] < 0.1)
    assert reds.sum() > 50
    png2 = tmp_path / "overview.png"
    run_cli("lines", str(db), "--overview", "--bin", "1", "--png", str(png2), check=True)
    assert mpimg.imread(png2).shape[0] > 100


def test_groups_and_context_selection(tmp_path: Path) -> None:
    """group=rank sums the threads of each rank; group=node all ranks of a node; a
    Thread-view selection keeps only the matching contexts."""
    rng = np.random.default_rng(1)
    ticks = rng.integers(0, 5, size=(30, 6)).astype(float)
    ticks[10:14] = 0
    src = tmp_path / "g.c"
    src.write_text("x\n" * 30)
    exp = lines_experiment(str(src), ticks, [("p", 1, 30)], threads_per_rank=3)
    write_v4(exp, tmp_path / "g.d", copy_sources=False)
    exp = callpath.open(tmp_path / "g.d")
    m = L.build_line_matrix(exp, "ticks", "rank")
    assert m.labels == ["RANK 0", "RANK 1"]
    w = L.window(m, 0, m.n_rows)
    np.testing.assert_allclose(w, np.stack([ticks[:, :3].sum(1), ticks[:, 3:].sum(1)], 1))
    m2 = L.build_line_matrix(exp, 0, "node")
    np.testing.assert_allclose(L.window(m2, 0, 30)[:, 0], ticks.sum(1))
    m3 = L.build_line_matrix(exp, 0, "none", "THREAD 1")
    assert m3.labels == ["RANK 0 THREAD 1", "RANK 1 THREAD 1"]
    np.testing.assert_allclose(L.window(m3, 0, 30), ticks[:, [1, 4]])
    assert L.build_line_matrix(exp, 0, "rank") is m  # cached per (metric, group, selection)


def test_window_stats_rows_against_dense(fig4) -> None:  # type: ignore[no-untyped-def]
    db, ticks, _procs = fig4
    m = L.build_line_matrix(callpath.open(db))
    assert m.n_rows == FIG4_LINES
    for start in (0, 1234, 40_000, FIG4_LINES - 50):
        np.testing.assert_array_equal(L.window(m, start, 100), ticks[start:start + 100])
    rows = np.nonzero(ticks.any(axis=1))[0][::7]
    st = L.line_stats(m, rows)
    d = ticks[rows]
    np.testing.assert_array_equal(st["sum"], d.sum(1))
    np.testing.assert_array_equal(st["max"], d.max(1))
    np.testing.assert_array_equal(st["max_context"], d.argmax(1))
    np.testing.assert_array_equal(st["min"], d.min(1))
    last_min = d.shape[1] - 1 - d[:, ::-1].argmin(1)
    np.testing.assert_array_equal(st["min_context"], last_min)
    np.testing.assert_allclose(st["stdev"], d.std(1))
    assert L.row_of(m, "spike.f90", 500) == 499
    assert m.readable == [True]


# ---- Figure 4 ----------------------------------------------------------------------------

def _direct_overview(ticks: np.ndarray, skip: int, b: int, reduce: str):  # type: ignore[no-untyped-def]
    """The overview computed the plain way, one line at a time (the oracle)."""
    has = ticks.any(axis=1)
    n = len(has)
    kept = []
    i = 0
    while i < n:
        if has[i]:
            kept.append(i)
            i += 1
            continue
        j = i
        while j < n and not has[j]:
            j += 1
        if j - i <= skip:
            kept.extend(range(i, j))
        i = j
    bins = [kept[k:k + b] for k in range(0, len(kept), b)]
    vals = [ticks[g].max(axis=0) if reduce == "max" else ticks[g].sum(axis=0) for g in bins]
    return kept, bins, np.asarray(vals)


@pytest.mark.parametrize("reduce", ["max", "sum"])
def test_figure4_overview_arithmetic(fig4, reduce: str) -> None:  # type: ignore[no-untyped-def]
    db, ticks, _procs = fig4
    m = L.build_line_matrix(callpath.open(db))
    ov = L.overview(m, skip=50, bin=4, reduce=reduce, strip_lines=80)
    kept, bins, vals = _direct_overview(ticks, 50, 4, reduce)
    assert ov.kept.sum() == len(kept) == 4400
    assert ov.n_orows == len(bins) == 1100 and ov.n_strips == 14  # the seed's 14 strips
    np.testing.assert_array_equal(ov.values, vals)
    np.testing.assert_array_equal(np.nonzero(ov.kept)[0], kept)
    grid = ov.strips()
    assert grid.shape == (14, 80, 4)
    for o in (0, 79, 80, 1099):
        np.testing.assert_array_equal(grid[o // 80, o % 80], vals[o])
    # every overview position maps back to the first line of its bin, and forward again
    for o, g in enumerate(bins):
        s, r = divmod(o, 80)
        row = ov.locate(s, r)
        assert row == g[0]
        assert (int(ov.fwd_strip[row]), int(ov.fwd_row[row])) == (s, r)
        assert all(int(ov.fwd_orow[x]) == o for x in g)
    with pytest.raises(callpath.CallpathError):
        ov.locate(13, 79)  # past the last of 1,100 rows (13 * 80 + 79 = 1119)


def test_figure4_rectangles_wrap_like_the_data(fig4) -> None:  # type: ignore[no-untyped-def]
    db, ticks, procs = fig4
    m = L.build_line_matrix(callpath.open(db))
    ov = L.overview(m, 50, 4, "max", 80)
    _kept, bins, _ = _direct_overview(ticks, 50, 4, "max")
    orow_of = {x: o for o, g in enumerate(bins) for x in g}
    cases = [(p[1] - 1, p[2] - 1) for p in procs] + [(0, FIG4_LINES - 1), (30_000, 30_099)]
    for a, b in cases:
        inside = [orow_of[x] for x in range(a, b + 1) if x in orow_of]
        rects = ov.rectangles(a, b)
        covered = [s * 80 + r0 + k for s, r0, n in rects for k in range(n)]
        if inside:
            assert covered == list(range(min(inside), max(inside) + 1))
        else:
            assert len(covered) == 1  # a marker where the skipped run was
        for _s, r0, n in rects:  # each piece stays inside its strip
            assert r0 >= 0 and r0 + n <= 80
    # a procedure's segment is its first to last line; the ranked list adds its lines
    top = L.ranked_procedures(m, 5)
    sums = {name: ticks[a - 1:b].sum() for name, a, b in procs}
    assert [t["procedure"] for t in top] == sorted(sums, key=lambda k: -sums[k])[:5]
    for t in top:
        name, a, b = next(p for p in procs if p[0] == t["procedure"])
        assert (t["first_row"], t["last_row"]) == (a - 1, b - 1)
        assert t["sum"] == sums[name]
        assert math.isclose(t["percent"], 100 * sums[name] / ticks.sum())
    # a line anywhere in a procedure (a blank inside it too) names that procedure
    name, a, b = procs[7]
    for line in (a, a + 30, b):
        got = L.procedure_at(m, line - 1)
        assert got is not None and got["procedure"] == name
    assert L.procedure_at(m, procs[0][1] - 10) is None  # in a gap between procedures


def test_context_axis_compression(tmp_path: Path) -> None:
    """Many contexts: bins by max, and the top N contexts per overview row, against numpy
    on the dense matrix."""
    rng = np.random.default_rng(7)
    n_lines, n_ctx = 600, 96
    ticks = rng.integers(0, 50, size=(n_lines, n_ctx)).astype(float)
    ticks[rng.random(n_lines) < 0.4] = 0
    ticks[200:300] = 0
    src = tmp_path / "many.c"
    src.write_text("y\n" * n_lines)
    exp = lines_experiment(str(src), ticks, [("a", 1, 300), ("b", 301, n_lines)])
    m = L.build_line_matrix(exp)
    _kept, _bins, vals = _direct_overview(ticks, 20, 3, "max")
    ov = L.overview(m, 20, 3, "max", 40, context_bins=10)
    edges = (np.arange(10) * n_ctx) // 10
    np.testing.assert_array_equal(ov.values, np.maximum.reduceat(vals, edges, axis=1))
    ov = L.overview(m, 20, 3, "max", 40, top_contexts=5)
    assert ov.top_index is not None
    np.testing.assert_array_equal(ov.values, -np.sort(-vals, axis=1)[:, :5])
    np.testing.assert_array_equal(np.take_along_axis(vals, ov.top_index, 1), ov.values)


# ---- every database of ../shared/data ----------------------------------------------------

@pytest.mark.parametrize("path", SHARED_DBS, ids=lambda p: p.name)
def test_line_sums_equal_flat_view_line_scopes(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} is absent (../shared/data not mounted)")
    exp = callpath.open(path)
    flat = FlatView(tree_source(exp))
    for metric in range(len(exp.metrics)):
        try:
            excl = flat.exclusive(metric)
        except callpath.CallpathError:
            continue
        nodes = flat.nodes
        is_line = (nodes.kind == ViewKind.LINE) & (nodes.file >= 0)
        want: dict[tuple[str, int], float] = {}
        for k in np.nonzero(is_line)[0].tolist():
            key = (exp.files[int(nodes.file[k])].path, int(nodes.line[k]))
            want[key] = want.get(key, 0.0) + float(excl[k])
        for group in ("none", "rank", "node"):
            m = L.build_line_matrix(exp, metric, group)
            got = {(m.files[int(m.file_of_row[r])], int(m.line_of_row[r])): float(m.row_sum[r])
                   for r in range(m.n_rows)}
            # every line scope is on the axis; the other rows (lines of a readable source
            # without a scope) cost nothing
            assert set(want) <= set(got)
            assert all(v == 0 for k, v in got.items() if k not in want)
            assert not m.known.any() or set(want) == {
                (m.files[int(m.file_of_row[r])], int(m.line_of_row[r]))
                for r in np.nonzero(m.known)[0]}
            for key, v in want.items():
                assert math.isclose(got[key], v, rel_tol=1e-9, abs_tol=1e-12), (key, group)
            # the columns add up to the sum of each line
            if m.n_rows:
                np.testing.assert_allclose(L.window(m, 0, m.n_rows).sum(1), m.row_sum)


def test_cli_on_shared_database_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    db = DATA / "hpctoolkit" / "dbase" / "loops-cputime-t.d"
    if not db.exists():
        pytest.skip(f"{db} is absent")
    p = run_cli("lines", str(db), "--ranked", "3", check=True)
    assert p.stdout.splitlines()[0].split()[:3] == ["rank", "procedure", "name"]
    p = run_cli("lines", str(db), "--ranked", "3", "-f", "json", check=True)
    doc = json.loads(p.stdout)
    assert [set(d) for d in doc] == [{"rank", "procedure", "file", "sum", "percent"}] * 3
    assert [d["rank"] for d in doc] == [0, 1, 2]
    assert doc[0]["sum"] >= doc[1]["sum"] >= doc[2]["sum"]
    p = run_cli("lines", str(db), "--overview", "--bin", "2", "--strip-lines", "10",
                check=True)
    assert "|" in p.stdout and "19 rows in 2 strips" in p.stdout
    for args, needle in [
        (["--metric", "NOPE"], "metric 'NOPE'"),
        (["--file", "nothere.c"], "nothere.c"),
        (["--from", "3"], "--from/--to need --file"),
        (["--group", "socket"], "invalid choice"),
        (["--contexts", "THREAD 9"], "selects no execution context"),
        (["--file", "loops.c", "--from", "9000"], "not on the line axis"),
        (["--bin", "0", "--overview"], "positive"),
        (["--png", str(ROOT / "x.txt")], "PNG"),
    ]:
        # in this process (the same entry point as the command; a subprocess each costs ~1 s)
        try:
            rc = main(["lines", str(db), *args])
        except SystemExit as e:  # argparse's usage errors
            rc = int(e.code or 0)
        assert rc == 2, args
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, err
    p = run_cli("lines", str(ROOT / "no-such-db"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    nost = DATA / "hpctoolkit" / "dbase" / "small.nostruct.d"
    p = run_cli("lines", str(nost))
    assert p.returncode == 2 and "no source-line scopes" in p.stderr


def test_instructions_when_the_binary_is_elsewhere() -> None:
    """HPCToolkit's database names a load module of another machine: no instructions, and a
    reason naming the module (the viewer's assembler pane shows it)."""
    db = DATA / "hpctoolkit" / "dbase" / "loops-cputime-t.d"
    if not db.exists():
        pytest.skip(f"{db} is absent")
    exp = callpath.open(db)
    got = L.line_instructions(exp, "loops.c", 20, 1)
    assert list(got) == []
    assert got.reason is not None and "cannot read load module" in got.reason
    assert any(m.path in got.reason for m in exp.modules)
    p = run_cli("lines", str(db), "--file", "loops.c", "--from", "20", "--to", "21",
                "--instructions", "-f", "json", check=True)
    doc = json.loads(p.stdout)
    assert doc["instructions"] == [] and doc["reason"] == got.reason
