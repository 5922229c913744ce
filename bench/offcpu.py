"""Cost of ``callpath run -e REALTIME`` (wall-clock and off-CPU time, issue 31) as the rate of
context switches grows: a two-thread token ping-pong through pipes (``tests/wait_programs/
pingpong.c``) at about 10^3, 10^4 and 10^5 switches a second, run plain, under ``callpath run
-e REALTIME``, under ``callpath run -e cpu-clock`` (CPU samples only: what any inherited
per-thread sampling event costs a switching program, the floor under REALTIME), under ``perf
record -e sched:sched_switch -g`` (a call chain at every switch, frame pointers) and under
``perf record --off-cpu`` where the installed perf supports it.

Overhead is the program's own elapsed time (it prints it) and its own CPU time (both threads),
medians of ``--runs`` runs with the configurations interleaved, as ratios to the plain median
of the same run. The busy work per pass that gives each rate is calibrated first from a plain
run without work. No timing is asserted anywhere: this prints.

    .venv/bin/python bench/offcpu.py [--runs 5] [--seconds 1.0] [--rates 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "wait_programs" / "pingpong.c"


def parse(stdout: str) -> tuple[float, float, int]:
    """(elapsed s, CPU s of both threads, switches) as the program prints them."""
    elapsed = cpu = 0.0
    switches = 0
    for line in stdout.splitlines():
        w = line.split()
        if w[:1] == ["elapsed"]:
            elapsed = int(w[1]) / 1e9
        elif w[:1] == ["switches"]:
            switches = int(w[1])
        elif w[:1] == ["thread"] and len(w) == 3:
            cpu += int(w[2]) / 1e9
    if not elapsed:
        raise RuntimeError(f"the program printed no elapsed time:\n{stdout}")
    return elapsed, cpu, switches


def run(cmd: list[str], cwd: Path) -> tuple[float, float, int, str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return (*parse(proc.stdout), proc.stderr)


def off_cpu_supported(perf: str, exe: Path, tmp: Path) -> bool:
    """``perf record --off-cpu`` needs a perf built with BPF skeletons."""
    proc = subprocess.run([perf, "record", "-q", "--off-cpu", "-o", str(tmp / "probe.data"),
                           "--", str(exe), "10", "0"], capture_output=True, text=True,
                          check=False)
    return proc.returncode == 0 and "not supported" not in proc.stderr.lower()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0, help="plain duration of each run")
    ap.add_argument("--rates", default="1000,10000,100000",
                    help="target context switches per second (comma-separated)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="offcpu-bench-"))
    exe = tmp / "pingpong"
    subprocess.run(["gcc", "-O2", "-g", "-pthread", "-o", str(exe), str(SOURCE)], check=True)
    os.environ["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH",
                                                                                 "")
    # calibration: the cost of one switch with no work, then the work that gives each rate
    e, _c, n, _ = run([str(exe), "20000", "0"], tmp)
    per_switch = e / n
    perf = shutil.which("perf")
    off_cpu = perf is not None and off_cpu_supported(perf, exe, tmp)
    print(f"pingpong: {1 / per_switch:,.0f} switches/s at most here (no work); "
          f"medians of {args.runs}; ratios to plain in the same run; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'rate':>8} {'configuration':34} {'switches/s':>11} {'program s':>10} "
          f"{'ratio':>6} {'cpu s':>7} {'ratio':>6}  notes")
    for rate in (int(r) for r in args.rates.split(",")):
        work = max(int(1e9 / rate - per_switch * 1e9), 0)
        iters = max(int(rate * args.seconds / 2), 10)
        prog = [str(exe), str(iters), str(work)]
        configs: dict[str, list[str]] = {
            "plain": prog,
            "callpath run -e REALTIME": [sys.executable, "-m", "callpath", "run", "--top",
                                         "0", "-e", "REALTIME", "-o", "m-{i}", "--", *prog],
            "callpath run -e cpu-clock": [sys.executable, "-m", "callpath", "run", "--top",
                                          "0", "-e", "cpu-clock", "-o", "m-{i}", "--", *prog]}
        if perf:
            configs["perf record -e sched:sched_switch -g"] = [
                perf, "record", "-q", "-e", "sched:sched_switch", "-g", "-o",
                "sw-{i}.data", "--", *prog]
            if off_cpu:
                configs["perf record --off-cpu"] = [perf, "record", "-q", "--off-cpu", "-o",
                                                    "off-{i}.data", "--", *prog]
        res: dict[str, list[tuple[float, float, int]]] = {k: [] for k in configs}
        notes: dict[str, str] = {}
        for i in range(args.runs):
            for name, cmd in configs.items():
                out = tmp / f"m-{i}"
                shutil.rmtree(out, ignore_errors=True)
                e, c, n, err = run([x.replace("{i}", str(i)) for x in cmd], tmp)
                res[name].append((e, c, n))
                said = re.search(r"(\d+) of (\d+) context switches sampled", " ".join(
                    err.split()))
                if said:
                    got = notes.get(name, "0 0").split()[:2]
                    notes[name] = (f"{int(got[0]) + int(said[1])} {int(got[1]) + int(said[2])}"
                                   " (of all runs: switches with a call path, switches)")
                shutil.rmtree(out, ignore_errors=True)
                for f in tmp.glob("*.data"):
                    f.unlink()
        be = statistics.median(x[0] for x in res["plain"])
        bc = statistics.median(x[1] for x in res["plain"])
        for name, xs in res.items():
            me = statistics.median(x[0] for x in xs)
            mc = statistics.median(x[1] for x in xs)
            sw = statistics.median(x[2] / x[0] for x in xs)
            print(f"{rate:>8} {name:34} {sw:11,.0f} {me:10.3f} {me / be:6.3f} {mc:7.3f} "
                  f"{mc / bc:6.3f}  {notes.get(name, '')}")
        if not perf:
            print(f"{rate:>8} perf is not installed: no comparison")
        elif not off_cpu:
            print(f"{rate:>8} perf record --off-cpu: not supported by this perf (no BPF)")
        time.sleep(0.1)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
