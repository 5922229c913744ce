"""``callpath prof`` of HPCToolkit's GPU measurements (``hpcrun -e gpu=nvidia -t``, ...)
reproduces the databases hpcprof wrote from them: the same tree with hpcprof's placeholders
(``<gpu kernel>`` under the launching call, the kernel's function and lines from the GPU
binary's structure file), every measured GPU metric with its name, description and
inclusive/exclusive values at every context of every execution context (the CPU thread and
the GPU stream, GPUCONTEXT/GPUSTREAM identifier tuples), and the trace lines.

The oracle is ``../shared/data/hpctoolkit`` (``loops-cuda-nvidia-t``). HPCToolkit's other GPU
test measurements (AMD, NVIDIA PC sampling, ``--ignore-structs``) are compared too where
they are there or under ``$CALLPATH_HPCTOOLKIT_TESTDATA`` (the ``tests/data`` folder of a
clone of HPCToolkit/hpctoolkit; not in the shared data so far: their structure files of
libcuda and libcupti are several MB)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

import callpath
from callpath.attribute.hpctk import prof_hpctoolkit
from callpath.model import Experiment
from conftest import run_cli, shared_path
from prof_compare import by_path, hpctk_data, matched_nodes, profile_by_ids, scoped_values

#: not a prof option: the GPU binaries' structure files of the measurement are replaced by
#: ``callpath struct``'s of the same binaries (hpcstruct's are the oracle's input)
OURS = "callpath-struct"
SHARED = [("loops-cuda-nvidia-t.m", "loops-cuda-nvidia-t.d", ()),
          ("loops-cuda-nvidia-t.m", "loops-cuda-nvidia-t.d", (OURS,))]
NOSTRUCT = ("--ignore-structs",)
EXTERNAL = [("loops-cuda-nvidia-t.m", "loops-cuda-nvidia-t.nostruct.d", NOSTRUCT),
            ("loops-hip-amd-t.m", "loops-hip-amd-t.d", ()),
            ("loops-hip-amd-t.m", "loops-hip-amd-t.nostruct.d", NOSTRUCT),
            # PC sampling: instruction samples hpcrun did not unwind
            ("loops-cuda-nvidiapc-t.m", "loops-cuda-nvidiapc-t.d", ()),
            ("loops-cuda-nvidiapc-t.m", "loops-cuda-nvidiapc-t.nostruct.d", NOSTRUCT),
            ("recursion-cuda-nvidiapc-t.m", "recursion-cuda-nvidiapc-t.nostruct.d", NOSTRUCT),
            # device functions called from several places, recursion: hpcprof's
            # reconstruction of calling contexts inside the kernel
            ("recursion-cuda-nvidiapc-t.m", "recursion-cuda-nvidiapc-t.d", ()),
            # the same with callpath's structure of the GPU binaries: functions, lines,
            # inlined code, loops and call sites as hpcstruct --gpucfg yes finds them
            ("loops-cuda-nvidiapc-t.m", "loops-cuda-nvidiapc-t.d", (OURS,)),
            ("recursion-cuda-nvidiapc-t.m", "recursion-cuda-nvidiapc-t.d", (OURS,))]
CASES = [*SHARED, *EXTERNAL]


_built: dict[str, Path] = {}


@pytest.fixture(scope="module")
def outdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prof-gpu")


def _key(db: str, opts: tuple[str, ...]) -> str:
    return db + "+ours" if OURS in opts else db


def _with_our_structs(outdir: Path, meas: Path) -> Path:
    """A copy of a measurement whose GPU binaries' structure files are callpath struct's.
    PC samples fall inside kernels, where loops and call sites matter: those need nvdisasm
    (skipped without it); kernel entries alone do not."""
    import shutil

    from callpath.structure.cubin import find_nvdisasm

    if "nvidiapc" in meas.name and find_nvdisasm() is None:
        pytest.skip("nvdisasm is not installed: the GPU binaries' loops and call sites, "
                    "which PC samples need, cannot be recovered")
    copy = outdir / f"{meas.name}-ours"
    if not copy.exists():
        shutil.copytree(meas, copy)
        for gpubin in sorted((copy / "gpubins").glob("*.gpubin")):
            for old in (copy / "structs").glob(f"{gpubin.name}-*.hpcstruct"):
                old.unlink()
            run_cli("struct", str(gpubin), "--no-cache", "-o",
                    str(copy / "structs" / f"{gpubin.name}-gpucfg-yes.hpcstruct"), check=True)
    return copy


def pair(outdir: Path, meas: str, db: str, opts: tuple[str, ...]
         ) -> tuple[Experiment, Experiment]:
    """Our database (written by ``callpath prof``, once per case) and hpcprof's."""
    ref = hpctk_data("dbase", db)
    key = _key(db, opts)
    if key not in _built:
        out = outdir / key
        m = hpctk_data("meas", meas)
        if OURS in opts:
            m = _with_our_structs(outdir, m)
        run_cli("prof", str(m), "-o", str(out), *[o for o in opts if o != OURS], check=True)
        _built[key] = out
    return callpath.open(_built[key]), callpath.open(ref)


def yaml_roots(db: Path) -> list[dict[str, object]]:
    """The metric roots of hpcprof's ``metrics/default.yaml``, in its order (hpcrun's)."""
    doc = yaml.safe_load((db / "metrics" / "default.yaml").read_text())
    return list(doc["roots"])


@pytest.mark.parametrize(("meas", "db", "opts"), CASES)
def test_same_tree_metrics_and_values(outdir: Path, meas: str, db: str,
                                      opts: tuple[str, ...]) -> None:
    ours, ref = pair(outdir, meas, db, opts)
    ia, ib = matched_nodes(ours, ref)
    # hpcprof lists meta.db's metrics in no particular order; ours are in hpcrun's order,
    # which is also the order of hpcprof's metrics/default.yaml
    # (hpcrun's invisible accumulators are not among the roots)
    names = [m.name for m in ours.metrics]
    assert sorted(names) == sorted(m.name for m in ref.metrics)
    roots = [r["name"] for r in yaml_roots(hpctk_data("dbase", db))]
    assert [n for n in names if n in roots] == [n for n in roots if n in names]
    assert [s.name for s in ours.scopes] == [s.name for s in ref.scopes]
    pa, pb = profile_by_ids(ours), profile_by_ids(ref)
    assert set(pa) == set(pb)
    ref_index = {m.name: k for k, m in enumerate(ref.metrics)}
    for k, m in enumerate(ours.metrics):
        for key in pa:
            for scope in ("function", "lex_aware", "execution"):
                va = scoped_values(ours, pa[key], scope, k)[ia]
                vb = scoped_values(ref, pb[key], scope, ref_index[m.name])[ib]
                np.testing.assert_allclose(va, vb, rtol=1e-9, atol=0,
                                           err_msg=f"{db} {m.name} profile {key} {scope}")


def point_id(exp: Experiment, metric: int) -> int:
    """The metric id of a metric's ``point`` scope in the per-context blocks."""
    m = exp.metrics[metric]
    ids = [s.prop_metric_id for s in m.scope_insts if exp.scopes[s.scope].name == "point"]
    assert len(ids) == 1
    return ids[0]


@pytest.mark.parametrize(("meas", "db", "opts"), CASES)
def test_point_totals_per_context(outdir: Path, meas: str, db: str, opts: tuple[str, ...],
                                  ) -> None:
    """``point`` values: hpcprof keeps them on instruction contexts that meta.db does not
    list, callpath on the context itself; the total of each metric in each execution
    context is the same."""
    ours, ref = pair(outdir, meas, db, opts)
    pa, pb = profile_by_ids(ours), profile_by_ids(ref)
    ref_index = {m.name: k for k, m in enumerate(ref.metrics)}
    for key in pa:
        for k, m in enumerate(ours.metrics):
            pid_a = point_id(ours, k)
            pid_b = point_id(ref, ref_index[m.name])
            blk_a, blk_b = ours.values[pa[key]], ref.values[pb[key]]
            tot_a = np.asarray(blk_a.values)[blk_a.metric_ids == pid_a].sum()
            tot_b = np.asarray(blk_b.values)[blk_b.metric_ids == pid_b].sum()
            assert tot_a == pytest.approx(tot_b, rel=1e-12), (db, key, m.name)


@pytest.mark.parametrize(("meas", "db", "opts"), CASES)
def test_trace_lines(outdir: Path, meas: str, db: str, opts: tuple[str, ...],
                     ) -> None:
    """Every trace line (the GPU stream's: one interval per kernel, and the idle gaps
    between) has hpcprof's timestamps and contexts."""
    ours, ref = pair(outdir, meas, db, opts)
    assert ours.traces is not None and ref.traces is not None
    assert ours.traces.min_timestamp == ref.traces.min_timestamp
    assert ours.traces.max_timestamp == ref.traces.max_timestamp
    pa, pb = profile_by_ids(ours), profile_by_ids(ref)
    key_a = {v: k for k, v in pa.items()}
    key_b = {v: k for k, v in pb.items()}
    lines_b = {key_b[t.prof_index]: t for t in ref.traces.lines}
    assert sorted(key_a[t.prof_index] for t in ours.traces.lines) == sorted(lines_b)
    path_a = {int(ours.cct.ctx_id[i]): p for p, i in by_path(ours).items()}
    path_b = {int(ref.cct.ctx_id[i]): p for p, i in by_path(ref).items()}
    for line in ours.traces.lines:
        other = lines_b[key_a[line.prof_index]]
        np.testing.assert_array_equal(line.timestamps, other.timestamps)
        assert [path_a.get(int(c)) for c in line.ctx_ids] == \
            [path_b.get(int(c)) for c in other.ctx_ids]


@pytest.mark.parametrize(("meas", "db", "opts"), CASES)
def test_metrics_yaml_as_hpcprof(outdir: Path, meas: str, db: str, opts: tuple[str, ...]
                                 ) -> None:
    """metrics/default.yaml, which hpcviewer reads: every root (descriptions, hidden
    metrics, the kernel properties as formulas such as ``GKER:OCC_THR``, GSAMP:UTIL's
    min/max) equal to hpcprof's once the YAML aliases are resolved."""
    pair(outdir, meas, db, opts)
    ours = yaml_roots(_built[_key(db, opts)])
    ref = yaml_roots(hpctk_data("dbase", db))
    assert [r["name"] for r in ours] == [r["name"] for r in ref]
    for a, b in zip(ours, ref, strict=True):
        assert a == b


def test_descriptions_and_visibility_as_hpcprof(outdir: Path) -> None:
    """Descriptions of the measured metrics are hpcrun's, as hpcprof's metrics/default.yaml
    gives them; kernel properties defined by a formula (``GKER:OCC_THR``, ...) are not
    metrics of meta.db."""
    exp = prof_hpctoolkit([shared_path("hpctoolkit", "meas", "loops-cuda-nvidia-t.m")], [])
    assert exp is not None
    roots = {str(r["name"]): r
             for r in yaml_roots(shared_path("hpctoolkit", "dbase", "loops-cuda-nvidia-t.d"))}
    for m in exp.metrics:  # (hpcrun's invisible accumulators are not among the roots)
        if m.name in roots:
            assert m.description == roots[m.name]["description"], m.name
    assert sum(m.name in roots for m in exp.metrics) == 44
    assert "GKER:OCC_THR" in roots and all(m.name != "GKER:OCC_THR" for m in exp.metrics)


def test_gpu_stream_is_an_execution_context(outdir: Path) -> None:
    """The GPU stream's identifier tuple (NODE, GPUCONTEXT, GPUSTREAM) and its name as
    ``report --contexts`` lists it."""
    ours, _ = pair(outdir, *SHARED[0])
    kinds = {tuple(x.kind for x in p.ids) for p in ours.profiles[1:]}
    assert kinds == {(1, 3), (1, 5, 6)}
    r = run_cli("report", str(_built[SHARED[0][1]]), "--contexts", check=True)
    assert "GPUSTREAM" in r.stdout and "GPUCONTEXT" in r.stdout


def test_trace_view_shows_the_gpu_stream(outdir: Path) -> None:
    """The viewer's trace view of the database: a row for the GPU stream beside the CPU
    thread's, the kernel's frames down to ``<gpu kernel>`` → ``kernmain()``, and the idle
    gaps between the 100 launches (hpcrun's ``NoActvty`` samples) as no frame."""
    from callpath.engine.database import open_databases
    from callpath.view import traces_api as traces

    pair(outdir, *SHARED[0])
    db, = open_databases([str(_built[SHARED[0][1]])], warm=False)
    meta = traces.meta(db, {}, b"")
    # the viewer names a GPU stream readably: GPUCONTEXT 1 GPUSTREAM 7 is its stream 7
    assert meta["contexts"] == ["THREAD 0", "GPU stream 7 (context 1)"]  # one node: left out
    ti = traces.trace_index(db)
    depth = meta["max_depth"]
    frame = traces.frame(db, {"width": "8", "height": "2", "depth": str(depth)}, b"")
    assert frame["procedures"] == ["kernmain()"]
    assert traces.frame(db, {"width": "8", "height": "2", "depth": str(depth - 1)},
                        b"")["procedures"] == ["<gpu kernel>"]
    # 8000 pixels over 31 ms: 4 µs each, finer than the gaps between kernels
    grid, rows = traces.frame_grid(ti, traces._window(ti, {}), 8000, 2, depth)
    assert list(rows) == [0, 1] and (grid[0] < 0).all()
    kernel = grid[1] >= 0
    starts = np.count_nonzero(kernel[1:] & ~kernel[:-1]) + int(kernel[0])
    assert starts == 100


def test_viewer_top_down_reaches_the_kernel(outdir: Path) -> None:
    """The viewer's Top-down pages (HTTP API) of the database, expanded along the hot
    path: the launch's call site, ``<gpu kernel>``, then ``kernmain()`` with all of
    ``GKER (sec)`` exclusive to it."""
    from view_support import get_json, serve

    ours, _ = pair(outdir, *SHARED[0])
    gker = [m.name for m in ours.metrics].index("GKER (sec)")
    total = float(ours.summary(ours.metrics[gker].stat_id(ours.scopes, "execution") or 0)[0])
    assert total > 0
    names = []
    with serve([_built[SHARED[0][1]]]) as s:
        page = get_json(s.url, "/api/db/0/children")
        while page["rows"]:
            hot = max(page["rows"], key=lambda r: r["values"][f"m{gker}i"])
            names.append(hot["name"])
            if not hot["has_children"]:
                break
            page = get_json(s.url, "/api/db/0/children", node=hot["key"])
            if hot["name"] == "kernmain()":
                assert hot["values"][f"m{gker}e"] == pytest.approx(total, rel=1e-12)
    assert names[-5:-1] == ["cudaLaunchKernel", "[testmeas-loops-cuda]:0", "<gpu kernel>",
                           "kernmain()"]


@pytest.mark.parametrize("which", ["ours", "hpcprof"])
def test_reader_takes_descriptions_from_the_taxonomy(outdir: Path, which: str) -> None:
    """meta.db has no metric descriptions; reading a database takes them from its
    metrics/default.yaml (hpcprof's or ours), so the viewer's column tooltips say what
    ``GKER (sec)`` is. The invisible accumulators have none there, hence none here."""
    ours, ref = pair(outdir, *SHARED[0])
    exp = ours if which == "ours" else ref
    roots = {str(r["name"]): r["description"] for r in yaml_roots(
        _built[SHARED[0][1]] if which == "ours"
        else shared_path("hpctoolkit", "dbase", SHARED[0][1]))}
    for m in exp.metrics:
        assert m.description == roots.get(m.name, ""), m.name
    assert {m.name: m.description for m in exp.metrics}["GKER (sec)"] == \
        "GPU time: kernel execution (seconds)"


def test_parallel_reduction_gives_the_same_database(tmp_path: Path) -> None:
    """``-j 2`` splits the two profiles (CPU thread, GPU stream) between two processes;
    the placeholders' tags and the metric table survive the merge: identical files."""
    meas = shared_path("hpctoolkit", "meas", "loops-cuda-nvidia-t.m")
    for j in ("1", "2"):
        run_cli("prof", "-j", j, str(meas), "-o", str(tmp_path / j), check=True)
    for f in ("meta.db", "profile.db", "cct.db", "trace.db", "metrics/default.yaml"):
        assert (tmp_path / "1" / f).read_bytes() == (tmp_path / "2" / f).read_bytes(), f


def test_procedure_names_survive_the_structure_cache(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """hpcstruct's naming (``cudaLaunchKernel``, not ``cudaLaunchKernel [exe]``) comes
    back from the parse cache too: a second ``prof`` reading the cached structure names
    the procedure as the first."""
    from callpath.formats import hpcstruct

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(hpcstruct, "CACHE_MIN_BYTES", 0)
    meas = shared_path("hpctoolkit", "meas", "loops-cuda-nvidia-t.m")
    for _ in range(2):
        exp = prof_hpctoolkit([meas], [])
        assert exp is not None
        names = {f.name for f in exp.functions}
        assert "cudaLaunchKernel" in names and "cudaLaunchKernel [testmeas-loops-cuda]" \
            not in names
    assert any((tmp_path / "xdg").rglob("*.npz"))


def _evaluate(tree: object, values: list[float]) -> float:
    """A parsed formula's value (the tree of callpath.attribute.hpcrun_yaml)."""
    if isinstance(tree, float):
        return tree
    assert isinstance(tree, tuple)
    op, args = tree
    if op == "#":
        return values[args]
    a = [_evaluate(x, values) for x in args]
    ops = {"+": lambda: a[0] + a[1], "-": lambda: a[0] - a[1], "*": lambda: a[0] * a[1],
           "/": lambda: a[0] / a[1], "^": lambda: a[0] ** a[1], "neg": lambda: -a[0],
           "min": lambda: min(a), "max": lambda: max(a), "sqrt": lambda: math.sqrt(a[0])}
    return float(ops[op]())


@pytest.mark.parametrize("formula", [
    "#43/#61", "100*(#46/#47)", "min(100, max(0, 100*#27/#26))", "(#5/#5) + (#6/#5)",
    "#1-#2-#3", "#1/#2/#3", "2^3^2", "-#1*#2", "#1 - -#2", "sqrt(#1) + max(#1, #2, #3)*2"])
def test_hpcrun_formulas_parse_with_the_usual_precedence(formula: str) -> None:
    """hpcrun's formula syntax (the first four are real descriptors of HPCToolkit's GPU
    measurements) parses to a tree that computes what Python computes for the same text."""
    from callpath.attribute.hpcrun_yaml import parse_formula

    values = [1.0 + 0.37 * k for k in range(64)]
    py = formula.replace("^", "**")
    py = re.sub(r"#(\d+)", lambda m: f"values[{m.group(1)}]", py)
    expected = eval(py, {"values": values, "min": min, "max": max, "sqrt": math.sqrt})
    assert _evaluate(parse_formula(formula), values) == pytest.approx(expected, rel=1e-12)
