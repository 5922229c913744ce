"""Phase 2 of the streamed writer (:mod:`~callpath.formats.v4.stream`): the values read back
from the spools one range of contexts ("bucket") at a time, put in ``cct.db``'s (context,
metric, profile) order and written in place at offsets known from the counts taken while
spooling (:class:`ContextLayout`).

Why a module of its own: the transpose is the writer's most expensive step and the one whose
algorithm matters (counting places rather than sorting, whole-record scatters); it runs per
piece of buckets in a forked worker (:func:`_transpose_chunk`) and depends on phase 1 only
through :class:`~callpath.formats.v4.spool.Spool`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.formats.v4.blocks import (
    CONTEXT_INDEX,
    CONTEXT_VALUE,
    PROFILE_INDEX,
    PROFILE_VALUE,
    write_array,
)
from callpath.formats.v4.fileio import Writer, pread_exact, pwrite_all, shared_writes
from callpath.formats.v4.spool import Spool
from callpath.formats.v4.stream import I64, STATE, Groups, ValueSource

VALUES_PER_BUCKET = 1 << 20  # target size of a transposed piece (values): its arrays stay
#                               below glibc's mmap threshold, so they are reused, not faulted in
#: what transposing a context costs, in values (see transpose_buckets)
COST_PER_CONTEXT = 15
MAX_BUCKETS = 256  # context ranges a profile's values are cut into for the transpose


@dataclass
class ContextLayout:
    """Where each context's block lies in ``cct.db`` (from the spools'
    :class:`~callpath.formats.v4.spool.PairCounts`)."""

    n_values: I64
    n_metrics: I64
    start: I64  # n_slots + 1 offsets from the first block

    @classmethod
    def of(cls, spools: list[Spool], n_slots: int) -> ContextLayout:
        ids = sorted({i for sp in spools for i in sp.pairs.ids})
        col = {m: j for j, m in enumerate(ids)}
        n_values = np.zeros(n_slots, dtype=np.int64)
        present = np.zeros((n_slots, len(ids)), dtype=bool)
        for sp in spools:
            pc = sp.pairs
            r = min(len(pc.values), n_slots)
            n_values[:r] += pc.values[:r]
            if pc.ids:
                cols = np.array([col[m] for m in pc.ids], dtype=np.int64)
                present[:r, cols] |= pc.present[:r]
        n_metrics = present.sum(axis=1).astype(np.int64)
        if np.any(n_metrics > 0xFFFF):
            raise CallpathError("a context has more than 65535 metrics")
        # block of a context: values (12 B each), metric indices (10 B each), padding to 4
        size = 12 * n_values + 10 * n_metrics + 2 * (n_metrics & 1)
        start = np.zeros(n_slots + 1, dtype=np.int64)
        np.cumsum(size, out=start[1:])
        return cls(n_values, n_metrics, start)


def bucket_bounds(n_slots: int, n_profiles: int, n_metric_ids: int) -> I64:
    """Context ranges of the buckets: equal ranges, as many as keep the worst case (every
    profile has every metric at every context) near :data:`VALUES_PER_BUCKET` values, at
    most :data:`MAX_BUCKETS`; the last range is open (contexts beyond ``n_slots``)."""
    worst = max(n_slots, 1) * max(n_profiles, 1) * max(n_metric_ids, 1)
    n = int(min(MAX_BUCKETS, max(1, -(-worst // VALUES_PER_BUCKET)), max(n_slots, 1)))
    b = np.linspace(0, n_slots, n + 1).round().astype(np.int64)
    b[-1] = 1 << 32
    return b


# ==== phase 2: transpose the buckets ====================================================


def transpose_buckets(source: ValueSource, spools: list[Spool], bounds: I64,
                      layout: ContextLayout, cct_db: Path, data_base: int,
                      profile_db: Path | None = None) -> list[Any]:
    """Phase 2: the ``cct.db`` blocks of every context written in place into ``cct_db``
    (blocks from ``data_base``, at the offsets of ``layout``), by pieces of adjacent buckets
    of up to :data:`VALUES_PER_BUCKET` values read back from the spools. What is read from a
    spool that is not in place is also written into ``profile_db`` at the spool's ``dest``.
    Returns what ``on_groups`` said of each piece, in context order."""
    nb = len(bounds) - 1
    n_slots = len(layout.n_values)
    b = bounds.copy()
    b[-1] = max(n_slots, int(b[-2]))
    counts = (np.sum([s.runs.sum(axis=0) for s in spools], axis=0) if spools
              else np.zeros(nb, dtype=np.int64))
    units: list[tuple[int, int]] = []
    unit_values: list[int] = []
    start, acc = 0, 0
    for k in range(nb):
        if k > start and acc + int(counts[k]) > VALUES_PER_BUCKET:
            units.append((start, k))
            unit_values.append(acc)
            start, acc = k, 0
        acc += int(counts[k])
    units.append((start, nb))
    unit_values.append(acc)
    if profile_db is None and any(not sp.in_place for sp in spools):
        raise CallpathError("spooled profiles need the profile.db they are copied into")
    # a piece costs per value and per context (encoding each context's metric index):
    # measured on bench/prof.py, 0.145 us a value and 2.2 us a context, so the pieces of
    # the first contexts (the interior of the tree, with many contexts of few values)
    # cost 20% more than as many pieces of leaves; equal shares of cost, not of pieces
    weights = [v + COST_PER_CONTEXT * (int(b[k1]) - int(b[k0]))
               for v, (k0, k1) in zip(unit_values, units, strict=True)]
    STATE["transpose"] = (source, spools, b, units, layout, cct_db, data_base, profile_db)
    try:
        with shared_writes(source):
            got = source.parallel(_transpose_chunk, list(range(len(units))), weights=weights)
            return [g for part in got for g in part]
    finally:
        STATE.pop("transpose", None)


def _transpose_chunk(unit_ids: Sequence[int]) -> list[Any]:
    source: ValueSource
    spools: list[Spool]
    layout: ContextLayout
    source, spools, bounds, units, layout, cct_db, data_base, profile_db = STATE["transpose"]
    groups = []
    out = Writer(os.open(cct_db, os.O_WRONLY), STATE["write_lock"], behind=STATE["behind"])
    spool_fds = [os.open(sp.path, os.O_RDONLY) for sp in spools]
    copy_fd = (os.open(profile_db, os.O_WRONLY) if any(not sp.in_place for sp in spools)
               else -1)
    try:
        for u in unit_ids:
            b0, b1 = units[int(u)]
            c0, c1 = int(bounds[b0]), min(int(bounds[b1]), len(layout.n_values))
            ctx, met, val, run_prof, run_len = _read_range(spools, spool_fds, b0, b1, copy_fd)
            t = _transpose(ctx, met, val, run_prof, run_len, c0, c1)
            del ctx, met, val
            buf, nv, nm = encode_contexts(t, c0, c1)
            if not (np.array_equal(nv, layout.n_values[c0:c1])
                    and np.array_equal(nm, layout.n_metrics[c0:c1])):
                raise CallpathError(f"contexts {c0}..{c1 - 1}: the transposed values do not "
                                    "match the counts taken while spooling")
            if source.on_groups is not None:
                groups.append(source.on_groups(t))
            del t
            out.seek(data_base + int(layout.start[c0]))
            write_array(out, buf)
            out.flush()
    finally:
        out.close()
        for sfd in spool_fds:
            os.close(sfd)
        if copy_fd >= 0:
            os.close(copy_fd)
    return groups


def _read_range(spools: list[Spool], fds: list[int], b0: int, b1: int, copy_fd: int = -1
                ) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint16],
                           npt.NDArray[np.float64], I64, I64]:
    """The values of buckets ``b0 .. b1-1`` of every profile, read from the spools (two
    reads per profile: its context index and its values in the range), in profile order:
    context, metric and value of each, and the runs (profile, length). The bytes read from
    a spool that is not in place are written to ``copy_fd`` (profile.db) at their final
    place: the ranges of all the pieces together are every byte of every transposed block
    but padding."""
    ctx_parts, met_parts, val_parts, run_prof, run_len = [], [], [], [], []
    for sp, sfd in zip(spools, fds, strict=True):
        v0, v1 = sp.cut_val[:, b0], sp.cut_val[:, b1]
        i0, i1 = sp.cut_ctx[:, b0], sp.cut_ctx[:, b1]
        copy = not sp.in_place
        if copy and sp.dest < 0:
            raise CallpathError("a spool's place in profile.db is not known")
        for k in np.flatnonzero((v1 > v0) | ((i1 > i0) if copy else False)).tolist():
            nval, nidx = int(v1[k] - v0[k]), int(i1[k] - i0[k])
            at_idx = int(sp.p_ctxs[k]) + PROFILE_INDEX.itemsize * int(i0[k])
            at_val = int(sp.p_values[k]) + PROFILE_VALUE.itemsize * int(v0[k])
            raw_idx = pread_exact(sfd, PROFILE_INDEX.itemsize * nidx, sp.origin + at_idx)
            raw_val = pread_exact(sfd, PROFILE_VALUE.itemsize * nval, sp.origin + at_val)
            if copy:
                pwrite_all(copy_fd, raw_idx, sp.dest + at_idx)
                pwrite_all(copy_fd, raw_val, sp.dest + at_val)
            if not nval:
                continue
            idx = np.frombuffer(raw_idx, dtype=PROFILE_INDEX)
            vals = np.frombuffer(raw_val, dtype=PROFILE_VALUE)
            counts = np.diff(np.append(idx["startIndex"].astype(np.int64), int(v1[k])))
            ctx_parts.append(np.repeat(idx["ctxId"], counts))
            met_parts.append(vals["metricId"])
            val_parts.append(vals["value"])
            run_prof.append(int(sp.profiles[k]))
            run_len.append(nval)
    if not ctx_parts:
        return (np.zeros(0, np.uint32), np.zeros(0, np.uint16), np.zeros(0, np.float64),
                np.zeros(0, np.int64), np.zeros(0, np.int64))
    return (np.concatenate(ctx_parts), np.concatenate(met_parts), np.concatenate(val_parts),
            np.array(run_prof, dtype=np.int64), np.array(run_len, dtype=np.int64))


def _transpose(ctx: npt.NDArray[np.uint32], met: npt.NDArray[np.uint16],
               val: npt.NDArray[np.float64], run_prof: I64, run_len: I64, c0: int, c1: int
               ) -> Groups:
    """Values of contexts ``c0 .. c1-1`` in runs (one per profile; a run is sorted by
    (context, metric) and has each pair once) → the pairs in (context, metric) order with
    their values in profile order. Where the range × its metrics is small enough for a
    dense count (always, unless metric ids are many), each record's place is its pair's
    start plus the number of earlier runs that have the pair: no sort, linear time.
    The runs of one profile can be split, but then they follow each other and hold
    different pairs, so counting stays right."""
    n = len(ctx)
    if n and (int(ctx.min()) < c0 or int(ctx.max()) >= c1):
        raise CallpathError(f"a value of a context outside {c0}..{c1 - 1} is in its range")
    top = int(met.max()) + 1 if n else 1
    if top <= 64:  # metric ids are few and small: they are their own columns
        mids = np.arange(top)
        col: npt.NDArray[Any] = met
    else:
        present = np.zeros(1 << 16, dtype=bool)
        present[met] = True
        mids = np.flatnonzero(present)
        col = (np.cumsum(present) - 1)[met]
    m = max(len(mids), 1)
    width = c1 - c0
    if width * m <= max(4 * n, 1 << 20):
        key = (ctx.astype(np.int64) - c0) * m
        key += col
        del col
        counts = np.bincount(key, minlength=width * m)
        start = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=start[1:])
        seen = start[:-1].copy()
        pos = np.empty(n, dtype=np.int64)
        out_prof = np.empty(n, dtype=np.uint32)
        ends = np.cumsum(run_len)
        for p, a, b in zip(run_prof.tolist(), (ends - run_len).tolist(), ends.tolist(),
                           strict=True):
            k = key[a:b]
            where = seen[k]
            pos[a:b] = where
            out_prof[where] = p
            seen[k] += 1
        del key, seen
        out_val = np.empty(n, dtype=np.float64)
        out_val[pos] = val
        nz = np.flatnonzero(counts)
        g_ctx = (nz // m + c0).astype(np.uint32)
        g_met = mids[nz % m].astype(np.uint16)
        first = start[nz]
    else:  # sparse metric ids: one stable sort (runs are in profile order)
        key64 = (ctx.astype(np.uint64) << np.uint64(16)) | met.astype(np.uint64)
        order = np.argsort(key64, kind="stable")
        key64 = key64[order]
        out_prof = np.repeat(run_prof.astype(np.uint32), run_len)[order]
        out_val = np.asarray(val)[order]
        new = np.ones(n, dtype=bool)
        new[1:] = key64[1:] != key64[:-1]
        first = np.flatnonzero(new)
        g_ctx = (key64[first] >> np.uint64(16)).astype(np.uint32)
        g_met = (key64[first] & np.uint64(0xFFFF)).astype(np.uint16)
    return Groups(g_ctx, g_met, np.append(first, n).astype(np.int64), out_prof, out_val)


def encode_contexts(g: Groups, c0: int, c1: int) -> tuple[npt.NDArray[np.uint8], I64, I64]:
    """``cct.db`` blocks of contexts ``c0 .. c1-1`` from their pairs: one buffer with whole
    records scattered into it (every block is a multiple of 4 bytes, so the buffer does not
    depend on where it lands), and the value and metric counts per context."""
    rel = g.ctx.astype(np.int64) - c0
    sizes = np.diff(g.starts)
    n_metrics = np.bincount(rel, minlength=c1 - c0).astype(np.int64)
    if np.any(n_metrics > 0xFFFF):
        raise CallpathError("a context has more than 65535 metrics")
    n_values = np.bincount(rel, weights=sizes, minlength=c1 - c0).astype(np.int64)
    # block of a context: values (12 B each), metric indices (10 B each), padding to 4 bytes
    block_size = 12 * n_values + 10 * n_metrics + 2 * (n_metrics & 1)
    starts = np.zeros(c1 - c0 + 1, dtype=np.int64)
    np.cumsum(block_size, out=starts[1:])
    total = int(starts[-1])
    buf = np.zeros(total, dtype=np.uint8)
    nv_all = len(g.values)
    if nv_all:
        ctx_first = np.zeros(c1 - c0 + 1, dtype=np.int64)  # first value of each context
        np.cumsum(n_values, out=ctx_first[1:])
        vals = np.empty(nv_all, CONTEXT_VALUE)
        vals["profIndex"] = g.prof
        vals["value"] = g.values
        # value j of context c lands at starts[c] + 12 * (j - ctx_first[c])
        dest = np.repeat(starts[:-1] - 12 * ctx_first[:-1], n_values)
        dest += 12 * np.arange(nv_all, dtype=np.int64)
        _records_at(buf, CONTEXT_VALUE.itemsize, 4)[dest // 4] = vals.view("V12")
        del vals, dest
        ng = len(g.ctx)
        grp_first = np.zeros(c1 - c0 + 1, dtype=np.int64)
        np.cumsum(n_metrics, out=grp_first[1:])
        idx = np.empty(ng, CONTEXT_INDEX)
        idx["metricId"] = g.metric
        idx["startIndex"] = g.starts[:-1] - np.repeat(ctx_first[:-1], n_metrics)
        p_idx = starts[:-1] + 12 * n_values
        dest = np.repeat(p_idx - 10 * grp_first[:-1], n_metrics)
        dest += 10 * np.arange(ng, dtype=np.int64)
        _records_at(buf, CONTEXT_INDEX.itemsize, 2)[dest // 2] = idx.view("V10")
    return buf, n_values, n_metrics


def _records_at(buf: npt.NDArray[np.uint8], size: int, step: int) -> npt.NDArray[Any]:
    """An (overlapping) view of ``buf`` as ``size``-byte records starting every ``step``
    bytes, so that records at any ``step``-aligned offset are stored by one scatter."""
    count = max((len(buf) - size) // step + 1, 0)
    return np.ndarray((count,), dtype=np.dtype(f"V{size}"), buffer=buf, strides=(step,))
