"""What sampling costs a Python program while it starts: ``import torch`` (or any modules) plain
and under callpath, py-spy and pyinstrument at the same rate; with ``--train``, the steps of a
PyTorch training loop after it.

A program's start is the worst case of an in-process sampler: every sample meets new code and
a new stack, which steady-state benchmarks (``measure_python.py``) never show. The program is
one ``import`` statement, timed from inside (``perf_counter`` and process CPU time around it);
``gc.callbacks`` count the garbage collector's young and full collections during it, because
an in-process sampler that allocates containers brings collections forward (a full one costs
~70 ms at the end of ``import torch``). Configurations run interleaved, in a new order every
round, ``--repeat`` rounds; the table gives medians and their ratios to plain's.

py-spy samples from another process: its cost to the program is the pauses (``record``
pauses the process to read it; ``--nonblocking`` does not), never allocations. pyinstrument
runs in the process (``setstatprofile``, a C profile hook that takes a sample per interval).
Both are installed on first use into ``bench/.env-pyprof`` (as ``measure_python.py`` does);
pyinstrument runs on the program's interpreter through that environment's site-packages, so
``--python`` must be the same minor version as the interpreter running this script.

``--train SECONDS`` times the steps of ``torch_profile.py``'s training loop (one thread, so
that the CPU figures are the program's) for that long after setup instead, and counts the
collections during the steps only: a loop calls its model's Python frames anew every step,
and a sampler that creates a frame object for each of them brings collections forward there
too. The figure is the steps done in that time.

    python bench/startup_python.py --python /work/torchenv/bin/python --modules torch
    python bench/startup_python.py --python /work/torchenv/bin/python --train 3
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measure_python import REPO, peer_python
from torch_profile import TRAIN

PROGRAM = """
import gc, sys, time
counts = [0, 0, 0]
gc.callbacks.append(lambda phase, info: phase == "stop" and counts.__setitem__(
    info["generation"], counts[info["generation"]] + 1))
t0 = time.perf_counter(); c0 = time.process_time()
import {modules}
c1 = time.process_time(); t1 = time.perf_counter()
print(f"STARTUP {{t1 - t0:.4f}} {{c1 - c0:.4f}} {{counts[0]}} {{counts[2]}}")
"""

# the training loop, with the collections counted during its steps only
PROGRAM_TRAIN = """
import gc, sys, time
counts = [0, 0, 0]
def count(phase, info):
    if phase == "stop":
        counts[info["generation"]] += 1
""" + TRAIN.replace("torch.set_num_threads(2)", "torch.set_num_threads(1)").replace(
    "t0 = time.perf_counter()", "gc.callbacks.append(count); c0 = time.process_time()\n"
    "t0 = time.perf_counter()") + """
print(f"STARTUP {steps} {time.process_time() - c0:.4f} {counts[0]} {counts[2]}")
"""

LINE = re.compile(r"STARTUP ([\d.]+) ([\d.]+) (\d+) (\d+)")


def configurations(py: str, script: list[str], tmp: Path, hz: int, peer: Path | None,
                   before: str | None) -> dict[str, list[str]]:
    """Name -> command line; ``{i}`` in an argument stands for the run number."""
    def callpath(src: Path | str, out: str) -> list[str]:
        return ["env", f"PYTHONPATH={src}", py, "-m", "callpath", "run", "-e",
                f"cpu-clock@f{hz}", "-o", str(tmp / out), "--", py, *script]
    cfg = {"plain": [py, *script], f"callpath {hz} Hz": callpath(REPO / "src", "cp-{i}")}
    if before:
        cfg[f"callpath {hz} Hz, --before"] = callpath(before, "cpb-{i}")
    if peer is not None:
        spy = str(peer.parent / "py-spy")
        cfg[f"py-spy {hz} Hz"] = [spy, "record", "-r", str(hz), "-o",
                                  str(tmp / "spy-{i}.svg"), "--", py, *script]
        cfg[f"py-spy {hz} Hz nonblocking"] = [spy, "record", "-r", str(hz), "--nonblocking",
                                              "-o", str(tmp / "spyn-{i}.svg"), "--", py,
                                              *script]
        site = subprocess.run([str(peer), "-c", "import sysconfig; print(sysconfig.get_paths()"
                               "['platlib'])"], capture_output=True, text=True, check=True)
        cfg[f"pyinstrument {hz} Hz"] = ["env", f"PYTHONPATH={site.stdout.strip()}", py, "-m",
                                        "pyinstrument", "-i", str(1 / hz), "-r", "text", "-o",
                                        str(tmp / "pyi-{i}.txt"), *script]
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default=sys.executable, help="the program's interpreter")
    ap.add_argument("--modules", default="torch", help="what the program imports (a, b.c)")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--hz", type=int, default=1000)
    ap.add_argument("--no-peers", action="store_true", help="callpath and plain only")
    ap.add_argument("--train", type=float, metavar="SECONDS",
                    help="time the steps of a training loop instead of the import")
    ap.add_argument("--before", metavar="SRC", help="also callpath from this source tree (a "
                    "checkout's src/, its C extensions built) in the same rounds")
    args = ap.parse_args()
    probe = subprocess.run([args.python, "-c", "import sys; print(sys.version_info[:2])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    same = probe == str(sys.version_info[:2])
    peer = None if args.no_peers else peer_python()
    if peer is not None and not same:
        print(f"peers skipped: {args.python} is Python {probe}, this script runs "
              f"{sys.version_info[:2]} (pyinstrument's build must match)", file=sys.stderr)
        peer = None
    with tempfile.TemporaryDirectory(prefix="cp-startup-") as d:
        tmp = Path(d)
        program = tmp / "program.py"
        if args.train:
            program.write_text(PROGRAM_TRAIN)
            script = [str(program), str(args.train)]
        else:
            program.write_text(PROGRAM.format(modules=args.modules))
            script = [str(program)]
        cfg = configurations(args.python, script, tmp, args.hz, peer, args.before)
        got: dict[str, list[tuple[float, float, int, int]]] = {k: [] for k in cfg}
        failed: dict[str, str] = {}
        for r in range(args.repeat):
            order = list(cfg)
            random.Random(r).shuffle(order)
            for name in order:
                cmd = [a.replace("{i}", str(r)) for a in cfg[name]]
                p = subprocess.run(cmd, capture_output=True, text=True, check=False)
                m = LINE.search(p.stdout + p.stderr)
                if p.returncode != 0 or m is None:
                    failed[name] = (p.stderr.strip().splitlines() or ["failed"])[-1][:100]
                    continue
                got[name].append((float(m[1]), float(m[2]), int(m[3]), int(m[4])))
            print(f"  round {r + 1}/{args.repeat}", file=sys.stderr)
    load = os.getloadavg()[0]
    what = (f"{args.train:g} s of training steps" if args.train else f"import {args.modules}")
    print(f"{what} ({args.python}, Python {probe.strip('()').replace(', ', '.')}), medians of "
          f"{args.repeat} interleaved rounds, load average {load:.2f}; "
          f"{sysconfig.get_platform()}")
    first = "steps" if args.train else "import s"
    # the import: its time and CPU time over plain's; the steps: plain's count over this one's
    # (the time a step takes, relative), and the CPU time of the steps
    print(f"{'configuration':30s} {first:>9s} {'ratio':>6s} {'CPU s':>7s} {'ratio':>6s} "
          f"{'young':>6s} {'full':>5s}")
    base = got.get("plain") or []
    if not base:
        print(f"plain failed: {failed.get('plain', '?')}")
        return 1
    b_first = statistics.median(x[0] for x in base)
    b_cpu = statistics.median(x[1] for x in base)
    for name, runs in got.items():
        if not runs:
            print(f"{name:30s} failed: {failed.get(name, '?')}")
            continue
        v = statistics.median(x[0] for x in runs)
        cpu = statistics.median(x[1] for x in runs)
        young = statistics.median(x[2] for x in runs)
        full = statistics.median(x[3] for x in runs)
        ratio = b_first / v if args.train else v / b_first
        shown = f"{v:9.0f}" if args.train else f"{v:9.3f}"
        print(f"{name:30s} {shown} {ratio:6.3f} {cpu:7.3f} {cpu / b_cpu:6.3f} "
              f"{young:6.0f} {full:5.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
