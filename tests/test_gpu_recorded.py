"""``callpath prof`` of measurements that ``callpath run -e gpu=nvidia -t`` recorded on an H100
(tests/gpu_data; made by tests/gpu_programs/device_check.sh):

- ``torch-h100.tgz``: ``tests/gpu_programs/train.py`` (60 steps of a 3-layer MLP): the Python
  sampler's process file and the GPU companion, whose main-thread launches carry Python frames
  (read without the GIL, which PyTorch releases around launches) and whose autograd-thread
  launches carry native frames (of PyTorch libraries absent here: they stay addresses);
- ``cuda-h100.tgz``: ``tests/gpu_programs/streams.cu`` (two kernels on two streams, copies,
  memsets, synchronizations), native frames only.

Every expected value is computed here from the companion file's own records; the database
must agree with them.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import callpath
from callpath.formats import measdir as md
from callpath.formats import measdir_gpu as mdg
from callpath.model import gpu_names as gpu
from callpath.model.contexts import IdKind
from callpath.structure.demangle import demangle
from conftest import run_cli

DATA = Path(__file__).with_name("gpu_data")


def _unpack(name: str, into: Path) -> Path:
    with tarfile.open(DATA / name) as t:
        t.extractall(into, filter="data")
    return into / next(p.name for p in into.iterdir())


@pytest.fixture(scope="module")
def torch_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    d = tmp_path_factory.mktemp("torch")
    meas = _unpack("torch-h100.tgz", d)
    db = d / "db"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    return meas, callpath.open(db)


def _companion(meas: Path) -> mdg.GpuFile:
    (path,) = sorted(meas.glob(mdg.GPU_GLOB))
    return mdg.read(path)


def _dur(ops: Any) -> float:
    return float((ops["end"].astype(np.int64) - ops["start"].astype(np.int64)).sum()) * 1e-9


def _fn(exp: Any, n: int) -> str:
    f = int(exp.cct.function[n])
    return exp.functions[f].name if f >= 0 else ""


def test_gker_total_and_count_are_the_recorded_kernels(torch_run: tuple[Path, Any]) -> None:
    meas, exp = torch_run
    g = _companion(meas)
    ops = np.concatenate(list(g.ops.values()))
    kernels = ops[ops["kind"] == gpu.OP_KERNEL]
    assert len(kernels) > 1000
    assert float(exp.inclusive(exp.metric("GKER (sec)"))[0]) == pytest.approx(_dur(kernels),
                                                                               rel=1e-9)
    assert float(exp.inclusive(exp.metric("GKER:COUNT"))[0]) == len(kernels)
    h2d = ops[(ops["kind"] == gpu.OP_MEMCPY) & (ops["sub"] == 1)]
    assert float(exp.inclusive(exp.metric("GXCOPY:H2D (B)"))[0]) == float(h2d["bytes"].sum())


def _python_leaf(g: mdg.GpuFile, slot: int, node: int) -> str | None:
    """The function of the innermost Python frame of a launch, from the companion's tree."""
    th = next(t for t in g.process.threads if t.slot == slot)
    if th.nodes["kind"][node] != md.NodeKind.PYTHON:
        return None
    return g.process.pycode[int(th.nodes["module"][node])].function


def test_forward_gemms_sit_under_linear_forward_with_its_cpu_time(
        torch_run: tuple[Path, Any]) -> None:
    """Per kernel name, the GPU time launched from Linear.forward in the companion equals
    the GKER under <gpu kernel> below Linear.forward's line in the database; that line's
    context also holds the CPU samples the sampler took there (one merged tree)."""
    meas, exp = torch_run
    g = _companion(meas)
    want: dict[str, float] = {}
    for slot, ops in g.ops.items():
        for op in ops[ops["kind"] == gpu.OP_KERNEL]:
            if _python_leaf(g, slot, int(op["node"])) == "Linear.forward":
                name = demangle(g.names[int(op["name"])])
                want[name] = want.get(name, 0.0) + (int(op["end"]) - int(op["start"])) * 1e-9
    assert want and any("gemm" in k for k in want)
    cct = exp.cct
    gker = exp.exclusive(exp.metric("GKER (sec)"))
    got: dict[str, float] = {}
    lines: set[int] = set()
    for n in np.flatnonzero(gker):
        ph = int(cct.parent[n])
        line = int(cct.parent[ph])
        assert _fn(exp, ph) == "<gpu kernel>"
        if _fn(exp, int(cct.parent[line])) == "Linear.forward":
            got[_fn(exp, int(n))] = got.get(_fn(exp, int(n)), 0.0) + float(gker[n])
            lines.add(line)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9)
    cpu = exp.inclusive(exp.metric("CPUTIME (sec)"))
    assert any(cpu[line] > 0 for line in lines)


def test_autograd_thread_launches_are_its_own_context(torch_run: tuple[Path, Any]) -> None:
    """The backward pass's kernels come from PyTorch's autograd thread, which the Python
    sampler never saw: a THREAD of its own (numbered after the sampler's), holding exactly
    the GPU time of that thread's operations in the companion."""
    meas, exp = torch_run
    g = _companion(meas)
    main_tid = g.process.pid
    other = [t for t in g.process.threads if t.tid != main_tid]
    assert other
    want = sum(_dur(g.ops[t.slot][g.ops[t.slot]["kind"] == gpu.OP_KERNEL]) for t in other)
    threads = [c for c in exp.contexts if [i.kind for i in c.ids][-1] == IdKind.THREAD]
    assert [c.ids[-1].logical_id for c in threads] == [0, 1]
    got = float(exp.values_in(threads[1].index, "GKER (sec)", "execution").max())
    assert got == pytest.approx(want, rel=1e-9)


def test_gpu_stream_trace_line(torch_run: tuple[Path, Any]) -> None:
    meas, exp = torch_run
    g = _companion(meas)
    ops = np.concatenate(list(g.ops.values()))
    work = ops[ops["kind"] != gpu.OP_SYNC]
    streams = [c for c in exp.contexts if any(i.kind == IdKind.GPUSTREAM for i in c.ids)]
    assert {(c.ids[1].logical_id, c.ids[2].logical_id) for c in streams} == {
        (int(a), int(b)) for a, b in zip(work["context"], work["stream"], strict=True)}
    assert exp.traces is not None
    lines = {t.prof_index: t for t in exp.traces.lines}
    for c in streams:
        sel = work[(work["context"] == c.ids[1].logical_id)
                   & (work["stream"] == c.ids[2].logical_id)]
        line = lines[c.index]
        assert len(line.timestamps) == 2 * len(sel)
        assert line.timestamps[0::2].tolist() == sorted(sel["start"].tolist())


def test_cuda_program_two_streams_copies_and_call_sites(tmp_path: Path) -> None:
    """The C program's binary is not here, so its frames stay addresses: each kernel's
    launches still share one call path, a different one per kernel, and copies, memsets and
    the two streams come out as recorded."""
    meas = _unpack("cuda-h100.tgz", tmp_path)
    db = tmp_path / "db"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    exp = callpath.open(db)
    g = _companion(meas)
    ops = np.concatenate(list(g.ops.values()))
    for kind, metric in ((1, "GXCOPY:H2D (B)"), (2, "GXCOPY:D2H (B)")):
        sel = ops[(ops["kind"] == gpu.OP_MEMCPY) & (ops["sub"] == kind)]
        assert len(sel) == 20
        assert float(exp.inclusive(exp.metric(metric))[0]) == float(sel["bytes"].sum())
    gker = exp.exclusive(exp.metric("GKER (sec)"))
    count = exp.exclusive(exp.metric("GKER:COUNT"))
    sites: dict[str, set[int]] = {}
    for n in np.flatnonzero(gker):
        sites.setdefault(_fn(exp, int(n)).split("(")[0], set()).add(
            int(exp.cct.parent[exp.cct.parent[n]]))
        assert count[n] == 20
    assert sites.keys() == {"scale", "axpy"}
    assert all(len(v) == 1 for v in sites.values()) and sites["scale"] != sites["axpy"]
    streams = [c for c in exp.contexts if any(i.kind == IdKind.GPUSTREAM for i in c.ids)]
    assert len(streams) == 2


def test_kernel_properties_are_hpcprofs_derived_roots(tmp_path: Path) -> None:
    """metrics/default.yaml presents the GPU metrics as hpcprof does for hpcrun's: each kernel
    property a formula over its accumulator and GKER:COUNT (exclusive only), the
    accumulators invisible, the synchronization kinds hidden by default."""
    import yaml

    meas = _unpack("cuda-h100.tgz", tmp_path)
    db = tmp_path / "db"
    run_cli("prof", str(meas), "-o", str(db), check=True)
    doc = yaml.safe_load((db / "metrics" / "default.yaml").read_text())
    roots = {r["name"]: r for r in doc["roots"]}
    assert {name for name, *_ in gpu.GPU_DERIVED} <= roots.keys()
    thr = roots["GKER:THR_REG"]["variants"][""]["formula"]
    assert "inclusive" not in thr
    (num, den), = thr["exclusive"]["standard"].values()
    assert (num["metric"], num["scope"]) == ("GKER:THR_REG_ACUMU", "function")
    assert (den["metric"], den["scope"]) == ("GKER:COUNT", "function")
    assert not any(n.endswith("_ACUMU") or n.endswith("_ACUMU (B)") for n in roots)
    assert roots["GSYNC:STR (sec)"]["visible by default"] is False
    assert roots["GKER (sec)"]["description"] == "GPU time: kernel execution (seconds)"
