"""Overhead of attaching to a running Python program: ``callpath run --pid`` vs ``py-spy record
--pid``, same program, same run.

The workload (a CPU-bound pure-Python loop, one thread, a fixed amount of work calibrated to
about ``--seconds``) prints ``ready``, then its own wall and CPU time when done. Each repeat
starts it once per mode, in rotating order — plain (nothing attached), callpath
(``run --pid``, 100 Hz: the remote reader), callpath ``--native`` (the reader plus perf_event
samples of the native stack, 100 Hz of CPU time, unwound after the program ends), py-spy
(``record --pid -r 100``, which pauses the program for each sample by default), py-spy
``--nonblocking`` and py-spy ``--native`` (pauses, and unwinds the native stack at each
sample) — attaches right after ``ready``, and lets the tool run until the program exits. The
figures are medians over the repeats: the program's own wall time and CPU time (ratios to
plain's), and the tool's CPU time (start-up and post-processing included); on a loaded machine
the CPU times are the steadier figures. py-spy is installed on first use
into ``bench/.env-pyprof`` (as ``measure_python.py`` does: a peer, never a dependency).

    .venv/bin/python bench/attach_python.py [--repeat 5] [--seconds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

WORK = '''
import sys, time
def kernel(n):
    s = 0
    for i in range(n):
        s += i * i % 7
    return s
def main(rounds):
    print("ready", flush=True)
    t0 = time.perf_counter()
    for _ in range(rounds):
        kernel(100000)
    print(f"WALL {time.perf_counter() - t0:.6f} CPU {time.process_time():.6f}", flush=True)
main(int(sys.argv[1]))
'''


def calibrate(script: Path, seconds: float) -> int:
    out = subprocess.run([sys.executable, str(script), "20"], capture_output=True, text=True,
                         check=True).stdout
    per = float(out.split("CPU")[1]) / 20  # CPU time: the wall time of a loaded machine varies
    return max(1, round(seconds / per))


def one(script: Path, rounds: int, tool: list[str] | None) -> tuple[float, float, float]:
    """(the program's wall seconds, its own CPU seconds, the tool's CPU seconds)."""
    prog = subprocess.Popen([sys.executable, str(script), str(rounds)], stdout=subprocess.PIPE,
                            text=True)
    assert prog.stdout is not None
    assert prog.stdout.readline() == "ready\n"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = None
    if tool is not None:
        t = subprocess.Popen([*tool, str(prog.pid)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    out = prog.stdout.read()
    prog.wait()
    mid = resource.getrusage(resource.RUSAGE_CHILDREN)
    if t is not None:
        t.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    prog_cpu = (mid.ru_utime + mid.ru_stime) - (before.ru_utime + before.ru_stime)
    tool_cpu = (after.ru_utime + after.ru_stime) - (mid.ru_utime + mid.ru_stime)
    wall = float(out.split("WALL")[1].split()[0])
    return wall, prog_cpu, tool_cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    from measure_python import peer_python

    tmp = Path(tempfile.mkdtemp(prefix="callpath-attach-bench-"))
    script = tmp / "work.py"
    script.write_text(WORK)
    rounds = calibrate(script, args.seconds)
    env_src = str(REPO / "src")
    os.environ["PYTHONPATH"] = env_src + os.pathsep + os.environ.get("PYTHONPATH", "")
    counter = iter(range(1 << 30))

    def callpath_cmd() -> list[str]:
        return [sys.executable, "-m", "callpath", "run", "--top", "0", "-o",
                str(tmp / f"m{next(counter)}"), "--pid"]

    peer = peer_python()
    spy = str(peer.parent / "py-spy") if peer is not None else None
    results: dict[str, list[tuple[float, float, float]]] = {}
    names = ["plain", "callpath 100 Hz", "callpath 100 Hz --native"]
    if spy is not None and Path(spy).exists():
        names += ["py-spy 100 Hz", "py-spy 100 Hz nonblocking", "py-spy 100 Hz --native"]
    else:
        print("py-spy is not available: callpath alone", file=sys.stderr)
    for k in range(args.repeat):
        order = names[k % len(names):] + names[:k % len(names)]
        for name in order:
            if name == "plain":
                cmd = None
            elif name.startswith("callpath"):
                cmd = callpath_cmd()
                if "--native" in name:
                    cmd[-1:-1] = ["--native"]
            else:
                cmd = [str(spy), "record", "-r", "100", "-o", str(tmp / f"s{next(counter)}.svg")]
                if "nonblocking" in name:
                    cmd.append("--nonblocking")
                if "--native" in name:
                    cmd.append("--native")
                cmd.append("--pid")
            results.setdefault(name, []).append(one(script, rounds, cmd))
    plain = statistics.median(w for w, _, _ in results["plain"])
    plain_cpu = statistics.median(c for _, c, _ in results["plain"])
    print(f"program wall time, medians of {args.repeat} (plain {plain:.3f} s); machine: "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print("program CPU: its own CPU time (the time the tool makes it spend, in the kernel's "
          "sampling or stopped, included); tool CPU: the tool's, start-up and post-processing "
          "included")
    print(f"{'mode':28} {'wall s':>8} {'ratio':>7} {'program CPU s':>14} {'ratio':>7} "
          f"{'tool CPU s':>11}")
    for name in names:
        w = statistics.median(x for x, _, _ in results[name])
        c = statistics.median(x for _, x, _ in results[name])
        tc = statistics.median(x for _, _, x in results[name])
        print(f"{name:28} {w:8.3f} {w / plain:7.3f} {c:14.3f} {c / plain_cpu:7.3f} "
              f"{tc:11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
