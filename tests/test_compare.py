"""``callpath diff`` and ``callpath merge`` on real runs and real databases, and the SVG flame
graph of ``callpath report --flame``.

The runs: tests/compare_programs/twoinputs.c compiled and profiled twice, once with the input
that makes it call ``only_extra`` (a loop of 10^8 iterations, ~0.15 s: ~150 samples at the
1 ms cpu-clock period; the run without it never calls it, so its 0 there is exact). Every
other assertion compares databases with each other (a diff against the values of its
inputs), so nothing depends on how many samples fell where.
"""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import callpath
from callpath.analysis.columns import ColumnSet
from callpath.analysis.derived import load_derived
from callpath.analysis.source import tree_source
from callpath.analysis.view_by_name import make_view
from callpath.model import Experiment, NodeKind
from conftest import ROOT, perf_reason, run_cli, shared_path
from prof_tree import find

PROGRAM = ROOT / "tests" / "compare_programs" / "twoinputs.c"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    reason = perf_reason()
    if reason is not None:
        pytest.skip(f"perf_event sampling is not available here: {reason}")
    d = tmp_path_factory.mktemp("compare")
    exe = d / "twoinputs"
    subprocess.run(["gcc", "-O2", "-g", "-o", str(exe), str(PROGRAM)], check=True)
    a, b = d / "plain.d", d / "extra.d"
    run_cli("profile", "-m", str(d / "plain.m"), "-o", str(a), "--", str(exe), "100000",
            check=True)
    run_cli("profile", "-m", str(d / "extra.m"), "-o", str(b), "--", str(exe), "100000",
            "extra", check=True)
    return a, b


def columns_of(db: Path) -> tuple[Experiment, ColumnSet, object]:
    """The Top-down view of a database with its saved derived metrics, as the report has."""
    exp = callpath.open(db)
    src = tree_source(exp, None)
    cols = ColumnSet(src, load_derived(db))
    return exp, cols, make_view("top-down", src)


def column(db_cols: tuple[Experiment, ColumnSet, object], title: str) -> np.ndarray:
    _exp, cols, view = db_cols
    col = next((c for c in cols.columns if c.title == title), None)
    assert col is not None, f"no column {title!r}: {[c.title for c in cols.columns]}"
    return cols.values(view, col)  # type: ignore[arg-type]


def fn_node(exp: Experiment, name: str) -> int:
    nodes = find(exp, NodeKind.FUNCTION, name=name)
    assert len(nodes) == 1, f"{name}: {nodes}"
    return nodes[0]


def test_diff_of_two_runs(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs
    out = tmp_path / "diff.d"
    r = run_cli("diff", str(a), str(b), "-o", str(out), check=True)
    assert str(out) in r.stdout
    base, new = callpath.open(a), callpath.open(b)
    dc = columns_of(out)
    diff = dc[0]
    for m in base.metrics:
        for scope, tag in (("inclusive", "I"), ("exclusive", "E")):
            b_vals = column(dc, f"{m.name} [base] ({tag})")
            n_vals = column(dc, f"{m.name} [new] ({tag})")
            delta = column(dc, f"{m.name} [delta] ({tag})")
            np.testing.assert_allclose(delta, n_vals - b_vals)
            if scope == "inclusive":
                # the roots of the comparison are the roots of the runs, and so is the delta
                assert b_vals[0] == base.inclusive(m.name)[0]
                assert n_vals[0] == new.inclusive(m.name)[0]
                assert delta[0] == pytest.approx(new.inclusive(m.name)[0]
                                                 - base.inclusive(m.name)[0], abs=1e-12)
                ratio = column(dc, f"{m.name} [ratio] ({tag})")
                assert ratio[0] == pytest.approx(n_vals[0] / b_vals[0])
        # a routine of one run only: 0 on the other side, its own value on its side
        extra = fn_node(diff, "only_extra")
        incl_new = column(dc, f"{m.name} [new] (I)")
        assert column(dc, f"{m.name} [base] (I)")[extra] == 0
        assert incl_new[extra] == new.inclusive(m.name)[fn_node(new, "only_extra")] > 0
        # a routine of both runs is one context with each run's value on its side
        common = fn_node(diff, "common")
        assert column(dc, f"{m.name} [base] (I)")[common] == \
            base.inclusive(m.name)[fn_node(base, "common")]
        assert incl_new[common] == new.inclusive(m.name)[fn_node(new, "common")]
    assert find(base, NodeKind.FUNCTION, name="only_extra") == []
    # one execution context per run, named by its input
    labels = [c.label(diff.id_names) for c in diff.contexts]
    assert [lab.split()[:2] for lab in labels] == [["INPUT", "0"], ["INPUT", "1"]]


def test_views_and_report_work_on_a_diff(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs
    out = tmp_path / "diff.d"
    run_cli("diff", str(a), str(b), "-o", str(out), check=True)
    r = run_cli("report", str(out), "--list-metrics", check=True)
    assert "[delta] (I) = " in r.stdout and "[ratio] (E) = " in r.stdout
    r = run_cli("report", str(out), "-m", "cpu-clock (sec) [delta] (I)", check=True)
    assert "only_extra" in r.stdout
    for view in ("bottom-up", "flat"):
        r = run_cli("report", str(out), "-v", view, "-f", "csv", "-d", "2", check=True)
        assert r.stdout.startswith("Scope,")
    r = run_cli("report", str(out), "--threads", "INPUT 1", "--find", "only_extra",
                check=True)
    assert "only_extra" in r.stdout
    # the program's source is one file of the comparison, named by the path it was measured
    # at and copied into the comparison (two inputs' copies were two files named by their
    # databases' paths, and statements read plain.d/src/.../twoinputs.c:12)
    exp = callpath.open(out)
    srcs = [f for f in exp.files if f.original == str(PROGRAM)]
    assert len(srcs) == 1 and srcs[0].copied and (out / srcs[0].path).is_file(), exp.files
    r = run_cli("report", str(out), "--hot-path", check=True)
    assert f"{PROGRAM.name}:" in r.stdout and "plain.d" not in r.stdout, r.stdout


def test_diff_and_merge_with_itself_are_zero(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = runs
    d, m = tmp_path / "self-diff.d", tmp_path / "self-merge.d"
    run_cli("diff", str(a), str(a), "-o", str(d), check=True)
    run_cli("merge", str(a), str(a), "-o", str(m), check=True)
    exp = callpath.open(a)
    dc, mc = columns_of(d), columns_of(m)
    assert len(dc[0].cct) == len(exp.cct)  # every context matched itself
    for met in exp.metrics:
        for tag in ("I", "E"):
            assert not np.any(column(dc, f"{met.name} [delta] ({tag})"))
            assert not np.any(column(mc, f"{met.name} [spread] ({tag})"))
            np.testing.assert_array_equal(column(mc, f"{met.name} [{a.name}] ({tag})"),
                                          column(mc, f"{met.name} [{a.name}#2] ({tag})"))
        np.testing.assert_array_equal(column(dc, f"{met.name} [base] (I)"),
                                      exp.inclusive(met.name))


def test_merge_of_three(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs
    out = tmp_path / "m3.d"
    run_cli("merge", str(a), str(b), str(a), "-o", str(out), check=True)
    mc = columns_of(out)
    base, new = callpath.open(a), callpath.open(b)
    for met in base.metrics:
        cols = [column(mc, f"{met.name} [{t}] (I)") for t in (a.name, b.name, f"{a.name}#2")]
        assert [c[0] for c in cols] == [base.inclusive(met.name)[0],
                                        new.inclusive(met.name)[0],
                                        base.inclusive(met.name)[0]]
        spread = column(mc, f"{met.name} [spread] (I)")
        np.testing.assert_allclose(spread, np.max(cols, axis=0) - np.min(cols, axis=0))
    assert len(mc[0].contexts) == 3


def test_diff_of_hpctoolkit_databases(tmp_path: Path) -> None:
    small = shared_path("hpctoolkit", "dbase", "small.d")
    loops = shared_path("hpctoolkit", "dbase", "loops-cputime-t.d")
    out = tmp_path / "hpctk.d"
    run_cli("diff", str(small), str(loops), "-o", str(out), check=True)
    dc = columns_of(out)
    s, lp = callpath.open(small), callpath.open(loops)
    name = s.metrics[0].name
    assert column(dc, f"{name} [base] (I)")[0] == pytest.approx(s.inclusive(name)[0])
    assert column(dc, f"{name} [new] (I)")[0] == pytest.approx(lp.inclusive(name)[0])
    # 1 + 4 threads, each thread's values kept (per-context views work on a comparison)
    exp = dc[0]
    assert len(exp.contexts) == len(s.contexts) + len(lp.contexts)
    per_ctx = [exp.values_in(p.index, f"{name} [new]", "execution")[0]
               for p in exp.contexts[1:]]
    assert sum(per_ctx) == pytest.approx(lp.inclusive(name)[0])
    # the union holds every context of both trees: nothing of either is lost
    assert len(exp.cct) >= max(len(s.cct), len(lp.cct))
    r = run_cli("report", str(out), "--contexts", check=True)
    assert "INPUT 1" in r.stdout
    # the text report of a comparison shows base, new and delta by default (it showed only
    # the [base] columns), and the root's delta is new - base
    r = run_cli("report", str(out), check=True)
    head = r.stdout.splitlines()[0]
    assert [f"{name} [{side}] (I)" in head for side in ("base", "new", "delta")] == [True] * 3
    delta = float(r.stdout.splitlines()[1].split()[4])
    assert delta == pytest.approx(lp.inclusive(name)[0] - s.inclusive(name)[0], rel=1e-2)


def test_a_zero_delta_prints_as_zero(tmp_path: Path) -> None:
    """A database compared with itself: every delta is zero and prints as the measured
    columns print zero, ``0`` (it printed ``0.00e+00``), in the report and in the viewer's
    cells (the same text)."""
    small = shared_path("hpctoolkit", "dbase", "small.d")
    out = tmp_path / "self.d"
    run_cli("diff", str(small), str(small), "-o", str(out), check=True)
    r = run_cli("report", str(out), "-d", "4", check=True)
    rows = r.stdout.splitlines()[1:]
    assert len(rows) >= 4 and "e+00 " not in r.stdout.replace("1.21e+00 ", "")
    for row in rows:
        base, _pct, new, _pct2, delta = row.split()[:5]
        assert base == new != "0" and delta == "0", row
    from view_support import get_json, serve

    with serve([out]) as s:
        derived = get_json(s.url, "/api/databases")[0]["derived"]  # as the page sends them
        cols = get_json(s.url, "/api/db/0/columns", derived=derived)
        (delta,) = [c for c in cols if c["name"].endswith("[delta] (I)")]
        assert delta["aggregate_text"] == "0"
        kids = get_json(s.url, "/api/db/0/children", derived=derived)["rows"]
        assert kids and all(k["text"][delta["key"]] == "0" for k in kids)


def _frames(svg: Path) -> list[dict[str, float]]:
    root = ET.parse(svg).getroot()  # parses as XML
    ns = "{http://www.w3.org/2000/svg}"
    out = []
    for g in root.iter(f"{ns}g"):
        rect = g.find(f"{ns}rect")
        assert rect is not None
        out.append({"parent": int(g.get("data-parent", "-1")), "value": float(g.get(
            "data-value", "0")), "x": float(rect.get("x", "0")),
            "w": float(rect.get("width", "0")), "fill": rect.get("fill", ""),
            "title": g.findtext(f"{ns}title") or ""})
    return out


def _check_widths(frames: list[dict[str, float]], inner: float) -> None:
    assert frames[0]["w"] == pytest.approx(inner)
    total = frames[0]["value"]
    kids: dict[int, float] = {}
    for f in frames[1:]:
        p = int(f["parent"])
        kids[p] = kids.get(p, 0.0) + f["w"]
        parent = frames[p]
        # inside the parent, and as wide as the value says
        assert parent["x"] - 1e-3 <= f["x"] and f["x"] + f["w"] <= parent["x"] + parent["w"] + 2e-3
        assert f["w"] == pytest.approx(inner * f["value"] / total, abs=2e-3)
    for p, w in kids.items():
        assert w <= frames[p]["w"] + 2e-3 * len(frames)


def test_flame_svg(runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = runs
    out = tmp_path / "diff.d"
    run_cli("diff", str(a), str(b), "-o", str(out), check=True)
    svg = tmp_path / "diff.svg"
    run_cli("report", str(out), "-m", "cpu-clock (sec) [new]", "--flame", "-o", str(svg),
            check=True)
    frames = _frames(svg)
    _check_widths(frames, 1200 - 20)
    exp = callpath.open(b)
    assert frames[0]["value"] == pytest.approx(exp.inclusive("cpu-clock (sec)")[0])
    extra = next(f for f in frames if "only_extra" in str(f["title"]))
    assert str(extra["fill"]).startswith("rgb(235,")  # more in the new run: red
    # without -m, a comparison's flame graph is the new run's too
    plain = tmp_path / "plain.svg"
    run_cli("report", str(out), "--flame", "-o", str(plain), check=True)
    assert [f["value"] for f in _frames(plain)] == [f["value"] for f in frames]
    # the bottom-up icicle of a real HPCToolkit database: exclusive widths add up
    icicle = tmp_path / "icicle.svg"
    run_cli("report", str(shared_path("hpctoolkit", "dbase", "loops-cputime-t.d")),
            "-v", "bottom-up", "--flame", "-o", str(icicle), check=True)
    _check_widths(_frames(icicle), 1200 - 20)


@pytest.mark.parametrize("args, words", [
    (["diff", "/nonexistent.d", "/nonexistent2.d", "-o", "X"], ["/nonexistent.d"]),
    (["merge", "DB", "-o", "X"], ["at least two"]),
])
def test_bad_arguments_are_one_line(args: list[str], words: list[str], tmp_path: Path) -> None:
    args = [str(shared_path("hpctoolkit", "dbase", "small.d")) if x == "DB" else x
            for x in args]
    args = [str(tmp_path / "x.d") if x == "X" else x for x in args]
    r = run_cli(*args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert all(w in r.stderr for w in words), r.stderr
    assert "Traceback" not in r.stderr


def test_bad_inputs_are_one_line(tmp_path: Path) -> None:
    small = shared_path("hpctoolkit", "dbase", "small.d")
    broken = tmp_path / "broken.d"
    shutil.copytree(small, broken)
    meta = broken / "meta.db"
    meta.write_bytes(meta.read_bytes()[:100])
    r = run_cli("diff", str(small), str(broken), "-o", str(tmp_path / "o.d"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "meta.db" in r.stderr, r.stderr
    own = tmp_path / "own.d"
    shutil.copytree(small, own)
    r = run_cli("diff", str(small), str(own), "-o", str(own))
    assert r.returncode == 2 and "overwrite the input" in r.stderr, r.stderr
    r = run_cli("report", str(small), "--flame")
    assert r.returncode == 2 and "-o FILE.svg" in r.stderr, r.stderr
