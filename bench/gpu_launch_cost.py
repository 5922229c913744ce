"""Benchmark: what the CUPTI library's capture of a launch's calling context costs the thread
that launches, against what one sample of callpath's Python sampler costs, in the same run.
Needs CUPTI's headers and library (nvidia-cuda-cupti or a CUDA toolkit), not a GPU.

The issue's design rule: "the calling context at a launch costs what one sample costs
today". A launch's capture runs in the launching thread, inside CUPTI's callbacks (the
runtime call's ENTER and EXIT and the driver call's inside it); here those callbacks are
made up (``callpath_cupti_fake_launches``: CUPTI's side only is faked, the library's own
code runs as at a real launch) and timed by the library's own accounting (its ``cost``
note, as ``callpath run -e gpu=nvidia`` prints it), for:

* ``python``: a launch from Python (what PyTorch's forward pass makes), under ``--depth`` more
  Python frames: the Python frames read without the GIL;
* ``python+native``: the same with ``--native`` (``CALLPATH_GPU_NATIVE=1``): also the native
  return addresses (``backtrace()``) under ``--native-depth`` more C frames;
* ``native thread``: a thread that runs no Python (PyTorch's autograd engine), its launches
  under ``--native-depth`` C frames: native frames only.

Native frames come from the library's own walk (``launch_unwind.c``: each return address's
rule computed once from libgcc's FDE, then looked up); the two native configurations run
again with ``CALLPATH_GPU_UNWIND=backtrace`` (glibc's ``backtrace()`` at every launch, as
before that walk), for the comparison in the same run.

The sampler's figure is its C signal handler called in a loop at the same Python depth (its
caches warm: the per-sample cost in a steady loop; the signal's delivery is not in it, nor
is CUPTI's own cost in the launch's). Medians of ``--repeat`` rounds; prints one JSON object.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from callpath.measure.gpu import convert, library, summary  # noqa: E402


def nest(n: int, fn: Callable[[], Any]) -> Any:
    """fn() under n more Python frames"""
    return nest(n - 1, fn) if n else fn()


def launch_cost(lib: ctypes.CDLL, raw: Path, n: int, native_depth: int, in_thread: bool,
                depth: int) -> float:
    """µs per launch of the library's callbacks, from its cost note"""
    def go() -> None:
        assert lib.callpath_cupti_fake_launches(str(raw).encode(), n, native_depth,
                                                int(in_thread)) == 0
    nest(depth, go)
    cost = summary.cost_of(convert.read_raw(raw).notes)
    return float(cost["calls_ns"]) / cost["launches"] / 1e3


def sample_cost(out: Path, n: int, depth: int) -> float:
    """µs per call of the Python sampler's handler at this depth (warm caches)"""
    spec = importlib.util.spec_from_file_location(
        "_cp_sampler", ROOT / "src" / "callpath" / "measure" / "python" / "sampler.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sampler = mod.Sampler(str(out), 1000.0, False)
    handler = sampler.make_handler()
    sampler._open()

    def go() -> float:
        frame = sys._getframe()
        for _ in range(100):
            handler(signal.SIGPROF, frame)
        t0 = time.perf_counter_ns()
        for _ in range(n):
            handler(signal.SIGPROF, frame)
        t1 = time.perf_counter_ns()
        for _ in range(n):
            pass
        t2 = time.perf_counter_ns()
        return ((t1 - t0) - (t2 - t1)) / n / 1e3

    try:
        return float(nest(depth, go))
    finally:
        sampler.finish("exit", 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=20000)
    ap.add_argument("--depth", type=int, default=40, help="more Python frames (default 40)")
    ap.add_argument("--native-depth", type=int, default=100,
                    help="more C frames for the native paths (default 100)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    cupti = library.find_cupti()
    if cupti is None:
        raise SystemExit("no CUPTI headers and library here (nvidia-cuda-cupti or a CUDA "
                         "toolkit)")
    tmp = Path(tempfile.mkdtemp(prefix="callpath-launch-bench-"))
    lib = ctypes.CDLL(str(library.build(cupti, tmp / "cache")))
    os.environ["CALLPATH_GPU_DIR"] = str(tmp)
    runs: dict[str, list[float]] = {}
    for r in range(args.repeat):
        for name, native, nd, thread in (
                ("python", "0", 0, False), ("python+native", "1", args.native_depth, False),
                ("native thread", "0", args.native_depth, True),
                ("python+native, backtrace()", "1", args.native_depth, False),
                ("native thread, backtrace()", "0", args.native_depth, True)):
            os.environ["CALLPATH_GPU_NATIVE"] = native
            os.environ["CALLPATH_GPU_UNWIND"] = "backtrace" if "backtrace" in name else ""
            runs.setdefault(name, []).append(
                launch_cost(lib, tmp / f"gpu-{r}.raw", args.launches, nd, thread, args.depth))
        runs.setdefault("sampler (one sample)", []).append(
            sample_cost(tmp / f"s{r}", args.launches, args.depth))
    med = {k: round(statistics.median(v), 3) for k, v in runs.items()}
    base = med["sampler (one sample)"]
    out = {"python_depth": args.depth, "native_depth": args.native_depth,
           "launches": args.launches, "repeat": args.repeat,
           "us_per_launch": {k: v for k, v in med.items() if k != "sampler (one sample)"},
           "us_per_sample": base,
           "ratio_to_one_sample": {k: round(v / base, 2) for k, v in med.items()
                                   if k != "sampler (one sample)"}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
