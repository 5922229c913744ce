"""Benchmark: the cost of ``callpath run -e gpu=nvidia`` on a PyTorch training loop, against
``torch.profiler`` in the same run (needs an NVIDIA GPU, PyTorch and CUPTI).

Three ways of running ``tests/gpu_programs/train.py`` (a small MLP, ``--steps`` steps), each
``--repeat`` times, interleaved so that clocks and caches drift alike for all:

* ``plain``          - the program alone;
* ``callpath``       - ``callpath run -e gpu=nvidia -t`` (CPU sampling at 1 kHz, every kernel,
  copy, memset and synchronization with its calling context, the GPU streams' traces, and
  the conversion after the run);
* ``callpath-cpu``   - ``callpath run -t`` without ``-e gpu=nvidia`` (the CPU sampler alone:
  what the GPU measurement adds is the difference to ``callpath``);
* ``torch.profiler`` - the same loop inside ``torch.profiler.profile`` with CPU and CUDA
  activities, and its chrome trace written.

Two figures each, medians: ``steps`` (the loop's own wall time, printed by the program) and
``process`` (the whole command, start to exit, post-processing included). Ratios are against
``plain``. Prints one JSON object (``--json FILE`` writes it too).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "tests" / "gpu_programs" / "train.py"


def _run(cmd: list[str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    steps = [float(line.split("=", 1)[1]) for line in res.stdout.splitlines()
             if line.startswith("steps_s=")]
    return (steps[-1] if steps else float("nan")), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    py = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="callpath-gpu-bench-"))
    modes = {
        "plain": lambda i: [py, str(TRAIN), "--steps", str(args.steps)],
        "callpath": lambda i: [py, "-m", "callpath", "run", "-e", "gpu=nvidia", "-t",
                               "--top", "0", "-o", str(tmp / f"m{i}"), "--", py, str(TRAIN),
                               "--steps", str(args.steps)],
        "callpath-cpu": lambda i: [py, "-m", "callpath", "run", "-t", "--top", "0", "-o",
                                   str(tmp / f"c{i}"), "--", py, str(TRAIN), "--steps",
                                   str(args.steps)],
        "torch.profiler": lambda i: [py, str(TRAIN), "--steps", str(args.steps),
                                     "--torch-profiler", str(tmp / f"tp{i}.json")],
    }
    got: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for i in range(args.repeat):
        for m, cmd in modes.items():
            got[m].append(_run(cmd(i)))
    out: dict[str, object] = {"steps": args.steps, "repeat": args.repeat}
    base_s = statistics.median(s for s, _ in got["plain"])
    base_w = statistics.median(w for _, w in got["plain"])
    for m, runs in got.items():
        s = statistics.median(x for x, _ in runs)
        w = statistics.median(x for _, x in runs)
        out[m] = {"steps_s": round(s, 4), "process_s": round(w, 3),
                  "steps_ratio": round(s / base_s, 3), "process_ratio": round(w / base_w, 3)}
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
