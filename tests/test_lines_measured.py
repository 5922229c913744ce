"""The Lines views on a real measured run: an OpenMP program whose thread k does k+1 units of
work on one source line (tests/lines_programs/imbalance.c), compiled with gcc, sampled by
``callpath run``, structure by ``callpath struct``, attributed by ``callpath prof
--instructions``.

``mpirun -n 4`` runs the same binary with rank k doing k+1 units on line 52.

Sampling margins: cpu-clock samples every 1 ms of a thread's CPU time (the default period), so
a unit of work (~30 ms of CPU here) is ~30 samples and neighbouring threads differ by one
unit. A thread's count is its CPU time / 1 ms, off by at most a couple of samples from the
timer's phase and scheduling; the order thread 0 < ... < thread 3 on line 12 and heavy >
medium > light (4 : 2 : 1 units) would need an error of ~15 samples to flip: with the
observed spread (±2 samples over runs) that is far rarer than 1 in 10^4.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import callpath
from callpath.analysis import lines as L
from callpath.analysis.flat import FlatView
from callpath.analysis.nodes import ViewKind
from callpath.analysis.source import tree_source
from callpath.model import NodeKind
from conftest import ROOT, perf_reason, run_cli

SRC = ROOT / "tests" / "lines_programs" / "imbalance.c"
WORK_LINE = 12  # the line where thread k does k+1 units
THREADS = 4


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    reason = perf_reason()
    if reason is not None:
        pytest.skip(f"perf_event sampling is not available here: {reason}")
    d = tmp_path_factory.mktemp("lines-measured")
    exe = d / "imbalance"
    cc = subprocess.run(["gcc", "-O1", "-g", "-fopenmp", "-o", str(exe), str(SRC)],
                        capture_output=True, text=True, check=False)
    if cc.returncode != 0:
        pytest.skip(f"gcc cannot build an OpenMP program here: {cc.stderr.strip()[:200]}")
    meas = d / "imbalance.m"
    env = {"OMP_NUM_THREADS": str(THREADS), "OMP_WAIT_POLICY": "passive"}
    run_cli("run", "-o", str(meas), "--", str(exe), "30000000", check=True, env=env)
    # the program's structure only (libc's and libgomp's would take most of the test's time;
    # their frames get procedures from their symbols)
    (meas / "structs").mkdir(exist_ok=True)
    run_cli("struct", str(exe), "-o", str(meas / "structs" / "imbalance.hpcstruct"),
            check=True)
    db = d / "imbalance.d"
    run_cli("prof", "--instructions", str(meas), "-o", str(db), check=True)
    return db


def test_imbalanced_line_min_first_max_last(measured: Path) -> None:
    exp = callpath.open(measured)
    m = L.build_line_matrix(exp, 0)
    assert m.labels == [f"THREAD {k}" for k in range(THREADS)] or len(m.labels) == THREADS
    row = L.row_of(m, "imbalance.c", WORK_LINE)
    st = L.line_stats(m, [row])
    assert int(st["min_context"][0]) == 0
    assert int(st["max_context"][0]) == THREADS - 1
    v = L.window(m, row, 1)[0]
    assert np.all(np.diff(v) > 0), v  # k+1 units: increasing with the thread
    # the JSON of the command says the same, with the contexts' labels
    p = run_cli("lines", str(measured), "-f", "json", "--file", "imbalance.c", "--from",
                str(WORK_LINE), "--to", str(WORK_LINE), check=True)
    doc = json.loads(p.stdout)
    (line,) = doc["lines"]
    assert line["min_context"] == doc["contexts"][0]
    assert line["max_context"] == doc["contexts"][-1]


def test_figure5_ranked_procedures_of_a_real_run(measured: Path) -> None:
    """Figure 5's table: the OpenMP region (10 units) first, then heavy (4), medium (2) and
    light (1); sums equal the Flat view's procedure exclusive costs of their lines."""
    exp = callpath.open(measured)
    m = L.build_line_matrix(exp, 0)
    top = L.ranked_procedures(m, 4)
    names = [t["procedure"] for t in top]
    assert names[0].startswith("imbalance")  # imbalance._omp_fn.0, the outlined region
    assert names[1:] == ["heavy", "medium", "light"]
    flat = FlatView(tree_source(exp))
    excl = flat.exclusive(0)
    nodes = flat.nodes
    for t in top[1:]:
        (p,) = [k for k in np.nonzero(nodes.kind == ViewKind.PROCEDURE)[0].tolist()
                if exp.functions[int(nodes.function[k])].name == t["procedure"]]
        assert t["sum"] == pytest.approx(float(excl[p]))
    assert sum(t["percent"] for t in L.ranked_procedures(m, 100)) == pytest.approx(100.0)
    p = run_cli("lines", str(measured), "--ranked", "4", check=True)
    out = p.stdout.splitlines()
    assert out[0].split() == ["rank", "procedure", "name", "filename", "sum", "percent"]
    assert [r.split()[1] for r in out[2:5]] == ["heavy", "medium", "light"]
    assert all(r.split()[2] == "imbalance.c" for r in out[1:5])


def test_instructions_of_the_line_with_costs(measured: Path) -> None:
    """prof --instructions keeps the sampled PCs under their line; the assembler listing of
    the line disassembles the binary and its per-instruction costs add up to the line's."""
    exp = callpath.open(measured)
    cct = exp.cct
    ins = np.nonzero(cct.kind == NodeKind.INSTRUCTION)[0]
    ins = ins[cct.kind[cct.parent[ins]] == NodeKind.LINE]
    # the program's sampled instructions sit under its lines; code of another module there
    # is a callee frame without a procedure (ld.so's lazy binder has no symbol: a sample
    # in it, reached by the first call through a PLT slot, is such a frame)
    own = np.array([Path(exp.modules[int(k)].path).name == "imbalance" for k in cct.module[ins]],
                   dtype=bool)
    assert own.sum() > 0
    ins = ins[own]
    m = L.build_line_matrix(exp, 0)
    row = L.row_of(m, "imbalance.c", WORK_LINE)
    listing = L.line_instructions(exp, "imbalance.c", WORK_LINE, 0)
    assert listing.reason is None, listing.reason
    assert listing and all(i["line"] == WORK_LINE for i in listing)
    assert any(i["text"].startswith(("mulsd", "addsd")) for i in listing)
    total = sum(i["cost"] for i in listing)
    assert total == pytest.approx(float(m.row_sum[row]))
    # lines around it: a wider listing that still holds the line's instructions
    wide = L.line_instructions(exp, "imbalance.c", WORK_LINE, 2)
    assert {i["address"] for i in listing} <= {i["address"] for i in wide}
    # the binary moved away: no instructions, and a reason naming it
    exe = Path(exp.modules[int(cct.module[ins[0]])].path)
    moved = exe.with_suffix(".moved")
    exe.rename(moved)
    try:
        gone = L.line_instructions(exp, "imbalance.c", WORK_LINE, 0)
        assert not gone and gone.reason and str(exe) in gone.reason
    finally:
        moved.rename(exe)


def test_tree_scopes_map_to_their_lines(measured: Path) -> None:
    """rows_of_node: a line scope of the tree is its own row; a procedure frame covers the
    rows of its lines (the Lines tab at the place of a tree scope)."""
    exp = callpath.open(measured)
    cct = exp.cct
    m = L.build_line_matrix(exp, 0)
    row = L.row_of(m, "imbalance.c", 19)
    (ln,) = [k for k in np.nonzero((cct.kind == NodeKind.LINE) & (cct.line == 19))[0].tolist()
             if exp.files[int(cct.file[k])].path.endswith("imbalance.c")]
    assert L.rows_of_node(exp, m, ln).tolist() == [row]
    (fr,) = [k for k in np.nonzero(cct.kind == NodeKind.FUNCTION)[0].tolist()
             if exp.functions[int(cct.function[k])].name == "heavy"]
    rows = L.rows_of_node(exp, m, fr)
    assert row in rows.tolist()
    assert L.procedure_at(m, row)["procedure"] == "heavy"  # type: ignore[index]


def test_mpi_ranks_min_first_max_last(tmp_path: Path) -> None:
    """The same under ``mpirun -n 4``: rank k does k+1 units on line 52 (the launcher's
    PMI_RANK); its minimum is in the first rank and its maximum in the last, per context and
    with the threads of each rank summed."""
    import sys

    import mpi_launch

    launcher = mpi_launch.mpirun()
    if launcher is None:
        pytest.skip("no mpirun (pip install 'callpath[mpi]' brings MPICH's)")
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    reason = perf_reason()
    if reason is not None:
        pytest.skip(f"perf_event sampling is not available here: {reason}")
    exe = tmp_path / "imbalance"
    subprocess.run(["gcc", "-O1", "-g", "-fopenmp", "-o", str(exe), str(SRC)], check=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1",
               PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe")
    cmd = [launcher, "-n", "4"]
    if os.geteuid() == 0 and mpi_launch.is_open_mpi(launcher):
        cmd.append("--allow-run-as-root")
    meas = tmp_path / "mpi.m"
    proc = subprocess.run([sys.executable, "-m", "callpath", "run", "-o", str(meas), "--",
                           *cmd, str(exe), "30000000", "rank"], capture_output=True,
                          text=True, env=env, timeout=180, check=False)
    if proc.returncode != 0 and "not enough slots" in proc.stdout + proc.stderr:
        pytest.skip("mpirun refuses 4 processes on this machine")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (meas / "structs").mkdir(exist_ok=True)
    run_cli("struct", str(exe), "-o", str(meas / "structs" / "imbalance.hpcstruct"),
            check=True)
    db = tmp_path / "mpi.d"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    exp = callpath.open(db)
    for group in ("none", "rank"):
        m = L.build_line_matrix(exp, 0, group)
        assert len(m.labels) == 4, m.labels
        row = L.row_of(m, "imbalance.c", 52)
        st = L.line_stats(m, [row])
        assert (int(st["min_context"][0]), int(st["max_context"][0])) == (0, 3)
        assert np.all(np.diff(L.window(m, row, 1)[0]) > 0)
    m = L.build_line_matrix(exp, 0, "node")
    assert len(m.labels) == 1  # one node: every rank summed


def test_a_callee_frame_under_the_line_is_not_its_code(measured: Path) -> None:
    """A frame without a procedure reached by a call from the line (ld.so's lazy binder,
    libgomp's code without symbols: one CI run had one under line 12) is another module's
    code: the line's listing is the program's instructions, with no complaint about the
    callee's module (which has no line table). The measured tree, with such a frame added
    below a line-12 scope, pointing into a real library without debug information."""
    import dataclasses

    from callpath.model import CCT, LoadModule, Relation

    exp = callpath.open(measured)
    c = exp.cct
    want = L.line_instructions(exp, "imbalance.c", WORK_LINE, 0)
    assert want and want.reason is None
    libs = [p for p in ("/lib/x86_64-linux-gnu/libgomp.so.1", "/lib/x86_64-linux-gnu/libc.so.6")
            if Path(p).is_file()]
    if not libs:
        pytest.skip("no system library to stand for the callee's module")
    at = int(np.flatnonzero((c.kind == NodeKind.LINE) & (c.line == WORK_LINE))[0]) + 1
    cols = {k: np.insert(np.asarray(getattr(c, k)), at, v) for k, v in (
        ("kind", int(NodeKind.INSTRUCTION)), ("relation", int(Relation.CALL)),
        ("function", -1), ("file", -1), ("line", 0), ("module", len(exp.modules)),
        ("offset", 0x1000), ("ctx_id", exp.n_ctx_slots))}
    parent = np.insert(np.where(c.parent >= at, c.parent + 1, c.parent), at, at - 1)
    cct = CCT.from_columns(parent, cols["kind"], ctx_id=cols["ctx_id"],
                           relation=cols["relation"], function=cols["function"],
                           file=cols["file"], line=cols["line"], module=cols["module"],
                           offset=cols["offset"])
    bigger = dataclasses.replace(exp, cct=cct, modules=[*exp.modules, LoadModule(libs[0])],
                                 n_ctx_slots=exp.n_ctx_slots + 1, _summary_cache={},
                                 _node_of_ctx=None)
    got = L.line_instructions(bigger, "imbalance.c", WORK_LINE, 0)
    assert got.reason is None, got.reason
    assert [(i["address"], i["text"]) for i in got] == [(i["address"], i["text"]) for i in want]
