"""``--native`` never harms the program it measures: the stress program of
``tests/native_python/stress.py`` (calls from C into Python of every kind, generators,
exceptions, code objects that die, the garbage collector's finalizers, four threads) runs to
the end with the right output 20 times in a row at 1 kHz and at 4 kHz, on the interpreter that
runs the tests (CI runs them on each interpreter of its matrix).

Before the capture read the interpreter's memory through ``read_mem`` (see
``_callpath_native.c``) the same runs died of SIGSEGV in 2 of 10 (1 kHz) and 7 of 10 (4 kHz)
on CPython 3.11.7, 8 and 10 of 10 on 3.12.1: a pass here is not luck. The program runs under
the sampler's bootstrap directly (no launcher, no merge: the merge happens after the program
and cannot harm it), two at a time; one run is merged to check that its callbacks sit below
their callers.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from callpath.formats import measdir
from callpath.measure.python import native_merge as merge
from callpath.measure.python.native_summary import finish_native

ROOT = Path(__file__).resolve().parents[1]
STRESS = ROOT / "tests" / "native_python" / "stress.py"
SHIM = ROOT / "src" / "callpath" / "measure" / "python" / "shim"
RUNS = 20
PY = int(measdir.NodeKind.PYTHON)


@pytest.fixture(scope="module")
def capture_ok() -> None:
    from callpath.measure.python import native_capture
    _ext, reason = native_capture._load_extension()
    if reason is not None:
        pytest.skip(f"no native capture here: {reason}")


@pytest.fixture(scope="module")
def expected() -> str:
    """The program's output without a sampler (its own function, in a plain interpreter)."""
    r = subprocess.run([sys.executable, str(STRESS), "1"], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _measured(out: Path, hz: int) -> subprocess.CompletedProcess[str]:
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=str(SHIM), CALLPATH_PY_OUT=str(out),
               CALLPATH_PY_FREQ=str(hz), CALLPATH_PY_NATIVE="32768")
    return subprocess.run([sys.executable, str(STRESS), "1"], env=env, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.parametrize("hz", [1000, 4000])
def test_stress_program_survives_native_capture(capture_ok: None, expected: str, hz: int,
                                                tmp_path: Path) -> None:
    """20 runs in a row end with status 0 and the plain run's output, and each was sampled
    (at least 10 native records: the main thread alone gets ~hz samples a second of its
    0.2 s or more of wall-clock time, its timer being wall-clock)."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda i: (i, _measured(tmp_path / f"m{i}", hz)), range(RUNS)))
    for i, r in runs:
        assert r.returncode == 0 and r.stdout == expected, (
            f"run {i} of {RUNS} at {hz} Hz: status {r.returncode}, output {r.stdout!r} "
            f"(expected {expected!r}), {r.stderr[-2000:]}")
        (samples,) = (tmp_path / f"m{i}").glob("native-*.samples")
        assert len(merge.read_records(samples).tid) >= 10, f"run {i}: no capture"


def test_stress_callbacks_merged_below_their_callers(capture_ok: None, expected: str,
                                                     tmp_path: Path) -> None:
    """The Python functions that C calls back (the lambda that ``map`` calls, ``Key.__lt__``
    that ``sorted`` calls; code objects are named by their qualified names) are merged below
    the Python function that called ``map``/``sorted``: the samples taken inside them have
    ``callbacks`` as an outer Python frame."""
    out = tmp_path / "m"
    r = _measured(out, 1000)
    assert r.returncode == 0 and r.stdout == expected, r.stderr
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        finish_native(out)
    assert "warning" not in err.getvalue(), err.getvalue()
    (pfile,) = out.glob(measdir.PROCESS_GLOB)
    p = measdir.read_process(pfile)
    assert str(p.info["native"]).startswith("merged"), p.info
    callers: dict[str, set[str]] = {"callbacks.<locals>.<lambda>": set(), "Key.__lt__": set()}
    for t in p.threads:
        for leaf in (t.samples[:, 0] > 0).nonzero()[0].tolist():
            names = [p.pycode[int(t.nodes[n]["module"])].function
                     for n in t.path_of(int(leaf))[1:] if int(t.nodes[n]["kind"]) == PY]
            for k, name in enumerate(names):
                if name in callers and "callbacks" in names[:k]:
                    callers[name].add("callbacks")
    assert callers == {"callbacks.<locals>.<lambda>": {"callbacks"},
                       "Key.__lt__": {"callbacks"}}, callers
