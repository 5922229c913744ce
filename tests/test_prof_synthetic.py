"""Attribution of measurement directories written with the format's own writer: random trees
(property: every sample recorded is in the database, at the context of its frames), and the
one-line errors for inconsistent files."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from callpath.attribute.prof_measdir import prof_measdir
from callpath.formats import measdir as md
from callpath.model import Identifier, IdKind, NodeKind
from conftest import ROOT, run_cli

PY = str(ROOT / "tests" / "prof_programs" / "pyloops.py")
METRIC = md.MetricInfo("cpu-clock", "ns", 1_000_000, event="cpu-clock")


def _write(d: Path, trees: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
           modules: list[md.Module]) -> int:
    md.write_header(d, [METRIC], command=["synthetic"], status="complete")
    total = 0
    with md.ProcessWriter(d, 4242) as w:
        w.process(pid=4242, ppid=1, generation=0, exe="synthetic", rank=None)
        w.metrics([METRIC])
        w.modules(modules)
        w.pycode([md.PyCode(PY, "work", 9), md.PyCode(PY, "helper", 5)])
        for t, (parent, kind, module, address) in enumerate(trees):
            w.thread(t, tid=100 + t, ids=(Identifier(IdKind.THREAD, t),), index=t)
            w.nodes(t, md.make_nodes(parent, kind, module, address, 1))
            leaves = np.arange(1, len(parent))
            samples = (leaves % 3 + 1).astype(np.uint64)
            counts = np.zeros(len(leaves), dtype=md.COUNT_DTYPE)
            counts["node"] = leaves
            counts["samples"] = samples
            counts["value"] = samples * 1e6
            w.counts(t, counts)
            total += int(samples.sum())
    return total


@st.composite
def trees(draw: st.DrawFn) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    out = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(2, 40))
        parent = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
        kind = [int(md.NodeKind.ROOT)] + [draw(st.sampled_from(
            [int(md.NodeKind.NATIVE), int(md.NodeKind.PYTHON), int(md.NodeKind.PARTIAL),
             int(md.NodeKind.UNKNOWN)])) for _ in range(1, n)]
        module = [-1] + [0 if k == md.NodeKind.NATIVE else draw(st.integers(0, 1))
                         if k == md.NodeKind.PYTHON else -1 for k in kind[1:]]
        address = [0] + [draw(st.integers(1, 40)) for _ in range(1, n)]
        out.append(tuple(np.asarray(x) for x in (parent, kind, module, address)))
    return out  # type: ignore[return-value]


@settings(max_examples=25, deadline=None)
@given(trees())
def test_random_trees_keep_every_sample(ts: list[tuple[np.ndarray, ...]]) -> None:
    d = Path(tempfile.mkdtemp(prefix="prof-synth-"))
    try:
        total = _write(d, ts, [md.Module(0, "/nonexistent/libfake.so", 0x1000, 0x2000)])
        for j in (1, 2):
            exp = prof_measdir([d], [], workers=j)
            assert exp is not None
            assert exp.inclusive("cpu-clock (samples)")[0] == total
            assert abs(exp.inclusive("cpu-clock (sec)")[0] - total * 1e-3) <= 1e-12 * total
            # every thread is an execution context; every leaf context is a line/instruction
            assert len(exp.contexts) == len(ts)
            kinds = set(exp.cct.kind.tolist())
            assert kinds <= {int(k) for k in NodeKind}
    finally:
        shutil.rmtree(d)


def test_inconsistent_files_are_one_line_errors(tmp_path: Path) -> None:
    parent = np.array([-1, 0, 1])
    kind = np.array([0, int(md.NodeKind.NATIVE), int(md.NodeKind.NATIVE)])
    bad_module = (parent, kind, np.array([-1, 0, 7]), np.array([0, 5, 6]))
    d = tmp_path / "m1"
    _write(d, [bad_module], [md.Module(0, "/nonexistent/libfake.so", 0x1000, 0x2000)])
    r = run_cli("prof", str(d), "-o", str(tmp_path / "db"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "module 7" in r.stderr
    r = run_cli("prof", str(d), "-j", "0", "-o", str(tmp_path / "db"))
    assert r.returncode == 2 and "-j 0" in r.stderr
