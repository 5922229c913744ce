"""Readers of text profiles: folded stacks and ``perf script`` output.

Both give root-first call stacks of function names with a count; they differ in framing.
Folded stacks (``a;b;c 12``) are what flamegraph.pl, inferno and speedscope read and what
``stackcollapse-*`` scripts write. ``perf script`` prints one block per sample: a header
(command, pid/tid, time, period, event) then one line per frame, leaf first
(``addr symbol+0xoff (dso)``). Every malformed line is a :class:`FormatError` naming the file
and line number.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from callpath.errors import FormatError
from callpath.formats.import_build import Interner, StackSet, stackset, thread_ids
from callpath.model import Identifier, IdKind

# flamegraph.pl's rule: the count is the last field; the stack may be empty (py-spy writes
# samples without frames that way), and then the cost stays at the thread's entry point
FOLDED_LINE = re.compile(r"^(?P<stack>.*?)\s*(?<![^\s])(?P<count>[0-9]+(?:\.[0-9]*)?)$")
PERF_HEADER = re.compile(
    r"^(?P<comm>\S.*?)\s+(?P<pid>-?\d+)(?:/(?P<tid>-?\d+))?\s+(?:\[(?P<cpu>\d+)\]\s+)?"
    r"(?P<time>\d+\.\d+):\s+(?:(?P<period>\d+)\s+)?(?P<event>[^\s:][^\s]*?):?(?:\s.*)?$")
PERF_FRAME = re.compile(r"^\s+(?P<addr>[0-9a-fA-F]+)\s+(?P<sym>.*?)\s*\((?P<dso>[^()]*)\)\s*$")
SYM_OFFSET = re.compile(r"\+0x[0-9a-fA-F]+$")


def read_folded(path: Path, text: str) -> StackSet:
    fns = Interner()
    stacks: list[list[tuple[int, int, bool]]] = []
    values: list[list[float]] = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        m = FOLDED_LINE.match(line)
        if not m:
            raise FormatError(path, f"line {no}: expected 'frame;frame;... COUNT' (folded "
                              f"stacks), found {line[:60]!r}")
        frames = m["stack"].split(";") if m["stack"] else []
        if any(not f for f in frames):
            raise FormatError(path, f"line {no}: empty frame name in {m['stack'][:60]!r}")
        stacks.append([(fns(f), 0, False) for f in frames])
        values.append([float(m["count"])])
    if not stacks:
        raise FormatError(path, "no stacks (expected lines 'frame;frame;... COUNT')")
    return stackset(fns, stacks, [0] * len(stacks), values, ["samples"], thread_ids(1),
                    title=path.name, description=f"imported from folded stacks {path}")


def looks_like_perf_script(text: str) -> bool:
    lines = text.splitlines()[:200]
    for i, line in enumerate(lines[:-1]):
        if PERF_HEADER.match(line) and PERF_FRAME.match(lines[i + 1]):
            return True
    return False


def read_perf_script(path: Path, text: str) -> StackSet:
    fns = Interner()
    stacks: list[list[tuple[int, int, bool]]] = []
    ctx: list[int] = []
    times: list[int] = []
    events: dict[str, int] = {}
    ev_of: list[int] = []
    threads: dict[tuple[int, int], int] = {}
    cur: list[tuple[int, int, bool]] | None = None
    lines = text.splitlines()

    def flush() -> None:
        nonlocal cur
        if cur is not None:
            if not cur:
                cur.append((fns("[unknown]"), 0, False))
            stacks.append(cur[::-1])
            cur = None

    for no, line in enumerate(lines, 1):
        if not line.strip():
            flush()
            continue
        if line[0].isspace():
            m = PERF_FRAME.match(line)
            if not m or cur is None:
                raise FormatError(path, f"line {no}: expected a stack line 'ADDRESS SYMBOL "
                                  f"(DSO)' after a sample header, found {line.strip()[:60]!r}")
            sym = SYM_OFFSET.sub("", m["sym"]) or "[unknown]"
            dso = m["dso"]
            if sym == "[unknown]":
                sym = f"[unknown] {os.path.basename(dso) or dso}"
            cur.append((fns(sym, "", dso), 0, False))
            continue
        m = PERF_HEADER.match(line)
        if not m:
            raise FormatError(path, f"line {no}: expected a 'perf script' sample header "
                              f"'COMM PID/TID [CPU] TIME: [PERIOD] EVENT:', found {line[:60]!r}")
        flush()
        pid = int(m["pid"])
        tid = int(m["tid"]) if m["tid"] is not None else pid
        key = (pid, tid)
        if key not in threads:
            threads[key] = len(threads)
        ev = m["event"]
        if ev not in events:
            events[ev] = len(events)
        ctx.append(threads[key])
        ev_of.append(events[ev])
        sec, _, frac = m["time"].partition(".")
        times.append(int(sec) * 1_000_000_000 + int((frac + "000000000")[:9]))
        cur = []
    flush()
    if not stacks:
        raise FormatError(path, "no samples (expected 'perf script' output: a header line "
                          "per sample followed by its call stack)")
    n_ev = len(events)
    values = [[1.0 if e == k else 0.0 for k in range(n_ev)] for e in ev_of]
    ids: list[tuple[Identifier, ...]] = [(Identifier(IdKind.RANK, pid),
                                          Identifier(IdKind.THREAD, tid))
           for (pid, tid) in threads]
    ss = stackset(fns, stacks, ctx, values, [f"{e} (samples)" for e in events], ids,
                  title=path.name, description=f"imported from perf script output {path}")
    # perf's times are seconds since boot: a trace per thread, as 'callpath run -t' records
    ss.times = np.asarray(times, dtype=np.uint64)
    return ss


__all__ = ["looks_like_perf_script", "read_folded", "read_perf_script"]
