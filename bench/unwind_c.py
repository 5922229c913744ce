"""The post-mortem unwinder in C (``_callpath_unwind.c``) against the numpy one on the same
``--native`` capture: the merge of a copy of the capture (``finish_native``) in a fresh
process per run, ``unwind`` forced to one of the two, the time spent in it printed; medians
of N runs with the two interleaved, and their ratio. Warm caches: the row cache and the page
cache are filled by a first merge that is not counted.

The capture is the raw directory a ``--native`` run leaves before its merge (measurement.json,
native-PID-0.json/.samples, process-PID-0.cpm, vdso.so; e.g. a PyTorch loop's, issue 27). The
interpreter is one that can import callpath (and the program's modules, for the Python frames).

    .venv/bin/python bench/unwind_c.py RAW [--runs 5] [--python PY]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import os, shutil, sys, time
from pathlib import Path
import callpath.measure.unwind as U
impl = {"c": U.unwind_c, "numpy": U.unwind_numpy}[sys.argv[3]]
spent = [0.0]
def timed(*a, **k):
    t = time.perf_counter()
    try:
        return impl(*a, **k)
    finally:
        spent[0] += time.perf_counter() - t
U.unwind = timed
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
from callpath.measure.python.native_summary import finish_native
finish_native(dst, 0, on_frames=lambda *a: None)
print(f"UNWIND {spent[0]:.4f}")
"""


def one(py: str, raw: Path, tmp: Path, impl: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([py, "-c", CHILD, str(raw), str(tmp / "m"), impl], env=env,
                       capture_output=True, text=True, timeout=600, check=False)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("UNWIND ")]
    if r.returncode != 0 or not lines:
        sys.exit(f"unwind_c: the merge failed ({impl}): {r.stderr[-2000:]}")
    return float(lines[-1].split()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raw", type=Path, help="a --native capture directory, before its merge")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter of the merge (the measured program's)")
    args = ap.parse_args()
    if not (args.raw / "measurement.json").exists():
        sys.exit(f"unwind_c: {args.raw}: not a capture directory (no measurement.json)")
    with tempfile.TemporaryDirectory(prefix="unwind-c-") as d:
        tmp = Path(d)
        one(args.python, args.raw, tmp, "c")  # warms the row cache and the page cache
        got: dict[str, list[float]] = {"numpy": [], "c": []}
        for _ in range(args.runs):
            for impl in ("numpy", "c"):
                got[impl].append(one(args.python, args.raw, tmp, impl))
        shutil.rmtree(tmp / "m", ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"unwind of {args.raw} (medians of {args.runs}, interleaved; load {load:.2f}):")
    for impl in ("numpy", "c"):
        print(f"  {impl:6} {statistics.median(got[impl]):7.3f} s  "
              f"(runs: {', '.join(f'{v:.3f}' for v in got[impl])})")
    print(f"  ratio numpy / C: {statistics.median(got['numpy']) / statistics.median(got['c']):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
