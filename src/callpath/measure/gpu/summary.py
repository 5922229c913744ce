"""What a GPU measurement holds and what measuring it cost, for the lines ``callpath run -e
gpu=nvidia`` prints after the program: the operations by kind (count, GPU time, bytes
copied), the streams, and the library's own accounting of its time (its ``cost`` note:
callbacks at launches, activity records, GPU binaries, CUPTI's start and the flush at exit),
so that a user sees at once what was measured and what it took, and the overhead's parts can
be told apart without another tool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from callpath.formats import measdir_gpu as mdg
from callpath.model import gpu_names as gn

#: (operation kind, what one is called, what several are called)
KINDS = ((gn.OP_KERNEL, "kernel", "kernels"), (gn.OP_MEMCPY, "copy", "copies"),
         (gn.OP_MEMSET, "memset", "memsets"), (gn.OP_SYNC, "synchronization",
                                               "synchronizations"),
         (gn.OP_ALLOC, "allocation", "allocations"), (gn.OP_FREE, "free", "frees"))

COST_FIELDS = ("start_ns", "calls", "calls_ns", "launches", "records", "records_ns", "bins",
               "bins_bytes", "bins_saved", "bins_ns", "exit_ns", "unwind_fallbacks")


def cost_of(notes: list[str]) -> dict[str, int]:
    """The library's ``cost`` note (its last one) as numbers; empty where there is none (a
    process killed before its exit, or a library older than the note)."""
    for note in reversed(notes):
        if note.startswith("cost "):
            out = {}
            for word in note.split()[1:]:
                key, _, value = word.partition("=")
                if key in COST_FIELDS and value.isdigit():
                    out[key] = int(value)
            return out
    return {}


def summarize(companions: list[Path]) -> dict[str, Any]:
    """Counts, GPU seconds and bytes by operation kind, the streams, and the summed cost of
    every process's measurement, from the companion files written by the conversion."""
    ops: dict[str, dict[str, float]] = {}
    streams: set[tuple[int, int, int]] = set()
    cost: dict[str, int] = {}
    for path in companions:
        g = mdg.read(path)
        for key, value in cost_of(list(g.process.info.get("gpu_notes") or [])).items():
            cost[key] = cost.get(key, 0) + value
        arrs = [a for a in g.ops.values() if len(a)]
        if not arrs:
            continue
        a = np.concatenate(arrs)
        secs = (a["end"].astype(np.int64) - a["start"].astype(np.int64)).clip(0) * 1e-9
        for kind, _one, many in KINDS:
            sel = a["kind"] == kind
            if sel.any():
                got = ops.setdefault(many, {"count": 0, "seconds": 0.0, "bytes": 0})
                got["count"] += int(sel.sum())
                got["seconds"] += float(secs[sel].sum())
                got["bytes"] += int(a["bytes"][sel].sum())
        work = np.isin(a["kind"], (gn.OP_KERNEL, gn.OP_MEMCPY, gn.OP_MEMSET))
        pairs = np.unique((a["context"][work].astype(np.uint64) << np.uint64(32))
                          | a["stream"][work].astype(np.uint64))
        streams |= {(g.process.pid, int(p >> 32), int(p & 0xFFFFFFFF)) for p in pairs.tolist()}
    return {"operations": ops, "streams": len(streams), "processes": len(companions),
            "cost": cost}


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.1f} ms" if ns < 10**9 else f"{ns / 1e9:.2f} s"


def _fallbacks(n: int) -> str:
    """launches whose native frames the library's walk handed to backtrace()"""
    return f", {n:,} native paths by backtrace()" if n else ""


def lines(s: dict[str, Any], convert_s: float) -> list[str]:
    """Two lines: what was measured, and what measuring it cost."""
    parts = []
    for _kind, one, many in KINDS:
        got = s["operations"].get(many)
        if not got:
            continue
        n = int(got["count"])
        text = f"{n:,} {one if n == 1 else many} {got['seconds']:.4f} s"
        if many == "copies" and got["bytes"]:
            text += f" ({_size(got['bytes'])})"
        parts.append(text)
    n_str, n_proc = s["streams"], s["processes"]
    where = (f"on {n_str} stream{'s' * (n_str != 1)} of {n_proc} "
             f"process{'es' * (n_proc != 1)}")
    out = [f"GPU: {', '.join(parts) or 'no operation'} {where}"]
    c = s["cost"]
    if c:
        launches = c.get("launches", 0)
        each = f", {c.get('calls_ns', 0) / launches / 1e3:.1f} µs each" if launches else ""
        text = (f"GPU measurement's own time: {launches:,} launching calls recorded"
                f"{each} ({_ms(c.get('calls_ns', 0))} in the program's threads"
                f"{_fallbacks(c.get('unwind_fallbacks', 0))}); "
                f"{c.get('records', 0):,} activity records {_ms(c.get('records_ns', 0))}")
        if c.get("bins"):
            text += (f"; {c['bins']:,} GPU binaries loaded ({_size(c.get('bins_bytes', 0))}, "
                     f"{c.get('bins_saved', 0):,} saved) {_ms(c.get('bins_ns', 0))}")
        text += (f"; CUPTI's start {_ms(c.get('start_ns', 0))}, its flush at exit "
                 f"{_ms(c.get('exit_ns', 0))}; conversion {convert_s:.2f} s")
        out.append(text)
    return out
