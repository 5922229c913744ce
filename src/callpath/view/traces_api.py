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
    call_path_at,
    column_shares,
    depth_grid,
    frame_grid,
    local_names,
    time_by_procedure,
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
    grid = depth_grid(ti, row, w, width)
    levels = grid.shape[0]
    local, procs = local_names(grid, ti.names)
    return {"procedures": procs, "rows": list(range(levels)), "ctx": row, "width": width,
            "height": levels, "t0": w.t0, "t1": w.t1, "grid": _b64(local)}


def callpath(db: Database, params: Params, body: bytes) -> Any:
    ti = trace_index(db)
    row = parse_int(params, "ctx", 0, lo=0, hi=len(ti.times) - 1)
    t = _time(params, "t", ti.t0)
    got = call_path_at(ti, row, t)
    if got is None:
        return {"frames": [], "ctx": row, "t": t}
    names, sample_time, ctx = got
    return {"frames": [{"name": n, "depth": d} for d, n in enumerate(names)], "ctx": row,
            "t": t, "sample_time": sample_time, "node": f"t{ctx}"}


def summary(db: Database, params: Params, body: bytes) -> Any:
    ti = trace_index(db)
    w = _window(ti, params)
    width = parse_int(params, "width", 1000, lo=1, hi=MAX_PIXELS)
    d = _depth(ti, params)
    n = w.c1 - w.c0
    grid, _ = frame_grid(ti, w, width, n, d) if n * width <= MAX_GRID else \
        frame_grid(ti, w, width, max(MAX_GRID // width, 1), d)
    procs, shares = column_shares(grid, ti.names)
    return {"procedures": procs, "width": width, "contexts": grid.shape[0],
            "shares": shares.tolist()}


def stats(db: Database, params: Params, body: bytes) -> Any:
    ti = trace_index(db)
    w = _window(ti, params)
    d = _depth(ti, params)
    out = [{"name": name, "share": share, "time_ns": ns}
           for name, share, ns in time_by_procedure(ti, w, d)]
    return {"procedures": out, "t0": w.t0, "t1": w.t1, "c0": w.c0, "c1": w.c1, "depth": d}
