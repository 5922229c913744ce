"""The C unwinder (``_callpath_unwind.c``) against the numpy one, on real captures.

``unwind.unwind`` runs the C level loop where the extension is built and numpy's otherwise; the
two must give the same frames, field by field and byte for byte, and the same per-source
counts. Each test captures a real program (perf sampling of compiled C programs: signal
frames, a recursion deeper than the stack copy, code written at run time; the ``--native``
capture of a Python program whose C code calls back into Python), then runs the real
post-mortem in this process with every call of ``unwind`` unwound both ways and compared.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from callpath.measure import cfi, unwind
from test_run_native import perf_ok  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / "tests" / "programs"
FIELD = ROOT / "tests" / "field_programs"
STRESS = ROOT / "tests" / "native_python" / "stress.py"
SHIM = ROOT / "src" / "callpath" / "measure" / "python" / "shim"
FIELDS = ("sample", "depth", "module", "address", "exact", "complete", "nframes", "reason",
          "source")


def _built() -> bool:
    """Whether ``pip install`` built the C unwinder for this interpreter."""
    here = ROOT / "src" / "callpath" / "measure"
    return any((here / f"_callpath_unwind{s}").exists()
               for s in importlib.machinery.EXTENSION_SUFFIXES)


@pytest.fixture()
def both(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[unwind.Frames]:
    """``unwind.unwind`` replaced by one that unwinds with C and numpy, asserts the two
    identical and returns C's; the C results are collected in the list it gives."""
    if not _built():
        pytest.skip("the C unwinder (_callpath_unwind) is not built for this interpreter")
    # built: the dispatch must take it (else the comparison would be numpy with numpy)
    assert unwind.implementation() == "c"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    seen: list[unwind.Frames] = []
    real = unwind.unwind

    def check(*args: Any, **kw: Any) -> unwind.Frames:
        compiler: cfi.Compiler = args[7]
        before = list(compiler.frame_sources)
        fc = unwind.unwind_c(*args, **kw)
        mid = list(compiler.frame_sources)
        fn = unwind.unwind_numpy(*args, **kw)
        after = list(compiler.frame_sources)
        for name in FIELDS:
            a, b = getattr(fc, name), getattr(fn, name)
            assert a.dtype == b.dtype and a.shape == b.shape, (name, a.dtype, b.dtype)
            assert a.tobytes() == b.tobytes(), name
        assert [x - y for x, y in zip(mid, before, strict=True)] == \
            [x - y for x, y in zip(after, mid, strict=True)]
        compiler.frame_sources[:] = mid
        if not seen:  # unwind() itself takes the C path: it works with numpy's made to fail
            def fail(*_a: Any, **_k: Any) -> unwind.Frames:
                raise AssertionError("unwind() ran the numpy unwinder")
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(unwind, "unwind_numpy", fail)
                again = real(*args, **kw)
            assert again.address.tobytes() == fc.address.tobytes()
            compiler.frame_sources[:] = mid
        seen.append(fc)
        return fc
    monkeypatch.setattr(unwind, "unwind", check)
    return seen


def _perf_capture(exe: Path, args: list[str], out: Path) -> None:
    """A perf-sampled run of a compiled program, post-processed here (not by the CLI's child)
    so that its unwinding goes through this process's ``unwind``."""
    from callpath.measure import perf_events as events
    from callpath.measure import perf_launch as launch
    from callpath.measure import postmortem
    with open(os.devnull, "w") as devnull:
        saved = os.dup(1)
        os.dup2(devnull.fileno(), 1)
        try:
            launch.run([str(exe), *args],
                       launch.RunOptions([events.parse_event("cpu-clock@250000")], out))
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    postmortem.finish(out)


def _compile(src: Path, exe: Path) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    subprocess.run(["gcc", "-O2", "-g", f"-I{src.parent}", "-pthread", "-o", str(exe), str(src)],
                   check=True, capture_output=True)
    return exe


def _cat(seen: list[unwind.Frames], name: str) -> np.ndarray[Any, Any]:
    return np.concatenate([getattr(f, name) for f in seen])


def test_signal_frames(perf_ok: None, both: list[unwind.Frames],  # noqa: F811
                       tmp_path: Path) -> None:
    """Samples in a signal handler: unwound through the kernel's signal frame (C's ucontext
    loads) to _start, as numpy does."""
    exe = _compile(PROGRAMS / "misbehave.c", tmp_path / "misbehave")
    _perf_capture(exe, ["signal", "300"], tmp_path / "m")
    assert both
    assert (_cat(both, "source") == cfi.SRC_SIGNAL).sum() >= 10
    assert _cat(both, "complete").mean() >= 0.9


def test_deep_recursion(perf_ok: None, both: list[unwind.Frames],  # noqa: F811
                        tmp_path: Path) -> None:
    """A recursion deeper than the stack copy: hundreds of frames per sample, ending partial
    where the copy ends (C's bounds on the copy are numpy's)."""
    exe = _compile(PROGRAMS / "misbehave.c", tmp_path / "misbehave")
    _perf_capture(exe, ["deep", "150"], tmp_path / "m")
    assert both
    assert (_cat(both, "reason") == unwind.PARTIAL_STACK).sum() >= 50
    assert _cat(both, "nframes").max() >= 100


def test_code_without_a_file(perf_ok: None, both: list[unwind.Frames],  # noqa: F811
                             tmp_path: Path) -> None:
    """Code written at run time: C hands its frames to Python's proof of the return address
    (``jitframes``) and resumes above them."""
    exe = _compile(FIELD / "jit.c", tmp_path / "jit")
    _perf_capture(exe, ["0.3"], tmp_path / "m")
    assert both
    assert (_cat(both, "source") == cfi.SRC_JIT).sum() >= 50
    assert _cat(both, "complete").mean() >= 0.8


def test_python_native_with_callbacks(both: list[unwind.Frames], tmp_path: Path) -> None:
    """``--native`` capture of a Python program whose C code calls back into Python (``map``,
    ``sorted`` with a key, ``functools.reduce``): the interpreter's deep native stacks, merged
    by ``finish_native`` here."""
    from callpath.measure.python import native_capture
    from callpath.measure.python.native_summary import finish_native
    _ext, reason = native_capture._load_extension()
    if reason is not None:
        pytest.skip(f"no native capture here: {reason}")
    out = tmp_path / "m"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=str(SHIM), CALLPATH_PY_OUT=str(out),
               CALLPATH_PY_FREQ="1000", CALLPATH_PY_NATIVE="32768")
    r = subprocess.run([sys.executable, str(STRESS), "1"], env=env, capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        finish_native(out)
    assert both
    # (the copy ends at the outermost evaluation frame: most paths end there, partial)
    nframes = _cat(both, "nframes")
    assert len(nframes) >= 100 and nframes.max() >= 20 and nframes.sum() >= 2000
