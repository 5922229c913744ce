"""Overhead of attaching to a running Python program: ``callpath run --pid`` vs ``py-spy record
--pid``, same program, same run.

The workload (a CPU-bound pure-Python loop, one thread, a fixed amount of work calibrated to
about ``--seconds``) prints ``ready``, then its own wall time when done. Each repeat starts it
once per mode, in rotating order — plain (nothing attached), callpath (``run --pid``, 100 Hz:
the remote reader), py-spy (``record --pid -r 100``, which pauses the program for each sample
by default) and py-spy ``--nonblocking`` — attaches right after ``ready``, and lets the tool run
until the program exits. The figure is the program's own wall time: medians over the repeats,
and ratios to plain's median, with the tools' own CPU seconds. py-spy is installed on first use
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
    print(f"WALL {time.perf_counter() - t0:.6f}", flush=True)
main(int(sys.argv[1]))
'''


def calibrate(script: Path, seconds: float) -> int:
    out = subprocess.run([sys.executable, str(script), "20"], capture_output=True, text=True,
                         check=True).stdout
    per = float(out.split("WALL")[1]) / 20
    return max(1, round(seconds / per))


def one(script: Path, rounds: int, tool: list[str] | None) -> tuple[float, float]:
    """(the program's wall seconds, the tool's CPU seconds)."""
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
    if t is not None:
        t.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    wall = float(out.split("WALL")[1])
    return wall, cpu  # the program's and the tool's CPU together


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
    results: dict[str, list[tuple[float, float]]] = {}
    names = ["plain", "callpath 100 Hz"]
    if spy is not None and Path(spy).exists():
        names += ["py-spy 100 Hz", "py-spy 100 Hz nonblocking"]
    else:
        print("py-spy is not available: callpath alone", file=sys.stderr)
    for k in range(args.repeat):
        order = names[k % len(names):] + names[:k % len(names)]
        for name in order:
            if name == "plain":
                cmd = None
            elif name.startswith("callpath"):
                cmd = callpath_cmd()
            else:
                cmd = [str(spy), "record", "-r", "100", "-o", str(tmp / f"s{next(counter)}.svg")]
                if "nonblocking" in name:
                    cmd.append("--nonblocking")
                cmd.append("--pid")
            results.setdefault(name, []).append(one(script, rounds, cmd))
    plain = statistics.median(w for w, _ in results["plain"])
    print(f"program wall time, medians of {args.repeat} (plain {plain:.3f} s); machine: "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'mode':28} {'wall s':>8} {'ratio':>7} {'CPU s (program + tool)':>24}")
    for name in names:
        w = statistics.median(x for x, _ in results[name])
        c = statistics.median(x for _, x in results[name])
        print(f"{name:28} {w:8.3f} {w / plain:7.3f} {c:24.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
