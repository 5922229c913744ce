"""Overhead of measuring a CPU-bound pure-Python program: callpath, py-spy, pyinstrument, cProfile.

One workload (recursion, loops, method calls, string and dict work; a few seconds) is run plain
and under each tool, ``--repeat`` times each (default 5), interleaved so that drifting load on a
shared machine hits every configuration alike. Two times are taken per run:

- *work*: the workload's own ``perf_counter`` around its computation (printed by the workload):
  the slowdown of the program itself, free of each tool's start-up and post-processing;
- *total*: the wall-clock time of the whole command (interpreter and tool start-up, writing the
  profile), as a user waits for it.

Medians, and ratios to the plain run's median, are printed as one table. py-spy and pyinstrument
are installed on first use into ``bench/.env-pyprof`` (a virtualenv of their own: peers to
measure against, never dependencies of callpath); a tool that cannot be installed or run (py-spy
needs ptrace) is reported as such and skipped.

    .venv/bin/python bench/measure_python.py [--repeat 5] [--seconds 3] [--only callpath]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PEER_ENV = BENCH / ".env-pyprof"
PEERS = ["py-spy==0.4.3", "pyinstrument==5.1.3"]

WORKLOAD = '''
import sys, time

def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

class Vec:
    __slots__ = ("x", "y")
    def __init__(self, x, y):
        self.x, self.y = x, y
    def add(self, o):
        return Vec(self.x + o.x, self.y + o.y)

def vectors(n):
    v = Vec(0, 0)
    d = Vec(1, 2)
    for _ in range(n):
        v = v.add(d)
    return v.x

def words(n):
    counts = {}
    for i in range(n):
        w = "w" + str(i % 97)
        counts[w] = counts.get(w, 0) + 1
    return len(counts)

def loops(n):
    s = 0
    for i in range(n):
        s += i * i % 7
    return s

def main(scale):
    t0 = time.perf_counter()
    for _ in range(int(scale)):
        fib(22); vectors(60_000); words(60_000); loops(150_000)
    print(f"WORK {time.perf_counter() - t0:.6f}")

main(float(sys.argv[1]))
'''


def peer_python() -> Path | None:
    """The virtualenv holding py-spy and pyinstrument, created on first use."""
    py = PEER_ENV / "bin" / "python"
    if not py.exists():
        print(f"installing {', '.join(PEERS)} into {PEER_ENV.relative_to(REPO)} ...",
              file=sys.stderr)
        try:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEER_ENV)], check=True)
            subprocess.run([str(py), "-m", "pip", "install", "-q", *PEERS], check=True)
        except (subprocess.CalledProcessError, OSError) as e:
            print(f"cannot install the peers: {e}", file=sys.stderr)
            return None
    return py


def calibrate(py: str, script: Path, seconds: float) -> float:
    """The workload scale that takes about ``seconds`` here."""
    out = subprocess.run([py, str(script), "1"], capture_output=True, text=True, check=True)
    one = float(out.stdout.split("WORK")[1].split()[0])
    return max(1.0, round(seconds / one))


def configurations(script: Path, scale: float, tmp: Path,
                   peer: Path | None) -> dict[str, list[str]]:
    """Name -> command line; ``{i}`` in an argument stands for the run number."""
    py = sys.executable
    w = [str(script), str(scale)]
    cfg: dict[str, list[str]] = {"plain": [py, *w]}
    for hz in (100, 1000):
        cfg[f"callpath {hz} Hz"] = [
            "env", f"PYTHONPATH={REPO / 'src'}", py, "-m", "callpath.measure.python", "-q",
            "-o", str(tmp / f"cp-{hz}-{{i}}"), "-F", str(hz), *w]
    if peer is not None:
        spy = str(peer.parent / "py-spy")
        for hz in (100, 1000):
            for mode in ([], ["--nonblocking"]):
                name = f"py-spy {hz} Hz" + (" nonblocking" if mode else "")
                cfg[name] = [spy, "record", "-r", str(hz), *mode, "-o",
                             str(tmp / f"spy-{hz}-{{i}}.svg"), "--", py, *w]
        for hz in (100, 1000):
            cfg[f"pyinstrument {hz} Hz"] = [
                str(peer), "-m", "pyinstrument", "-i", str(1 / hz), "-r", "text", "-o",
                str(tmp / f"pyi-{hz}-{{i}}.txt"), *w]
    cfg["cProfile"] = [py, "-m", "cProfile", "-o", str(tmp / "cprof-{i}.out"), *w]
    return cfg


def run_once(cmd: list[str]) -> tuple[float, float] | str:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    total = time.perf_counter() - t0
    if p.returncode != 0 or "WORK" not in p.stdout:
        return (p.stderr.strip().splitlines() or ["failed"])[-1][:100]
    return float(p.stdout.split("WORK")[1].split()[0]), total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0, help="plain duration of the workload")
    ap.add_argument("--only", action="append", default=[],
                    help="run only configurations whose name starts with this (and plain)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-pyrun-"))
    try:
        script = tmp / "workload.py"
        script.write_text(WORKLOAD)
        peer = None if args.only and not any(
            o.startswith(("py-spy", "pyinstrument")) for o in args.only) else peer_python()
        scale = calibrate(sys.executable, script, args.seconds)
        cfg = configurations(script, scale, tmp, peer)
        if args.only:
            cfg = {k: v for k, v in cfg.items()
                   if k == "plain" or any(k.startswith(o) for o in args.only)}
        results: dict[str, list[tuple[float, float]]] = {k: [] for k in cfg}
        failed: dict[str, str] = {}
        for i in range(args.repeat):
            for name, template in cfg.items():
                if name in failed:
                    continue
                r = run_once([a.replace("{i}", str(i)) for a in template])
                if isinstance(r, str):
                    failed[name] = r
                else:
                    results[name].append(r)
                print(f"  run {i + 1}/{args.repeat} {name}: {r}", file=sys.stderr)
        base_w = statistics.median(x[0] for x in results["plain"])
        base_t = statistics.median(x[1] for x in results["plain"])
        print(f"workload: scale {scale:g}, plain {base_w:.3f} s; medians of {args.repeat}; "
              f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
        print(f"{'configuration':28s} {'work s':>8s} {'ratio':>7s} {'total s':>8s} {'ratio':>7s}"
              f"  {'spread of work ratio':>20s}")
        for name, rs in results.items():
            if name in failed:
                print(f"{name:28s} not run: {failed[name]}")
                continue
            w = statistics.median(x[0] for x in rs)
            t = statistics.median(x[1] for x in rs)
            lo, hi = min(x[0] for x in rs) / base_w, max(x[0] for x in rs) / base_w
            print(f"{name:28s} {w:8.3f} {w / base_w:7.3f} {t:8.3f} {t / base_t:7.3f}"
                  f"  {lo:9.3f} .. {hi:.3f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
