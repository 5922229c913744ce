"""The quick summary printed after a Python program was measured (until ``callpath prof``).

It answers the first questions without building a database: what was measured (processes,
threads, samples, CPU and wall-clock time, how much of it idle), and where the CPU time went,
by source line and by function (self time, i.e. the innermost Python frame of each sample).
"""

from __future__ import annotations

import os
import sys
import textwrap
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


def _innermost_python(nodes: np.ndarray) -> np.ndarray:
    """Per node, the nearest PYTHON node on its path (itself included), or -1: under
    ``--native`` a sample's leaf may be native code that a Python line called."""
    parent = nodes["parent"].astype(np.int64)
    is_py = nodes["kind"] == measdir.NodeKind.PYTHON
    owner = np.where(is_py, np.arange(len(nodes)), -1)
    open_ = np.flatnonzero(~is_py)
    anc = parent[open_]
    while len(open_):  # one step up per round: as many rounds as native frames in a row
        live = anc >= 0
        open_, anc = open_[live], anc[live]
        found = is_py[anc]
        owner[open_[found]] = anc[found]
        open_, anc = open_[~found], parent[anc[~found]]
    return owner


def line_costs(m: measdir.Measurement, *, busy_only: bool = False) -> list[LineCost]:
    """Cost whose innermost Python frame is each (file, line, function), all threads summed,
    most CPU first. ``busy_only`` leaves out samples that found their thread idle."""
    cpu_i, wall_i = _metric_columns(m)
    acc: dict[tuple[str, int, str], list[float]] = {}
    for proc in python_processes(m):
        for t in proc.threads:
            if not len(t.nodes):
                continue
            owner = _innermost_python(t.nodes)
            has = (t.samples.sum(axis=1) > 0) & (owner >= 0)
            if busy_only:
                has &= (t.nodes["flags"] & IDLE) == 0
            for n in np.flatnonzero(has):
                o = int(owner[n])
                code = proc.pycode[int(t.nodes["module"][o])]
                key = (code.file, int(t.nodes["address"][o]), code.function)
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


def function_costs(lines: list[LineCost]) -> list[tuple[str, str, float, int]]:
    """Self CPU time per (file, function), from the per-line costs; most first."""
    acc: dict[tuple[str, str], list[float]] = {}
    for c in lines:
        a = acc.setdefault((c.file, c.function), [0.0, 0.0])
        a[0] += c.cpu_ns
        a[1] += c.samples
    out = [(f, fn, v[0], int(v[1])) for (f, fn), v in acc.items()]
    out.sort(key=lambda x: (-x[2], x[0], x[1]))
    return out


def print_summary(out_dir: Path, status: int, file: TextIO | None = None, top: int = 10,
                  wall_s: float | None = None) -> None:
    """Print the quick summary of a finished measurement directory, in the style of
    ``callpath run``'s closing words: a paragraph, one line per execution context, then the
    functions and lines with the most CPU time."""
    from callpath.measure.run_summary import MAX_CONTEXT_LINES, describe_status

    f = file or sys.stderr
    m = measdir.read(out_dir)
    tot = totals(m)
    cpu_i, wall_i = _metric_columns(m)
    freq = m.header.get("frequency", 0)
    after = f" after {wall_s:.2f} s" if wall_s is not None else ""
    parts = [f"The program {describe_status(status if status < 128 else 128 - status)}{after},"
             f" sampled at {float(freq):g} Hz of wall-clock time in every Python thread.",
             f"{tot.samples} samples in {tot.threads} execution contexts ({tot.processes} Python "
             f"processes); CPU time {tot.cpu_ns / 1e9:.3f} s, wall-clock time "
             f"{tot.wall_ns / 1e9:.3f} s summed over threads, "
             f"{100 * tot.idle_wall_ns / max(tot.wall_ns, 1):.1f}% of it idle."]
    if tot.incomplete:
        parts.append(f"{tot.incomplete} processes ended without closing their files (killed): "
                     "their data up to the last flush are kept.")
    parts.append(f"Measurement directory: {out_dir}")
    f.write(textwrap.fill("callpath: " + " ".join(parts), width=100) + "\n")
    rows = []
    for p in python_processes(m):
        for t in p.threads:
            if len(t.nodes):
                rows.append((p, t, float(t.values[:, cpu_i].sum()),
                             float(t.values[:, wall_i].sum())))
    rows.sort(key=lambda r: -r[2])
    for p, t, cpu, wall in rows[:MAX_CONTEXT_LINES]:
        rank = p.info.get("rank")
        rank_s = f"rank {rank} " if rank is not None else ""
        how = " forked" if p.info.get("forked_from") else ""
        f.write(f"  {rank_s}pid {p.pid}{how} thread {t.slot} (tid {t.tid}, "
                f"{t.info.get('name', '')}): {int(t.stats.get('samples', 0))} samples, "
                f"{int(t.stats.get('idle_samples', 0))} idle, CPU {cpu / 1e9:.3f} s, "
                f"wall {wall / 1e9:.3f} s\n")
    if len(rows) > MAX_CONTEXT_LINES:
        f.write(f"  ... and {len(rows) - MAX_CONTEXT_LINES} more contexts\n")
    lines = line_costs(m)
    if top and lines and tot.cpu_ns > 0:
        f.write("Top Python functions by CPU time (self):\n")
        for file_, fn, cpu, n in function_costs(lines)[:top]:
            if cpu <= 0:
                break
            f.write(f"  {100 * cpu / tot.cpu_ns:6.2f}%  {cpu / 1e9:8.3f} s  {n:7d}  {fn}  "
                    f"[{_short(file_)}]\n")
        f.write("Top lines by CPU time:\n")
        for c in lines[:top]:
            if c.cpu_ns <= 0:
                break
            f.write(f"  {100 * c.cpu_ns / tot.cpu_ns:6.2f}%  {c.cpu_ns / 1e9:8.3f} s  "
                    f"{c.samples:7d}  {_short(c.file)}:{c.line}  {c.function}\n")
    f.flush()
