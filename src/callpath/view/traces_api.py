"""The trace view's HTTP handlers (``/api/db/N/trace/...``): parse a request, ask the trace
index of :mod:`callpath.engine.traces` and serialize its answer. How a frame is sampled is
explained there."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.engine.database import Database
from callpath.engine.traces import (
    TraceIndex,
    Window,
    frame_grid,
    last_at_or_before,
    local_names,
    midpoints,
    sample_at,
    trace_index,
)
from callpath.errors import CallpathError
from callpath.view.params import parse_int

I32 = npt.NDArray[np.int32]
Params = Mapping[str, str]

MAX_PIXELS = 8192
MAX_GRID = 1 << 24  # cells in one frame


# ---- request parsing -----------------------------------------------------------------


def _window(ti: TraceIndex, params: Params) -> Window:
    t0 = _time(params, "t0", ti.t0)
    t1 = _time(params, "t1", ti.t1)
    if t1 <= t0:
        raise CallpathError(f"parameters 't0', 't1': expected t0 < t1, got {t0} and {t1}")
    n = len(ti.times)
    c0 = parse_int(params, "c0", 0, lo=0, hi=n - 1)
    c1 = parse_int(params, "c1", n, lo=c0 + 1, hi=n)
    return Window(t0, t1, c0, c1)


def _time(params: Params, name: str, default: int) -> int:
    text = params.get(name)
    if text is None or text == "":
        return default
    try:
        v = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise CallpathError(f"parameter {name!r}: expected a time in ns, got "
                                f"{text[:40]!r}") from None
        if f != f or abs(f) > 9e18:
            raise CallpathError(f"parameter {name!r}: expected a time in ns, got "
                                f"{text[:40]!r}") from None
        v = int(f)
    if not -(1 << 62) < v < (1 << 62):
        raise CallpathError(f"parameter {name!r}: time {v} out of range")
    return v


def _depth(ti: TraceIndex, params: Params) -> int:
    return parse_int(params, "depth", 0, lo=0, hi=max(ti.max_depth, 0) + 1024)


def _b64(grid: I32) -> str:
    return base64.b64encode(np.ascontiguousarray(grid, dtype="<i4").tobytes()).decode("ascii")


# ---- endpoints ---------------------------------------------------------------------------


def meta(db: Database, params: Params, body: bytes) -> Any:
    ti = trace_index(db)
    return {"contexts": ti.labels, "context_index": ti.context_index, "t0": ti.t0,
            "t1": ti.t1, "max_depth": ti.max_depth,
            "samples": int(sum(len(t) for t in ti.times)),
            # per row: its number of samples (an empty row is explained, not left blank)
            # and whether it is a GPU stream (drawn apart from CPU threads)
            "row_samples": [int(np.count_nonzero(s >= 0)) for s in ti.samples],
            "gpu": ti.gpu}


def _size(params: Params) -> tuple[int, int]:
    width = parse_int(params, "width", 1000, lo=1, hi=MAX_PIXELS)
    height = parse_int(params, "height", 500, lo=1, hi=MAX_PIXELS)
    if width * height > MAX_GRID:
        raise CallpathError(f"parameters 'width' x 'height': at most {MAX_GRID} pixels")
    return width, height


def frame(db: Database, params: Params, body: bytes) -> Any:
    ti = trace_index(db)
    w = _window(ti, params)
    width, height = _size(params)
    d = _depth(ti, params)
    grid, rows = frame_grid(ti, w, width, height, d)
    local, procs = local_names(grid, ti.names)
    return {"procedures": procs, "rows": rows.tolist(), "width": width, "height": height,
            "t0": w.t0, "t1": w.t1, "depth": d, "grid": _b64(local)}


def depth(db: Database, params: Params, body: bytes) -> Any:
    ti = trace_index(db)
    w = _window(ti, params)
    row = parse_int(params, "ctx", 0, lo=0, hi=len(ti.times) - 1)
    width = parse_int(params, "width", 1000, lo=1, hi=MAX_PIXELS)
    u = sample_at(ti, row, midpoints(w.t0, w.t1, width))
    levels = ti.max_depth + 1
    grid = np.full((levels, width), -1, dtype=np.int32)
    has = u >= 0
    us = np.maximum(u, 0)
    for d in range(levels):
        names, _ = ti.at_depth(d)
        grid[d] = np.where(has & (ti.u_fdepth[us] > d), names[us], -1)
    local, procs = local_names(grid, ti.names)
    return {"procedures": procs, "rows": list(range(levels)), "ctx": row, "width": width,
            "height": levels, "t0": w.t0, "t1": w.t1, "grid": _b64(local)}


def callpath(db: Database, params: Params, body: bytes) -> Any:
    ti = trace_index(db)
    row = parse_int(params, "ctx", 0, lo=0, hi=len(ti.times) - 1)
    t = _time(params, "t", ti.t0)
    ts = ti.times[row]
    i = int(last_at_or_before(ts, ti.coarse[row], np.array([t], dtype=np.int64))[0])
    u = int(ti.samples[row][i]) if i >= 0 else -1
    if u < 0:
        return {"frames": [], "ctx": row, "t": t}
    frames = []
    for d in range(int(ti.u_fdepth[u])):
        names, _ = ti.at_depth(d)
        frames.append({"name": ti.names[int(names[u])], "depth": d})
    ctx = int(ti.exp.cct.ctx_id[int(ti.u_nodes[u])])
    return {"frames": frames, "ctx": row, "t": t, "sample_time": int(ts[i]),
            "node": f"t{ctx}"}


def summary(db: Database, params: Params, body: bytes) -> Any:
    ti = trace_index(db)
    w = _window(ti, params)
    width = parse_int(params, "width", 1000, lo=1, hi=MAX_PIXELS)
    d = _depth(ti, params)
    n = w.c1 - w.c0
    grid, _ = frame_grid(ti, w, width, n, d) if n * width <= MAX_GRID else \
        frame_grid(ti, w, width, max(MAX_GRID // width, 1), d)
    local, procs = local_names(grid, ti.names)
    p = len(procs)
    m = local >= 0
    cols = np.broadcast_to(np.arange(width), local.shape)[m]
    counts = np.bincount(local[m].astype(np.int64) * width + cols, minlength=p * width)
    shares = (counts.reshape(p, width) / grid.shape[0]).round(5)
    return {"procedures": procs, "width": width, "contexts": grid.shape[0],
            "shares": shares.tolist()}


def stats(db: Database, params: Params, body: bytes) -> Any:
    ti = trace_index(db)
    w = _window(ti, params)
    d = _depth(ti, params)
    names, _ = ti.at_depth(d)
    total = np.zeros(len(ti.names) + 1, dtype=np.float64)
    for r in range(w.c0, w.c1):
        ts = ti.times[r]
        # the sample in effect at t0, and one past the last sample before t1 (integer times)
        at = last_at_or_before(ts, ti.coarse[r], np.array([w.t0, w.t1 - 1], dtype=np.int64))
        lo, hi = max(int(at[0]), 0), int(at[1]) + 1
        if hi <= lo:
            continue
        start = np.maximum(ts[lo:hi], w.t0)
        end = np.minimum(np.append(ts[lo + 1:hi], w.t1), w.t1)
        dur = np.maximum(end - start, 0).astype(np.float64)
        u = ti.samples[r][lo:hi]
        nm = np.where(u >= 0, names[np.maximum(u, 0)], len(ti.names))
        total += np.bincount(nm, weights=dur, minlength=len(total))[:len(total)]
    span = float(w.t1 - w.t0) * (w.c1 - w.c0)
    order = np.argsort(-total[:-1], kind="stable")
    out = [{"name": ti.names[int(k)], "share": float(total[k]) / span, "time_ns": float(total[k])}
           for k in order.tolist() if total[k] > 0]
    return {"procedures": out, "t0": w.t0, "t1": w.t1, "c0": w.c0, "c1": w.c1, "depth": d}
