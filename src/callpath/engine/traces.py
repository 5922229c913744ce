"""The trace view's data: execution contexts × time, one sample per (row, pixel column).

A frame never looks at more samples than it draws: for each pixel column the server takes
the sample *in effect at the column's midpoint* (the last sample at or before it), found
per context with one ``numpy.searchsorted`` over a contiguous copy of every 16th timestamp
and four vectorised halving steps over the trace itself. So a frame of H rows × W columns
costs O(contexts · W · log samples), whatever the trace length. (A plain searchsorted over
the trace is 2-3x slower: the timestamps are a strided view of trace.db's 12-byte records,
and numpy copies a strided haystack whole at every call; copying every timestamp once would
cost 8 bytes per sample of memory, the 16th ones cost half a byte.)

The procedure at call-path depth D of a sample is found without walking call paths per
sample. Once per database: the distinct sampled calling contexts U, each one's deepest
*frame* (nearest procedure or entry ancestor-or-self) and its frame count. Once per depth D
(cached): every u's frame at depth D — the deepest one when the path is shorter — by moving
all of U up the frame chain together, one vectorised step per level. A sample's procedure
is then two gathers: sample → u → name id.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from callpath.analysis.nodes import NodeTable, ViewKind
from callpath.errors import NotFound
from callpath.model import Experiment, NodeKind
from callpath.model.treeops import nearest_marked

if TYPE_CHECKING:
    from callpath.engine.database import Database

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]

COARSE = 16  # every COARSE-th timestamp is kept contiguous (a power of two)
COARSE_STEPS = COARSE.bit_length() - 1


@dataclass
class TraceIndex:
    """Everything about a database's traces that does not depend on the request."""

    exp: Experiment
    labels: list[str]  # one per trace row
    context_index: list[int]  # the row's position in ``exp.contexts``
    times: list[I64]  # per row: sample timestamps (ns), sorted
    coarse: list[I64]  # per row: every COARSE-th timestamp, contiguous
    samples: list[I32]  # per row: index into ``u_nodes`` of each sample, -1 = none
    t0: int
    t1: int
    u_nodes: I64  # distinct sampled tree nodes
    u_frame: I64  # deepest frame of each
    u_fdepth: I64  # number of frames on its path (>= 1)
    frame_of: I64  # tree node -> nearest frame ancestor-or-self (-1: none)
    gpu: list[bool] = field(default_factory=list)  # per row: a GPU stream (or context)
    names: list[str] = field(default_factory=list)  # procedure names (global ids)
    _name_id: dict[str, int] = field(default_factory=dict)
    _by_depth: dict[int, tuple[I32, I64]] = field(default_factory=dict)

    @property
    def max_depth(self) -> int:
        return int(self.u_fdepth.max()) - 1 if len(self.u_fdepth) else 0

    def _name_ids(self, nodes: I64) -> I32:
        """Global name ids of tree nodes (frames): a node table over just these nodes, named
        once per distinct name key, exactly as the Top-down view names them."""
        out = np.full(len(nodes), -1, dtype=np.int32)
        ok = nodes >= 0
        if not ok.any():
            return out
        uniq, inv = np.unique(nodes[ok], return_inverse=True)
        cct = self.exp.cct
        kind = np.where(cct.kind[uniq] == NodeKind.ENTRY, ViewKind.ENTRY,
                        np.where(cct.kind[uniq] == NodeKind.FUNCTION, ViewKind.ACTIVATION,
                                 ViewKind.LINE)).astype(np.uint8)
        pos = {int(n): i for i, n in enumerate(uniq.tolist()) if cct.kind[n] == NodeKind.ENTRY}
        table = NodeTable(kind, cct.function[uniq].astype(np.int64),
                          cct.module[uniq].astype(np.int64), cct.file[uniq].astype(np.int64),
                          cct.line[uniq].astype(np.int64), cct.offset[uniq],
                          np.full(len(uniq), -1, np.int64),
                          {pos[k]: v for k, v in cct.entry_names.items() if k in pos})
        keys, reps = table.name_keys()
        rep_names = table.names(self.exp, reps)
        ids = np.array([self._name_id.setdefault(nm, len(self._name_id)) for nm in rep_names],
                       dtype=np.int32)
        if len(self.names) < len(self._name_id):
            self.names = list(self._name_id)
        out[ok] = ids[keys][inv]
        return out

    def at_depth(self, depth: int) -> tuple[I32, I64]:
        """For every u: the name id of its frame at ``depth`` (deepest frame when the path is
        shorter) and the frame node itself."""
        hit = self._by_depth.get(depth)
        if hit is not None:
            return hit
        parent = self.exp.cct.parent
        cur = self.u_frame.copy()
        steps = np.maximum(self.u_fdepth - 1 - depth, 0)
        active = np.nonzero(steps > 0)[0]
        while len(active):
            up = parent[cur[active]]
            cur[active] = self.frame_of[np.maximum(up, 0)]
            steps[active] -= 1
            active = active[steps[active] > 0]
        names = self._name_ids(cur)
        if len(self._by_depth) > 64:
            self._by_depth.clear()
        self._by_depth[depth] = (names, cur)
        return names, cur


def trace_index(db: Database) -> TraceIndex:
    """The database's trace index: cached, or the background build's result (see
    :func:`prefetch`), or built now. Call with the database's lock held."""
    hit = db.trace_cache.get("traces")
    if not isinstance(hit, TraceIndex):
        hit = db.take("traces")
        if not isinstance(hit, TraceIndex):
            hit = build_index(db)
        db.trace_cache["traces"] = hit
    return hit


def prefetch(db: Database) -> None:
    """Index the traces in the background (half a second for 12.8 million samples), so that
    opening the trace view finds them ready."""
    if db.exp.traces is not None and db.exp.traces.lines:
        db.prefetch("traces", lambda: build_index(db))


def _ids(exp: Experiment, prof_index: int) -> dict[str, int]:
    """The identifier kinds and logical ids of a profile (``{"RANK": 3, "THREAD": 1}``)."""
    if prof_index >= len(exp.profiles):
        return {}
    names = exp.id_names
    return {(names[i.kind] if i.kind < len(names) else f"KIND{i.kind}"): i.logical_id
            for i in exp.profiles[prof_index].ids}


def row_order_key(ids: dict[str, int], prof_index: int) -> tuple[int, ...]:
    """hpctraceviewer's order of trace lines: by rank, then CPU threads before GPU streams,
    then thread (or GPU context), then stream. Rows came in the order of the profiles in
    the database (``RANK 16 THREAD 4, RANK 25 THREAD 1, RANK 7 THREAD 0``)."""
    gpu = "GPUSTREAM" in ids or "GPUCONTEXT" in ids
    return (ids.get("RANK", -1), int(gpu), ids.get("GPUDEVICE", -1),
            ids.get("GPUCONTEXT", -1) if gpu else ids.get("THREAD", -1),
            ids.get("GPUSTREAM", -1), prof_index)


def row_label(exp: Experiment, prof_index: int) -> str:
    """A trace row's label as a person reads it (:meth:`Experiment.context_label`: the
    node left out when there is one, a host id in hex), GPU streams named in words:
    ``GPU stream 7 (context 1)`` for ``NODE 0 GPUCONTEXT 1 GPUSTREAM 7``."""
    if prof_index >= len(exp.profiles):
        return f"profile {prof_index}"
    label = exp.context_label(exp.profiles[prof_index])
    ids = _ids(exp, prof_index)
    if "GPUSTREAM" not in ids:
        return label
    # the CPU part of the label as it reads (the node left out or in hex), then the stream
    gpu_kinds = {k for k, n in enumerate(exp.id_names)
                 if n in ("GPUDEVICE", "GPUCONTEXT", "GPUSTREAM")}
    node = {k for k, n in enumerate(exp.id_names) if n == "NODE"}
    shown = exp.node_texts()
    cpu = dataclasses.replace(exp.profiles[prof_index], name="", ids=tuple(
        i for i in exp.profiles[prof_index].ids if i.kind not in gpu_kinds
        and not (i.kind in node and shown.get(i.logical_id) == "")))
    parts = [exp.context_label(cpu)] if cpu.ids else []
    where = [f"{k.removeprefix('GPU').lower()} {ids[k]}" for k in ("GPUDEVICE", "GPUCONTEXT")
             if k in ids]
    parts.append(f"GPU stream {ids['GPUSTREAM']}" + (f" ({', '.join(where)})" if where else ""))
    return " ".join(parts)


def build_index(db: Database) -> TraceIndex:
    exp = db.exp
    tr = exp.traces
    if tr is None or not tr.lines:
        raise NotFound(f"{db.name}: the database has no traces")
    pos = {c.index: i for i, c in enumerate(exp.contexts)}
    lines = sorted(tr.lines, key=lambda ln: row_order_key(_ids(exp, ln.prof_index),
                                                          ln.prof_index))
    cct = exp.cct
    kind = cct.kind
    is_frame = (kind == NodeKind.FUNCTION) | (kind == NodeKind.ENTRY)
    frame_of = nearest_marked(cct.parent, is_frame)
    node_of_ctx = exp.node_of_ctx()
    slots = len(node_of_ctx)
    # the distinct sampled context ids, by marking (no sort of all the samples)
    seen = np.zeros(slots + 1, dtype=bool)
    for ln in lines:
        seen[np.minimum(ln.ctx_ids, slots)] = True
    all_ctx = np.nonzero(seen[:slots])[0]
    nodes = node_of_ctx[all_ctx].astype(np.int64)
    keep = (nodes >= 0) & (all_ctx > 0)
    keep[keep] &= frame_of[nodes[keep]] >= 0
    u_ctx, u_nodes = all_ctx[keep], nodes[keep]
    u_frame = frame_of[u_nodes]
    # frames on each path: walk all of U up the frame chain together
    fdepth = np.zeros(len(u_nodes), dtype=np.int64)
    cur = u_frame.copy()
    active = np.arange(len(cur))
    while len(active):
        fdepth[active] += 1
        up = cct.parent[cur[active]]
        nxt = np.where(up >= 0, frame_of[np.maximum(up, 0)], -1)
        cur[active] = nxt
        active = active[nxt >= 0]
    lut = np.full(slots + 1, -1, dtype=np.int32)  # context id -> u (-1: not a sample)
    lut[u_ctx] = np.arange(len(u_ctx), dtype=np.int32)
    times, samples, labels, cindex = [], [], [], []
    for ln in lines:
        ts = ln.timestamps
        # ns since the epoch stay below 2^63: read uint64 as int64 in place (no copy of a
        # trace that may be hundreds of MB)
        times.append(ts.view(np.int64) if ts.dtype == np.uint64 and (
            not len(ts) or int(ts[-1]) < 1 << 63) else ts.astype(np.int64))
        samples.append(lut[np.minimum(ln.ctx_ids, slots)])
        p = pos.get(ln.prof_index)
        cindex.append(-1 if p is None else p)
        labels.append(row_label(exp, ln.prof_index))
    t0 = int(tr.min_timestamp)
    t1 = int(tr.max_timestamp)
    if t1 <= t0:
        t1 = t0 + 1
    coarse = [np.ascontiguousarray(t[::COARSE]) for t in times]
    gpu = [bool({"GPUSTREAM", "GPUCONTEXT"} & _ids(exp, ln.prof_index).keys()) for ln in lines]
    return TraceIndex(exp, labels, cindex, times, coarse, samples, t0, t1, u_nodes, u_frame,
                      fdepth, frame_of, gpu)


# ---- sampling ------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    t0: int
    t1: int
    c0: int
    c1: int


def midpoints(t0: int, t1: int, width: int) -> I64:
    """The time at the middle of each of ``width`` pixel columns, in exact integers."""
    k = 2 * np.arange(width, dtype=np.int64) + 1
    span = t1 - t0
    if span < (1 << 62) // (2 * width + 1):
        return t0 + (k * span) // (2 * width)
    return (t0 + k * (span / (2.0 * width))).astype(np.int64)


def sample_at(ti: TraceIndex, row: int, times: I64) -> I32:
    """The u index of the sample in effect at each time of one row (-1: none)."""
    ts = ti.times[row]
    if not len(ts):  # a context whose trace is empty
        return np.full(len(times), -1, dtype=np.int32)
    i = last_at_or_before(ts, ti.coarse[row], times)
    out: I32 = np.where(i >= 0, ti.samples[row][np.maximum(i, 0)], -1).astype(np.int32)
    return out


def last_at_or_before(ts: I64, coarse: I64, times: I64) -> I64:
    """``searchsorted(ts, times, side="right") - 1`` for sorted ``ts`` (maybe a strided
    view) given ``coarse = ts[::COARSE]`` contiguous: the block of COARSE samples holding
    each answer, then COARSE_STEPS halvings keeping ``ts[lo] <= t``."""
    if not len(ts):
        return np.full(len(times), -1, dtype=np.int64)
    block = np.searchsorted(coarse, times, side="right") - 1
    lo = np.maximum(block, 0) * COARSE
    hi = np.minimum(lo + COARSE, len(ts))
    for _ in range(COARSE_STEPS):
        mid = (lo + hi) >> 1
        ok = ts[mid] <= times
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    out: I64 = np.where(block >= 0, lo, -1)
    return out


def frame_grid(ti: TraceIndex, w: Window, width: int, height: int, depth: int
               ) -> tuple[I32, I64]:
    """Global name ids, ``height`` × ``width``, and the trace row of each grid row."""
    n = w.c1 - w.c0
    rows = w.c0 + ((2 * np.arange(height, dtype=np.int64) + 1) * n) // (2 * height)
    mids = midpoints(w.t0, w.t1, width)
    names, _ = ti.at_depth(depth)
    uniq, which = np.unique(rows, return_inverse=True)
    per_ctx = np.empty((len(uniq), width), dtype=np.int32)
    for k, r in enumerate(uniq.tolist()):  # one searchsorted per context, not per pixel
        u = sample_at(ti, r, mids)
        per_ctx[k] = np.where(u >= 0, names[np.maximum(u, 0)], -1)
    grid: I32 = per_ctx[which]
    return grid, rows


def local_names(grid: I32, names: list[str]) -> tuple[I32, list[str]]:
    """Renumber global name ids to 0..P-1 over the procedures present: a bincount and a
    lookup table, not a sort of the grid."""
    flat = grid.ravel()
    counts = np.bincount(flat + 1, minlength=len(names) + 1)
    present = np.nonzero(counts[1:])[0]
    lut = np.full(len(names) + 1, -1, dtype=np.int32)
    lut[present + 1] = np.arange(len(present), dtype=np.int32)
    out: I32 = lut[flat + 1].reshape(grid.shape)
    return out, [names[int(g)] for g in present.tolist()]


def depth_grid(ti: TraceIndex, row: int, w: Window, width: int) -> I32:
    """The depth view of one trace row: global name ids, one grid row per call-path depth
    (0 = outermost frame), -1 where the sample's path is shorter or there is no sample."""
    u = sample_at(ti, row, midpoints(w.t0, w.t1, width))
    levels = ti.max_depth + 1
    grid = np.full((levels, width), -1, dtype=np.int32)
    has = u >= 0
    us = np.maximum(u, 0)
    for d in range(levels):
        names, _ = ti.at_depth(d)
        grid[d] = np.where(has & (ti.u_fdepth[us] > d), names[us], -1)
    return grid


def call_path_at(ti: TraceIndex, row: int, t: int) -> tuple[list[str], int, int] | None:
    """The sample of trace row ``row`` in effect at time ``t``: its frames' names outermost
    first, its time stamp and its calling-context id; None before the first sample."""
    ts = ti.times[row]
    i = int(last_at_or_before(ts, ti.coarse[row], np.array([t], dtype=np.int64))[0])
    u = int(ti.samples[row][i]) if i >= 0 else -1
    if u < 0:
        return None
    frames = []
    for d in range(int(ti.u_fdepth[u])):
        names, _ = ti.at_depth(d)
        frames.append(ti.names[int(names[u])])
    return frames, int(ts[i]), int(ti.exp.cct.ctx_id[int(ti.u_nodes[u])])


def column_shares(grid: I32, names: list[str]) -> tuple[list[str], npt.NDArray[np.float64]]:
    """The procedures present in a frame grid and, per procedure and pixel column, the
    share of the grid's rows it fills (rounded to 5 digits)."""
    local, procs = local_names(grid, names)
    width = grid.shape[1]
    m = local >= 0
    cols = np.broadcast_to(np.arange(width), local.shape)[m]
    counts = np.bincount(local[m].astype(np.int64) * width + cols, minlength=len(procs) * width)
    return procs, (counts.reshape(len(procs), width) / grid.shape[0]).round(5)


def time_by_procedure(ti: TraceIndex, w: Window, depth: int) -> list[tuple[str, float, float]]:
    """``(procedure, share of the window, time in ns)`` of every procedure at call-path
    ``depth`` in the window's rows and times, most time first: exact durations between
    samples, not pixels."""
    names, _ = ti.at_depth(depth)
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
    return [(ti.names[int(k)], float(total[k]) / span, float(total[k]))
            for k in order.tolist() if total[k] > 0]
