"""The closing words of ``callpath run``: one paragraph about the measurement, per-context
counts, and a quick flat profile (top procedures by samples, from the ELF symbol tables) so a
measurement can be checked by eye before ``callpath prof`` exists."""

from __future__ import annotations

import signal
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from callpath.measure.offcpu import ThreadTime
    from callpath.measure.perf_launch import RunResult
    from callpath.measure.postmortem import Result, ThreadSummary

MAX_CONTEXT_LINES = 16
#: more switches than this times the switch samples: the kernel's cap on stack samples per
#: second (``launch.switch_spec``) took over, and the summary says so. Below it, the few extra
#: switches are the frequency mode's first adjustments.
CAP_RATIO = 1.05


def describe_status(status: int) -> str:
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def print_summary(out: Path, res: Result, run: RunResult | None, top: int,
                  stream: TextIO) -> None:
    procs = len({t.pid for t in res.threads})
    parts = []
    if run is not None:
        ev = ", ".join(dict.fromkeys(e.spec.name for e in run.events))
        parts.append(f"The program {describe_status(run.exit_status)} after "
                     f"{run.wall_s:.2f} s, sampled on {ev}.")
        if run.switch_capped_s > 0:
            parts.append(f"For {run.switch_capped_s:.2f} s the program switched too often "
                         "for a record and a call path at every context switch: they were "
                         "sampled (capped) and its threads' time off CPU estimated from "
                         "their CPU time (each thread's line says when).")
    pct = 100.0 * res.partial / res.samples if res.samples else 0.0
    why = ""
    if res.partial_reasons:
        why = " (" + ", ".join(f"{k}: {v}" for k, v in
                               sorted(res.partial_reasons.items(), key=lambda x: -x[1])) + ")"
    parts.append(f"{res.samples} samples in {len(res.threads)} execution contexts "
                 f"({procs} process{'es' if procs != 1 else ''}); "
                 f"{res.lost} samples lost in the ring buffers; "
                 f"throttled {res.throttled} times; {res.partial} partial call paths "
                 f"({pct:.1f}%){why}.")
    if res.bad:
        parts.append(f"{res.bad} records could not be decoded.")
    parts.extend(_unwind_sources(res))
    parts.extend(_offcpu(res))
    parts.append(f"Measurement directory: {out}")
    stream.write(textwrap.fill("callpath: " + " ".join(parts), width=100) + "\n")
    rows = sorted(res.threads, key=lambda t: -t.samples)
    for t in rows[:MAX_CONTEXT_LINES]:
        rank = f"rank {t.rank} " if t.rank is not None else ""
        prog = f" {t.program}" if t.program else ""
        named = f", {t.name}" if t.name else ""
        stream.write(f"  {rank}pid {t.pid}{prog} thread {t.index} (tid {t.tid}{named}): "
                     f"{t.samples} samples"
                     f", {t.partial} partial{_life(t)}\n")
    if len(rows) > MAX_CONTEXT_LINES:
        stream.write(f"  ... and {len(rows) - MAX_CONTEXT_LINES} more contexts\n")
    if top and res.flat:
        total = sum(c for _, _, c in res.flat)
        stream.write(f"Top procedures by samples (first metric, {total} samples):\n")
        for name, module, count in res.flat[:top]:
            stream.write(f"  {100.0 * count / total:6.2f}%  {count:8d}  {name}  [{module}]\n")
    stream.flush()


def _life(t: ThreadSummary) -> str:
    """-e REALTIME: how the thread's life divides between CPU, blocked and preempted."""
    tt = t.time
    if tt is None or tt.wall <= 0:
        return ""
    pct = 100.0 / tt.wall
    pre = tt.off - tt.blocked - tt.estimated_off
    return (f"; wall {tt.wall / 1e9:.3f} s: on CPU {tt.cpu / 1e9:.3f} s "
            f"({tt.cpu * pct:.0f}%), blocked {tt.blocked / 1e9:.3f} s ({tt.blocked * pct:.0f}%), "
            f"preempted {pre / 1e9:.3f} s ({pre * pct:.0f}%)"
            + _estimated(tt))


def _estimated(tt: ThreadTime) -> str:
    """Where the switch records were off (the program switched above the cap): from when,
    for how long, the thread's time off CPU was estimated (and not split blocked/preempted)."""
    if tt.estimated <= 0:
        return ""
    return (f", estimated off CPU {tt.estimated_off / 1e9:.3f} s "
            f"({tt.estimated_off * 100.0 / tt.wall:.0f}%: in {tt.estimated / 1e9:.3f} s of its "
            f"life from {(tt.estimated_from - tt.start) / 1e9:.3f} s on, it switched above the "
            "cap)")


def _offcpu(res: Result) -> list[str]:
    """-e REALTIME: whether every context switch got its call path, or the cap sampled."""
    if not res.switch_samples:
        return []
    said = (f"{res.switch_samples} of {res.switches} context switches sampled with their "
            "call path")
    if res.switches <= res.switch_samples * CAP_RATIO:
        return [said + "."]
    return [said + f": capped (1 in {res.switches / res.switch_samples:.1f}); time off CPU "
            "is exact per thread where every switch was recorded, and the time of a switch "
            "without a call path goes to its thread's next sampled switch of the same kind "
            "(blocked or preempted)."]


def _unwind_sources(res: Result) -> list[str]:
    """Which rules found the callers' frames, and what the recipe analyses cost."""
    out = []
    found = {k: v for k, v in res.frame_sources.items() if k != "sample registers"}
    if found:
        out.append("Caller frames found by " + ", ".join(
            f"{k}: {v}" for k, v in sorted(found.items(), key=lambda x: -x[1])) + ".")
    done = [c for c in res.recipe_log if not c.cached]
    if done:
        secs = sum(c.seconds for c in done)
        mib = sum(c.text_bytes for c in done) / (1 << 20)
        out.append(f"Unwind recipes computed for {len(done)} module"
                   f"{'s' if len(done) != 1 else ''} in {secs:.2f} s "
                   f"({1000 * secs / max(mib, 1e-9):.0f} ms per MiB of code); "
                   f"{len(res.recipe_log) - len(done)} read from the cache.")
    return out
