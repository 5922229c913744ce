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

Where the whole command's time goes, medians per configuration (``phases``): ``startup``
from the command's start to the program's first line (the interpreter, and callpath's
launcher and bootstrap), ``work`` from there to the end of its loop (``import torch``, CUDA's
start, the steps), ``exit`` from there to the program's end as callpath's launcher saw it
(the interpreter's and CUDA's teardown, CUPTI's flush), ``after`` from the program's end to
the command's (callpath's conversion and summary; ``exit`` and ``after`` are one figure,
``exit``, where there is no launcher). For ``callpath``, ``gpu_cost`` holds the CUPTI
library's own accounting of its time (``measurement.json``'s ``gpu.summary.cost``: the
callbacks at launches, the activity records, the GPU binaries, CUPTI's start and its flush)
and the conversion's time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "tests" / "gpu_programs" / "train.py"


def _run(cmd: list[str]) -> dict[str, float]:
    """One run: steps, whole command and phases (see the module doc), in seconds; for
    callpath (its ``-o`` measurement directory) the library's cost figures too."""
    meas = Path(cmd[cmd.index("-o") + 1]) if "-o" in cmd else None
    t0, w0 = time.perf_counter(), time.time()
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    w1 = w0 + wall
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    said = dict(line.split("=", 1) for line in res.stdout.splitlines()
                if line.split("=", 1)[0] in ("steps_s", "start_time", "loop_end_time"))
    start, loop_end = float(said.get("start_time", "nan")), float(said.get("loop_end_time", "nan"))
    out = {"steps_s": float(said.get("steps_s", "nan")), "process_s": wall,
           "startup_s": start - w0, "work_s": loop_end - start, "exit_s": w1 - loop_end}
    if meas is not None:
        header = json.loads((meas / "measurement.json").read_text())
        end = float(header.get("program_end_time") or "nan")
        out["exit_s"], out["after_s"] = end - loop_end, w1 - end
        gpu = header.get("gpu") or {}
        cost = (gpu.get("summary") or {}).get("cost") or {}
        launches = cost.get("launches") or 0
        if launches:
            out["us_per_launch"] = cost.get("calls_ns", 0) / launches / 1e3
        for key in ("calls_ns", "records_ns", "bins_ns", "start_ns", "exit_ns"):
            if key in cost:
                out[key.replace("_ns", "_s")] = cost[key] / 1e9
        for key in ("launches", "bins", "bins_bytes"):
            if key in cost:
                out[key] = float(cost[key])
        if "convert_s" in gpu:
            out["convert_s"] = float(gpu["convert_s"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the same loop on the CPU, without the callpath -e gpu=nvidia "
                         "configuration (what the CPU sampler and callpath's launcher and "
                         "conversion cost the whole command, on any machine)")
    args = ap.parse_args()
    py = sys.executable
    tmp = Path(tempfile.mkdtemp(prefix="callpath-gpu-bench-"))
    prog = [str(TRAIN), "--steps", str(args.steps), "--device", args.device]
    modes: dict[str, Callable[[int], list[str]]] = {
        "plain": lambda i: [py, *prog],
        "callpath": lambda i: [py, "-m", "callpath", "run", "-e", "gpu=nvidia", "-t",
                               "--top", "0", "-o", str(tmp / f"m{i}"), "--", py, *prog],
        "callpath-cpu": lambda i: [py, "-m", "callpath", "run", "-t", "--top", "0", "-o",
                                   str(tmp / f"c{i}"), "--", py, *prog],
        "torch.profiler": lambda i: [py, *prog, "--torch-profiler", str(tmp / f"tp{i}.json")],
    }
    if args.device == "cpu":
        del modes["callpath"]
    got: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for i in range(args.repeat):
        for m, cmd in modes.items():
            got[m].append(_run(cmd(i)))
    out: dict[str, object] = {"steps": args.steps, "repeat": args.repeat,
                              "device": args.device}

    def median(runs: list[dict[str, float]], key: str) -> float:
        return statistics.median(r.get(key, float("nan")) for r in runs)

    base_s, base_w = median(got["plain"], "steps_s"), median(got["plain"], "process_s")
    for m, runs in got.items():
        s, w = median(runs, "steps_s"), median(runs, "process_s")
        phases = {k: round(median(runs, k), 3) for k in ("startup_s", "work_s", "exit_s",
                                                          "after_s") if k in runs[0]}
        entry: dict[str, object] = {
            "steps_s": round(s, 4), "process_s": round(w, 3), "steps_ratio": round(s / base_s, 3),
            "process_ratio": round(w / base_w, 3), "phases": phases}
        cost = sorted({k for r in runs for k in r} - {"steps_s", "process_s", *phases})
        if cost:
            entry["gpu_cost"] = {k: round(median(runs, k), 4) for k in cost}
        out[m] = entry
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
