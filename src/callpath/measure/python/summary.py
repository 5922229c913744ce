"""The quick summary printed after a Python program was measured (until ``callpath prof``).

It answers the first questions without building a database: what was measured (processes,
threads, samples, CPU and wall-clock time, how much of it idle), and where the CPU time went,
by source line and by function (self time, i.e. the innermost Python frame of each sample).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from callpath.formats import measdir

IDLE = int(measdir.NodeFlag.IDLE)


@dataclass
class LineCost:
    file: str
    line: int
    function: str
    cpu_ns: float
    wall_ns: float
    samples: int


@dataclass
class Totals:
    processes: int
    threads: int
    samples: int
    cpu_ns: float
    wall_ns: float
    idle_wall_ns: float
    incomplete: int  # process files without an END chunk (killed)


def _metric_columns(m: measdir.Measurement) -> tuple[int, int]:
    names = [x.name for x in m.metrics]
    cpu = names.index("CPUTIME") if "CPUTIME" in names else 0
    wall = names.index("REALTIME") if "REALTIME" in names else min(1, len(names) - 1)
    return cpu, wall


def python_processes(m: measdir.Measurement) -> list[measdir.ProcessProfile]:
    return [p for p in m.processes if p.info.get("language") == "python"]


def line_costs(m: measdir.Measurement, *, busy_only: bool = False) -> list[LineCost]:
    """Cost whose innermost Python frame is each (file, line, function), all threads summed,
    most CPU first. ``busy_only`` leaves out samples that found their thread idle."""
    cpu_i, wall_i = _metric_columns(m)
    acc: dict[tuple[str, int, str], list[float]] = {}
    for proc in python_processes(m):
        for t in proc.threads:
            if not len(t.nodes):
                continue
            kind = t.nodes["kind"]
            has = (t.samples.sum(axis=1) > 0) & (kind == measdir.NodeKind.PYTHON)
            if busy_only:
                has &= (t.nodes["flags"] & IDLE) == 0
            for n in np.flatnonzero(has):
                code = proc.pycode[int(t.nodes["module"][n])]
                key = (code.file, int(t.nodes["address"][n]), code.function)
                a = acc.setdefault(key, [0.0, 0.0, 0.0])
                a[0] += float(t.values[n, cpu_i])
                a[1] += float(t.values[n, wall_i])
                a[2] += float(t.samples[n, cpu_i])
    out = [LineCost(f, ln, fn, v[0], v[1], int(v[2])) for (f, ln, fn), v in acc.items()]
    out.sort(key=lambda c: (-c.cpu_ns, -c.wall_ns, c.file, c.line))
    return out


def totals(m: measdir.Measurement) -> Totals:
    cpu_i, wall_i = _metric_columns(m)
    procs = python_processes(m)
    n_threads = samples = 0
    cpu = wall = idle = 0.0
    for proc in procs:
        for t in proc.threads:
            n_threads += 1
            if not len(t.nodes):
                continue
            samples += int(t.samples[:, cpu_i].sum())
            cpu += float(t.values[:, cpu_i].sum())
            wall += float(t.values[:, wall_i].sum())
            idle += float(t.values[(t.nodes["flags"] & IDLE) != 0, wall_i].sum())
    return Totals(len(procs), n_threads, samples, cpu, wall, idle,
                  sum(1 for p in procs if not p.complete))


def _short(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def print_summary(out_dir: Path, status: int, file: TextIO | None = None, top: int = 10) -> None:
    """Print the quick summary of a finished measurement directory."""
    f = file or sys.stderr
    m = measdir.read(out_dir)
    tot = totals(m)
    freq = m.header.get("frequency", "?")
    f.write(f"callpath: measured {' '.join(m.header.get('command', []))} into {out_dir} "
            f"(exit status {status})\n")
    f.write(f"  {tot.processes} Python process(es), {tot.threads} thread(s), {tot.samples} "
            f"samples at {freq} Hz; CPU {tot.cpu_ns / 1e9:.3f} s, wall {tot.wall_ns / 1e9:.3f} s"
            f" over all threads, {100 * tot.idle_wall_ns / max(tot.wall_ns, 1):.1f}% of it "
            f"idle\n")
    if tot.incomplete:
        f.write(f"  {tot.incomplete} process(es) ended without closing their file (killed): "
                "their data up to the last flush are kept\n")
    procs = python_processes(m)
    if len(procs) > 1:
        cpu_i, _ = _metric_columns(m)
        f.write("      pid  rank  threads   CPU s  how      command\n")
        for p in procs:
            cpu = sum(float(t.values[:, cpu_i].sum()) for t in p.threads if len(t.nodes))
            rank = p.info.get("rank")
            how = "fork" if p.info.get("forked_from") else "exec"
            argv = " ".join(str(a) for a in p.info.get("argv", []))
            f.write(f"  {p.pid:7d}  {'-' if rank is None else rank:>4}  {len(p.threads):7d}  "
                    f"{cpu / 1e9:6.3f}  {how:7s}  {argv[:60]}\n")
    lines = line_costs(m)
    if lines and tot.cpu_ns > 0:
        f.write("  hottest lines by CPU time (innermost Python frame):\n")
        for c in lines[:top]:
            if c.cpu_ns <= 0:
                break
            f.write(f"    {100 * c.cpu_ns / tot.cpu_ns:5.1f}%  {c.cpu_ns / 1e9:8.3f} s  "
                    f"{_short(c.file)}:{c.line}  {c.function}\n")
