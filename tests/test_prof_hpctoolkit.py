"""``callpath prof`` on HPCToolkit's own measurement directories reproduces the databases that
HPCToolkit's hpcprof wrote from them: the same calling context tree (up to ordering and ids),
the same values at every context, in every execution context and in the summary."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import callpath
from callpath.attribute.hpctk import prof_hpctoolkit
from callpath.errors import CallpathError
from callpath.formats.hpcrun import read_hpcrun, read_hpctrace
from conftest import run_cli, shared_path
from prof_compare import by_path, matched_nodes, profile_by_ids, scoped_values

CASES = [("small.m", "small.d", []), ("small.m", "small.nostruct.d", ["--ignore-structs"]),
         ("loops-cputime-t.m", "loops-cputime-t.d", [])]


@pytest.fixture(scope="module")
def databases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for meas, db, opts in CASES:
        m = shared_path("hpctoolkit", "meas", meas)
        d = tmp_path_factory.mktemp("prof") / db
        run_cli("prof", str(m), "-o", str(d), *opts, check=True)
        out[db] = d
    return out


@pytest.mark.parametrize(("meas", "db", "opts"), CASES)
def test_same_tree_and_values_as_hpcprof(databases: dict[str, Path], meas: str, db: str,
                                         opts: list[str]) -> None:
    ours = callpath.open(databases[db])
    ref = callpath.open(shared_path("hpctoolkit", "dbase", db))
    ia, ib = matched_nodes(ours, ref)
    pa, pb = profile_by_ids(ours), profile_by_ids(ref)
    assert set(pa) == set(pb)
    assert [m.name for m in ours.metrics] == [m.name for m in ref.metrics]
    assert [s.name for s in ours.scopes] == [s.name for s in ref.scopes]
    for key in pa:
        for scope in ("function", "lex_aware", "execution"):
            va = scoped_values(ours, pa[key], scope)[ia]
            vb = scoped_values(ref, pb[key], scope)[ib]
            np.testing.assert_allclose(va, vb, rtol=1e-9, atol=0,
                                       err_msg=f"{db} profile {key} scope {scope}")
        # point values: hpcprof keeps them on hidden instruction contexts below each line;
        # ours sit on the line itself. Totals per execution context are equal.
        if pa[key] != 0:
            tot_a = np.asarray(ours.values[pa[key]].values)[
                ours.values[pa[key]].metric_ids == 0].sum()
            tot_b = np.asarray(ref.values[pb[key]].values)[
                ref.values[pb[key]].metric_ids == 0].sum()
            assert tot_a == pytest.approx(tot_b, rel=1e-12)


@pytest.mark.parametrize(("meas", "db", "opts"), CASES)
def test_traces_name_the_same_contexts(databases: dict[str, Path], meas: str, db: str,
                                       opts: list[str]) -> None:
    ours = callpath.open(databases[db])
    ref = callpath.open(shared_path("hpctoolkit", "dbase", db))
    assert ours.traces is not None and ref.traces is not None
    assert ours.traces.min_timestamp == ref.traces.min_timestamp
    assert ours.traces.max_timestamp == ref.traces.max_timestamp
    pa, pb = profile_by_ids(ours), profile_by_ids(ref)
    inv_a = {v: k for k, v in pa.items()}
    ref_lines = {inv: t for t in ref.traces.lines
                 for inv in [{v: k for k, v in pb.items()}[t.prof_index]]}
    path_a = {int(ours.cct.ctx_id[i]): p for p, i in by_path(ours).items()}
    path_b = {int(ref.cct.ctx_id[i]): p for p, i in by_path(ref).items()}
    for line in ours.traces.lines:
        other = ref_lines[inv_a[line.prof_index]]
        np.testing.assert_array_equal(line.timestamps, other.timestamps)
        assert [path_a[int(c)] for c in line.ctx_ids] == [path_b[int(c)] for c in other.ctx_ids]


def test_libhpcrun_structure_is_not_needed_here() -> None:
    """libhpcrun.so.hpcstruct is absent from the measurement directories; no frame of these
    runs lies in libhpcrun.so, so its absence changes nothing (the tree test above proves
    the equality; this pins the reason)."""
    for meas in ("small.m", "loops-cputime-t.m"):
        for f in sorted(shared_path("hpctoolkit", "meas", meas).glob("*.hpcrun")):
            prof = read_hpcrun(f)
            hpcrun_lm = [k for k, v in prof.modules.items() if v.endswith("/libhpcrun.so")]
            assert hpcrun_lm
            assert not np.isin(prof.node_lm, hpcrun_lm).any()


def test_user_errors_are_one_line(tmp_path: Path) -> None:
    r = run_cli("prof", str(tmp_path / "missing"), "-o", str(tmp_path / "db"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "missing" in r.stderr
    r = run_cli("prof", str(tmp_path), "-o", str(tmp_path / "db"))
    assert r.returncode == 2 and "neither measurement.json nor *.hpcrun" in r.stderr
    bad = tmp_path / "bad.m"
    bad.mkdir()
    (bad / "x.hpcrun").write_bytes(b"HPCRUN-profile____04.00b" + b"\0" * 50)
    r = run_cli("prof", str(bad), "-o", str(tmp_path / "db"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "x.hpcrun" in r.stderr


def _real(name: str) -> bytes:
    m = shared_path("hpctoolkit", "meas", "small.m")
    return next(m.glob(f"*.{name}")).read_bytes()


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_corrupt_profiles_raise_format_errors(tmp_path_factory: pytest.TempPathFactory,
                                              data: st.DataObject) -> None:
    raw = bytearray(_real("hpcrun"))
    cut = data.draw(st.integers(0, len(raw)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)),
                               max_size=4))
    for pos, val in flips:
        raw[pos] = val
    raw = raw[:cut] if data.draw(st.booleans()) else raw
    d = tmp_path_factory.mktemp("fuzz")
    (d / "t.hpcrun").write_bytes(bytes(raw))
    (d / "t.hpctrace").write_bytes(_real("hpctrace")[:data.draw(st.integers(0, 200))])
    for reader, name in ((read_hpcrun, "t.hpcrun"), (read_hpctrace, "t.hpctrace")):
        try:
            reader(d / name)
        except CallpathError as e:
            assert name in str(e)
    try:  # the whole attribution: a database or a one-line error, nothing else
        prof_hpctoolkit([d], [], workers=1)
    except CallpathError as e:
        assert "\n" not in str(e)
    shutil.rmtree(d)


def test_stats_partials(tmp_path: Path) -> None:
    """-M stats: count, sum of squares, min and max per context equal what the execution
    contexts' own values give."""
    from callpath.model import Combine

    db = tmp_path / "stats.d"
    run_cli("prof", str(shared_path("hpctoolkit", "meas", "loops-cputime-t.m")), "-M", "stats",
            "-o", str(db), check=True)
    exp = callpath.open(db)
    m = exp.metrics[0]
    ids = exp.cct.ctx_id.astype(np.int64)
    for scope in ("point", "function", "execution"):
        def stat(formula: str, combine: Combine, scope: str = scope) -> np.ndarray:
            sid, = [s.stat_metric_id for s in m.summaries if exp.scopes[s.scope].name == scope
                    and s.formula == formula and s.combine == combine]
            return exp.summary(sid)[ids]
        per = np.array([exp.values_in(p, m, scope) for p in range(1, len(exp.profiles))])
        np.testing.assert_allclose(stat("$$", Combine.SUM), per.sum(0), rtol=1e-12)
        np.testing.assert_array_equal(stat("1", Combine.SUM), (per != 0).sum(0))
        np.testing.assert_allclose(stat("$$^2", Combine.SUM), (per ** 2).sum(0), rtol=1e-12)
        np.testing.assert_array_equal(stat("$$", Combine.MIN), per.min(0))
        np.testing.assert_array_equal(stat("$$", Combine.MAX), per.max(0))


@pytest.mark.parametrize(("meas", "db", "opts"), CASES)
def test_metrics_yaml_as_hpcprof(databases: dict[str, Path], meas: str, db: str,
                                 opts: list[str]) -> None:
    """metrics/default.yaml (what hpcviewer reads: names, descriptions, variants) has
    hpcprof's roots, once YAML aliases are resolved."""
    import yaml

    ours = yaml.safe_load((databases[db] / "metrics" / "default.yaml").read_text())
    ref = yaml.safe_load((shared_path("hpctoolkit", "dbase", db) / "metrics" /
                          "default.yaml").read_text())
    assert ours["roots"] == ref["roots"]
