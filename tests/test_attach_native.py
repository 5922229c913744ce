"""``callpath run --pid PID --native``: the native stacks of an attached Python process, merged
below the Python frames read from its memory (real programs started before the profiler)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from callpath.formats import measdir
from test_attach import PYTHONS, PySpinner, _line_of, _python
from test_run_native import callpath, perf_ok  # noqa: F401
from test_run_native_python import NAT, PY, innermost_python_above, libs, paths  # noqa: F401

CTYPES_PROGRAM = Path(__file__).resolve().parent / "programs" / "attach_ctypes.py"


class CtypesSpinner(PySpinner):
    def __init__(self, python: str, lib: Path, tmp: Path, work: int = 30_000_000) -> None:
        self.stop_file = tmp / f"stop-{time.monotonic_ns()}"
        self.proc = subprocess.Popen([python, str(CTYPES_PROGRAM), str(lib), str(self.stop_file)],
                                     stdout=subprocess.PIPE, text=True, start_new_session=True,
                                     env={**os.environ, "KERNEL_N": str(work)})
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "ready\n"


def _kernel_samples(out: Path) -> tuple[dict[str, int], list[list[object]]]:
    """Samples in each kernel with its own caller's line as the innermost Python frame above
    it, and the paths where it is another (each kernel has one caller, so: wrong)."""
    m = measdir.read(out)
    assert m.header["status"] == "complete" and m.header["native"] is True
    (p,) = m.processes
    want = {"kernel_a": ("small_part", _line_of_in(CTYPES_PROGRAM, "SMALL_LINE")),
            "kernel_b": ("large_part", _line_of_in(CTYPES_PROGRAM, "LARGE_LINE"))}
    seen = {"kernel_a": 0, "kernel_b": 0}
    wrong: list[list[object]] = []
    for frames, n, _secs in paths(out, p, p.threads[0]):
        for i, f in enumerate(frames):
            if f.kind == NAT and f.name in want:
                caller = innermost_python_above(frames, i)
                if caller is None or (caller.name, caller.line) != want[f.name]:
                    wrong.append(list(frames))
                assert not any(g.name == "_PyEval_EvalFrameDefault" for g in frames), frames
                seen[f.name] += n
                break
    return seen, wrong


def _attach_ctypes(python: str, lib: Path, tmp: Path, work: int, seconds: str) -> Path:
    spin = CtypesSpinner(python, lib, tmp, work)
    out = tmp / "m"
    try:
        proc = callpath("run", "--pid", str(spin.proc.pid), "--native", "--duration", seconds,
                        "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        assert "kept running" in proc.stderr and "native stacks:" in proc.stderr, proc.stderr
        assert spin.proc.poll() is None
        status, text = spin.finish()
    finally:
        spin.kill()
    assert status == 0 and text.strip() == "done"
    assert not (out / "raw.perf").exists()
    return out


@pytest.mark.parametrize("python", PYTHONS)
def test_ctypes_kernels_below_their_callers(perf_ok: None, libs: dict[str, Path],  # noqa: F811
                                            python: str, tmp_path: Path) -> None:
    """kernel_a is called only from small_part, kernel_b only from large_part, alternating
    (about 40 and 80 ms a call). Attached with --native for 3 s: every sample in either
    kernel has its own caller as the innermost Python frame above it, at the calling line
    (no exception: a native stack lent to a tick of another Python state would break this),
    with ctypes between and no evaluation loop left in the path; the program keeps running
    and ends normally. At least 10 samples must reach a kernel: a running thread gets a
    native sample every 10 ms of CPU time and a call spans several ticks, so 3 s give about
    100 even at load 14 on two CPUs (measured); fewer means the pairing is broken."""
    if "kernels" not in libs:
        pytest.skip("gcc cannot build a shared library here")
    out = _attach_ctypes(_python(python), libs["kernels"], tmp_path, 30_000_000, "3")
    seen, wrong = _kernel_samples(out)
    assert not wrong, wrong[:3]
    assert seen["kernel_a"] + seen["kernel_b"] >= 10, seen


def test_fast_alternation_never_lends_the_other_kernel(
        perf_ok: None, libs: dict[str, Path], tmp_path: Path) -> None:  # noqa: F811
    """The same program with calls of 0.4 and 0.8 ms, many within one tick: two ticks that
    read small_part's line can have large_part's kernel_b run between them. Without the
    check that a native sample holds the Python frame's instruction pointer about half the
    merged kernel samples were under the wrong caller (50 of 102 at load 15); with it none
    may be. At least 3 kernel samples must be merged (36 were, at load 15)."""
    if "kernels" not in libs:
        pytest.skip("gcc cannot build a shared library here")
    out = _attach_ctypes(_python("python3.11"), libs["kernels"], tmp_path, 300_000, "4")
    seen, wrong = _kernel_samples(out)
    assert not wrong, wrong[:3]
    assert seen["kernel_a"] + seen["kernel_b"] >= 3, seen


def _line_of_in(path: Path, tag: str) -> int:
    lines = path.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(tag))


def test_zlib_below_the_compressing_line(perf_ok: None, tmp_path: Path) -> None:  # noqa: F811
    """The threaded program of test_attach: the compressing thread's zlib.compress call
    (a C extension) shows zlib's compress and libz's deflate below the Python line that
    calls it; the program is unharmed."""
    spin = PySpinner(_python("python3.11"), tmp_path)
    out = tmp_path / "m"
    try:
        proc = callpath("run", "--pid", str(spin.proc.pid), "--native", "--duration", "2",
                        "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        status, text = spin.finish()
    finally:
        spin.kill()
    assert status == 0 and text.strip() == "done"
    m = measdir.read(out)
    (p,) = m.processes
    assert len(p.threads) == 3
    line = _line_of("COMPRESS_LINE")
    below: dict[str, int] = {}
    for t in p.threads:
        for frames, n, _secs in paths(out, p, t):
            py = [i for i, f in enumerate(frames) if f.kind == PY]
            if not py or (frames[py[-1]].name, frames[py[-1]].line) != ("compressor", line):
                continue
            for f in frames[py[-1] + 1:]:
                below[f.name] = below.get(f.name, 0) + n
    assert below.get("zlib_compress", 0) > 0 and below.get("deflate", 0) > 0, below


NUMPY_PROGRAM = Path(__file__).resolve().parent / "programs" / "attach_numpy.py"


def test_blas_worker_threads_have_native_paths(perf_ok: None, tmp_path: Path) -> None:  # noqa: F811
    """numpy's matrix products with two OpenBLAS threads: the worker thread, which runs no
    Python code and so is never read by the ticks, gets its own native call paths from the
    perf_event samples (OpenBLAS's thread server down to its kernels); the main thread keeps
    its Python line; the program is unharmed."""
    pytest.importorskip("numpy")
    stop = tmp_path / "stop"
    prog = subprocess.Popen([sys.executable, str(NUMPY_PROGRAM), str(stop)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OPENBLAS_NUM_THREADS": "2"})
    out = tmp_path / "m"
    try:
        assert prog.stdout is not None and prog.stdout.readline() == "ready\n"
        proc = callpath("run", "--pid", str(prog.pid), "--native", "--duration", "3",
                        "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        assert "threads without Python code" in proc.stderr, proc.stderr
        stop.touch()
        text, _ = prog.communicate(timeout=60)
    finally:
        if prog.poll() is None:
            prog.kill()
            prog.wait()
    assert prog.returncode == 0 and text.strip() == "done"
    m = measdir.read(out)
    (p,) = m.processes
    assert p.info["native_merge"]["native_only_threads"] >= 1, p.info
    workers = [t for t in p.threads if t.tid != p.pid]
    blas = 0
    for t in workers:
        for frames, n, _secs in paths(out, p, t):
            assert all(f.kind != PY for f in frames), frames
            if any(f.kind == NAT and "openblas" in f.module for f in frames):
                blas += n
    assert blas > 0, [t.tid for t in workers]
    main = next(t for t in p.threads if t.tid == p.pid)
    line = _line_of_in(NUMPY_PROGRAM, "MATMUL_LINE")
    assert any(any(f.kind == PY and f.name == "main" and f.line == line for f in frames)
               for frames, _n, _s in paths(out, p, main))
