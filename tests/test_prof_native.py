"""End to end on a real C program: compiled with gcc, sampled by ``callpath run``, structure
recovered by ``callpath struct``, attributed by ``callpath prof``. Loops and inlined code must
appear at their source lines, and no sample may be lost in attribution."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import callpath
from callpath.formats import measdir
from callpath.model import NodeKind
from conftest import ROOT, perf_reason, run_cli
from prof_tree import find

SRC = ROOT / "tests" / "prof_programs" / "hotloop.c"


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    reason = perf_reason()
    if reason is not None:
        pytest.skip(f"perf_event sampling is not available here: {reason}")
    d = tmp_path_factory.mktemp("prof-native")
    exe = d / "hotloop"
    subprocess.run(["gcc", "-O2", "-g", "-o", str(exe), str(SRC)], check=True)
    meas = d / "hotloop.m"
    run_cli("run", "-t", "-o", str(meas), "--", str(exe), "30000", check=True)
    run_cli("struct", str(meas), check=True)
    db = d / "hotloop.d"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    return meas, db


def test_no_sample_lost(measured: tuple[Path, Path]) -> None:
    meas, db = measured
    m = measdir.read(meas)
    recorded = sum(int(t.samples.sum()) for _, t in m.threads)
    assert recorded > 50
    exp = callpath.open(db)
    assert exp.inclusive("cpu-clock (samples)")[0] == recorded
    ns = sum(float(t.values.sum()) for _, t in m.threads)
    assert exp.inclusive("cpu-clock (sec)")[0] == pytest.approx(ns * 1e-9, rel=1e-12)
    # the trace has one element per sample, each naming a context of the tree
    assert exp.traces is not None
    assert sum(len(t.timestamps) for t in exp.traces.lines) == recorded
    ids = set(exp.cct.ctx_id.tolist())
    assert all(int(c) in ids for t in exp.traces.lines for c in t.ctx_ids)


def test_loops_and_inlined_code_at_their_lines(measured: tuple[Path, Path]) -> None:
    _, db = measured
    exp = callpath.open(db)
    incl = exp.inclusive("cpu-clock (samples)")
    kernel = find(exp, NodeKind.FUNCTION, name="kernel")
    assert len(kernel) == 1
    k = kernel[0]
    assert incl[k] > 0.5 * incl[0]  # the program spends nearly all its time there
    outer = [n for n in find(exp, NodeKind.LOOP, line=12, within=k)
             if exp.cct.parent[n] == k]
    assert len(outer) == 1
    inner = find(exp, NodeKind.LOOP, line=13, within=outer[0])
    assert len(inner) == 1 and exp.cct.parent[inner[0]] == outer[0]
    assert incl[inner[0]] > 0.9 * incl[k]
    mix = find(exp, NodeKind.FUNCTION, name="mix", within=inner[0])
    assert mix, "the inlined helper is not below the inner loop"
    for x in mix:
        assert exp.cct.relation[x] == 2  # inlined call
        call_site = int(exp.cct.parent[x])
        assert exp.cct.kind[call_site] == NodeKind.LINE and exp.cct.line[call_site] == 14
        assert find(exp, NodeKind.LINE, line=7, within=x)
    other = find(exp, NodeKind.FUNCTION, name="other")
    assert all(find(exp, NodeKind.LOOP, line=22, within=o) for o in other if incl[o] > 2)
    main = find(exp, NodeKind.FUNCTION, name="main")
    assert main and all(np.isin(k, np.arange(m, exp.cct.subtree_end[m])) for m in main[:1])


def test_sources_copied(measured: tuple[Path, Path]) -> None:
    _, db = measured
    exp = callpath.open(db)
    copied = [f for f in exp.files if f.copied]
    assert any(f.path.endswith("hotloop.c") for f in copied)
    for f in copied:
        assert (db / f.path).is_file()


def test_without_structure_frames_are_addresses(measured: tuple[Path, Path],
                                                tmp_path: Path) -> None:
    meas, _ = measured
    db = tmp_path / "raw.d"
    run_cli("prof", str(meas), "--ignore-structs", "-o", str(db), check=True)
    exp = callpath.open(db)
    kinds = set(exp.cct.kind[2:].tolist())
    assert kinds == {int(NodeKind.INSTRUCTION)}
    m = measdir.read(meas)
    assert exp.inclusive("cpu-clock (samples)")[0] == sum(int(t.samples.sum())
                                                          for _, t in m.threads)


def test_without_structure_files_procedures_come_from_symbols(measured: tuple[Path, Path],
                                                              tmp_path: Path) -> None:
    """No structure for any module: frames are procedures from the symbol tables, each with
    the instruction that was sampled or called from."""
    meas, _ = measured
    bare = tmp_path / "bare.m"
    shutil.copytree(meas, bare, ignore=shutil.ignore_patterns("structs"))
    db = tmp_path / "bare.d"
    run_cli("prof", str(bare), "-o", str(db), "--no-struct-on-demand", check=True)
    exp = callpath.open(db)
    kernel = find(exp, NodeKind.FUNCTION, name="kernel")
    assert len(kernel) == 1
    kids = exp.cct.children(kernel[0])
    assert len(kids) and all(exp.cct.kind[c] == NodeKind.INSTRUCTION for c in kids)
    assert find(exp, NodeKind.FUNCTION, name="main")
    m = measdir.read(meas)
    assert exp.inclusive("cpu-clock (samples)")[0] == sum(int(t.samples.sum())
                                                          for _, t in m.threads)
