"""End to end on a real Python program: sampled by callpath's Python sampler, structure from
its ``ast`` (``callpath struct``), attributed by ``callpath prof``: Python functions, loops and
lines, and every recorded sample in the database."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import callpath
from callpath.formats import measdir
from callpath.model import NodeKind
from conftest import ROOT, run_cli
from prof_tree import find

SRC = ROOT / "tests" / "prof_programs" / "pyloops.py"


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("prof-python")
    meas = d / "py.m"
    subprocess.run([sys.executable, "-m", "callpath.measure.python", "-q", "-t", "-o",
                    str(meas), str(SRC), "3000"], check=True, capture_output=True,
                   env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    run_cli("struct", str(meas), check=True)
    db = d / "py.d"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    return meas, db


def _samples_metric(exp: callpath.model.Experiment) -> str:
    names = [m.name for m in exp.metrics if m.name.endswith("(samples)")]
    assert names
    return names[0]


def test_no_sample_lost(measured: tuple[Path, Path]) -> None:
    meas, db = measured
    m = measdir.read(meas)
    exp = callpath.open(db)
    for k, info in enumerate(m.metrics):
        recorded = sum(int(t.samples[:, k].sum()) for _, t in m.threads)
        assert recorded > 20
        assert exp.inclusive(f"{info.name} (samples)")[0] == recorded


def test_functions_loops_and_lines(measured: tuple[Path, Path]) -> None:
    _, db = measured
    exp = callpath.open(db)
    incl = exp.inclusive(_samples_metric(exp))
    work = find(exp, NodeKind.FUNCTION, name="work")
    assert len(work) == 1
    w = work[0]
    assert incl[w] > 0.8 * incl[0]
    outer = [n for n in find(exp, NodeKind.LOOP, line=11, within=w) if exp.cct.parent[n] == w]
    assert len(outer) == 1
    inner = find(exp, NodeKind.LOOP, line=12, within=outer[0])
    assert len(inner) == 1
    site = find(exp, NodeKind.LINE, line=13, within=inner[0])
    assert site and incl[site[0]] > 0.5 * incl[w]
    helper = find(exp, NodeKind.FUNCTION, name="helper", within=site[0])
    assert all(exp.cct.relation[h] == 1 for h in helper)  # a real call, not inlined
    caller = find(exp, NodeKind.FUNCTION, name="<module>")
    assert caller and w in range(caller[0], int(exp.cct.subtree_end[caller[0]]))
