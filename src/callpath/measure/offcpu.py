"""Time off CPU at the call paths where threads were switched out (``callpath run -e REALTIME``).

The kernel writes a PERF_RECORD_SWITCH each time a thread of the program leaves a CPU (``out``,
flagged when it was preempted while runnable) and when it comes back (``in``): each thread's
time off CPU is the sum of its out-to-in intervals, exact, and its time on CPU the rest of its
life. The call path of an interval comes from the context-switch *sample* taken at the same
switch-out (user registers and stack copy, unwound like any sample). The kernel samples every
switch while a thread switches less often than the cap (``launch.switch_spec``), and 1 in N
beyond it: an interval whose switch has no sample is charged to the thread's next sampled
switch of the same kind (blocked or preempted) — a sample stands for the N switches of its
period, as a CPU-clock sample stands for the CPU time before it — else its previous one.
Time off CPU before a thread first ran (a new thread waiting for a CPU) has no call path and
goes to the thread's root.

Above the cap the records themselves are turned off (``launch.SWITCH_RECORDS``: a pair of them
is the largest part of the cost of a switch), and on again when the program slows down. In
such a gap a thread's time off CPU is estimated: its life in the gap less its CPU time there
(its CPU-clock samples' periods, short by less than one period), charged to its switch
samples in the gap in proportion to their periods (each stands for that many switches), else
to its root. An interval that a gap cuts is exact up to the gap's start; after the gap, a
thread whose first record is a switch-in was off CPU from the gap's end (it left unseen).

Why records and not the thread's clock read in each sample (``PERF_SAMPLE_READ``, which would
give the same numbers from samples alone): with inherited events that made every context switch
of the program 4-5 times dearer on Linux 6.18, where a pair of switch records costs about
0.5 us (bench/offcpu.py).

Everything here is vectorised over all records and samples: sorts by (thread, time),
``searchsorted`` to pair samples with their switch-out records, running minima/maxima for
"next/previous sampled switch", ``bincount`` for the sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from callpath.measure.perf_records import Samples, Switches

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
_TIME_BITS = 44  # (tid << 44 | time - t0): runs up to 4.8 hours sort as one int64 key


@dataclass
class Life:
    """What the side-band records say of the threads, keyed by (pid, tid): when each one
    started (``starts``: its fork, or the exec that enabled the events) and exited."""

    starts: dict[tuple[int, int], int] = field(default_factory=dict)
    exits: dict[tuple[int, int], int] = field(default_factory=dict)


@dataclass
class ThreadTime:
    """One thread's life from its start (fork, or the exec that enabled the events) to its
    exit (or its last switch record), in ns: ``off`` its time off CPU (exact, from the switch
    records), ``blocked`` the part of it not preempted, ``cpu`` the rest of its life,
    ``unattributed`` the part of ``off`` without a call path (charged to its root)."""

    start: int
    end: int
    cpu: int
    off: float
    unattributed: float
    switches: int          # switch-outs recorded, plus those the gaps' samples stand for
    switch_samples: int    # ... of which sampled with a call path
    blocked: float = 0.0
    #: ns of its life spent in gaps of the switch records, where ``off`` is estimated
    estimated: int = 0
    #: when the first such gap began (ns, the records' clock), -1 if none
    estimated_from: int = -1
    #: the part of ``off`` estimated in those gaps (neither blocked nor preempted)
    estimated_off: float = 0.0

    @property
    def wall(self) -> int:
        return max(self.end - self.start, 0)


@dataclass
class OffCpu:
    """Per sample: the off-CPU time charged to it (switch samples only, ns), when the thread
    ran again after it (``resume``, for the trace) and whether its switch was a preemption
    (1, 0, or -1 where no switch record matched); per thread key (pid, tid): its life."""

    charged: F64
    resume: npt.NDArray[np.uint64]
    preempted: npt.NDArray[np.int8]
    threads: dict[tuple[int, int], ThreadTime]
    #: samples of a switch that the other switch event sampled too (dropped)
    duplicate: npt.NDArray[np.bool_]

    def take(self, keep: npt.NDArray[np.bool_]) -> None:
        """Keep the per-sample arrays of the samples ``keep`` selects."""
        self.charged, self.resume = self.charged[keep], self.resume[keep]
        self.preempted, self.duplicate = self.preempted[keep], self.duplicate[keep]


def compute(s: Samples, switch_metric: int, sw: Switches, life: Life,
            gaps: I64 | None = None, cpu_metric: int = -1) -> OffCpu:
    """Charge every thread's off-CPU intervals to its switch samples; in ``gaps`` ((k, 2)
    sorted disjoint [start, end) ns without switch records) estimate them from the CPU-clock
    samples of ``cpu_metric`` (module docstring)."""
    n = len(s)
    gaps = np.zeros((0, 2), dtype=np.int64) if gaps is None else np.asarray(gaps, np.int64)
    if len(gaps) and len(sw):
        # records inside a gap (written between its start, read before the ioctl, and the
        # ioctl taking effect) are dropped: a gap's start is the last moment all were kept
        st = sw.time.astype(np.int64)
        gi = np.searchsorted(gaps[:, 0], st, side="right") - 1
        kept = ~((gi >= 0) & (st < gaps[np.maximum(gi, 0), 1]))
        if not kept.all():
            sw = Switches(sw.time[kept], sw.pid[kept], sw.tid[kept], sw.out[kept],
                          sw.preempt[kept])
    charged = np.zeros(n, dtype=np.float64)
    resume = s.time.copy()
    preempted = np.zeros(n, dtype=np.int8) - 1  # per sample: 1/0 from its record, -1 unknown
    threads: dict[tuple[int, int], ThreadTime] = {}
    if not len(sw):
        return OffCpu(charged, resume, preempted, threads, np.zeros(n, dtype=bool))
    t0 = int(min(int(sw.time.min()), int(s.time.min()) if n else 1 << 62))
    order = np.lexsort((sw.time, sw.tid, sw.pid))
    pid, tid = sw.pid[order], sw.tid[order]
    t = sw.time[order].astype(np.int64)
    out, pre = sw.out[order], sw.preempt[order]
    m = len(order)
    pos = np.arange(m, dtype=np.int64)
    first = np.ones(m, dtype=bool)
    first[1:] = (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])
    last = np.ones(m, dtype=bool)
    last[:-1] = first[1:]
    gid = np.cumsum(first) - 1
    keys = list(zip(pid[first].tolist(), tid[first].tolist(), strict=True))
    # an out record's interval ends at the thread's next in record (else at its exit)
    nxt_in = np.where(~out, pos, m)
    nxt_in = np.minimum.accumulate(nxt_in[::-1])[::-1]
    nxt_after = np.full(m, m, dtype=np.int64)
    nxt_after[:-1] = nxt_in[1:]
    group_end = np.flatnonzero(last)[gid]
    ends_g = np.array([life.exits.get(k, -1) for k in keys], dtype=np.int64)
    has_in = nxt_after <= group_end
    t_in = np.where(has_in, t[np.minimum(nxt_after, m - 1)], ends_g[gid])
    if len(gaps):
        # an interval ends at the next gap's start; a switch-in that is a thread's first
        # record after a gap ends an interval that began at the gap's end
        g_next = np.searchsorted(gaps[:, 0], t, side="right")
        cut = gaps[np.minimum(g_next, len(gaps) - 1), 0]
        t_in = np.where((g_next < len(gaps)) & (cut < t_in), cut, t_in)
        g_last = np.searchsorted(gaps[:, 1], t, side="right") - 1  # last gap ended by t
        g_end = np.where(g_last >= 0, gaps[np.maximum(g_last, 0), 1], -1)
        prev_t = np.empty(m, dtype=np.int64)
        prev_t[1:] = t[:-1]
        prev_t[first] = -1
        after_gap = ~out & (g_end >= 0) & (g_end > prev_t) & (g_end <= t)
    else:
        after_gap = np.zeros(m, dtype=bool)
        g_end = np.zeros(m, dtype=np.int64)
    off = np.where(out & (t_in > t), t_in - t, 0).astype(np.float64)
    # pair each switch sample with the first out record of its thread at or after it
    ss = np.flatnonzero(s.metric == switch_metric)
    okey = (tid.astype(np.int64) << _TIME_BITS) | (t - t0)
    okey = np.where(out, okey, -1)  # in records never match (keys are >= 0)
    oorder = np.argsort(okey, kind="stable")
    skey = (s.tid[ss].astype(np.int64) << _TIME_BITS) | (s.time[ss].astype(np.int64) - t0)
    at = np.searchsorted(okey[oorder], skey, side="left")
    rec = oorder[np.minimum(at, m - 1)]
    good = (at < m) & out[rec] & (tid[rec] == s.tid[ss]) & (pid[rec] == s.pid[ss]) \
        & (t[rec] - (s.time[ss].astype(np.int64)) < 1_000_000)  # the same switch: within 1 ms
    if len(gaps):  # a sample in a gap has no record: never the first one after the gap
        st = s.time[ss].astype(np.int64)
        gi = np.searchsorted(gaps[:, 0], st, side="right") - 1
        good &= ~((gi >= 0) & (st < gaps[np.maximum(gi, 0), 1]))
    # both switch events may have sampled one switch: keep one sample of it
    gs, gr = ss[good], rec[good]
    by = np.lexsort((gs, gr))
    gs, gr = gs[by], gr[by]
    one = np.ones(len(gr), dtype=bool)
    one[1:] = gr[1:] != gr[:-1]
    duplicate = np.zeros(n, dtype=bool)
    duplicate[gs[~one]] = True
    gs, gr = gs[one], gr[one]
    sample_of = np.full(m, -1, dtype=np.int64)
    sample_of[gr] = gs
    preempted[gs] = pre[gr].astype(np.int8)
    resume[gs] = t_in[gr].astype(np.uint64)
    # every out record's interval to a sampled out record: same thread and kind, next first
    sampled = sample_of >= 0
    target = np.full(m, -1, dtype=np.int64)
    for same_kind in (True, False):
        kind = pre.astype(np.int64) if same_kind else np.zeros(m, dtype=np.int64)
        korder = np.lexsort((t, kind, gid))
        kg = gid[korder] * 2 + kind[korder]
        kfirst = np.ones(m, dtype=bool)
        kfirst[1:] = kg[1:] != kg[:-1]
        kpos = np.arange(m, dtype=np.int64)
        cand = out[korder] & sampled[korder]
        start = np.maximum.accumulate(np.where(kfirst, kpos, 0))
        klast = np.ones(m, dtype=bool)
        klast[:-1] = kfirst[1:]
        stop = np.minimum.accumulate(np.where(klast, kpos, m)[::-1])[::-1]
        nxt = np.minimum.accumulate(np.where(cand, kpos, m)[::-1])[::-1]
        prv = np.maximum.accumulate(np.where(cand, kpos, -1))
        pick = np.where(nxt <= stop, nxt, np.where(prv >= start, prv, -1))
        got = np.where(pick >= 0, korder[np.maximum(pick, 0)], -1)
        todo = (target[korder] < 0) & out[korder]
        target[korder[todo]] = got[todo]
    assigned = out & (target >= 0)
    per_rec = np.bincount(target[assigned], weights=off[assigned], minlength=m)
    charged[sample_of[sampled]] = per_rec[sampled]
    # per thread: its life, and what of it was off CPU (before it first ran too)
    born = np.array([life.starts.get(k, -1) for k in keys], dtype=np.int64)
    fi = np.flatnonzero(first)
    wait0 = np.where((born >= 0) & ~out[fi] & (t[fi] > born) & ~after_gap[fi], t[fi] - born, 0)
    # after a gap, off CPU from the gap's end (or the thread's birth) to its first switch-in
    from_ = np.maximum(g_end, np.where(first, born[gid], -1))
    wait0 = wait0 + np.bincount(gid, weights=np.where(after_gap, t - from_, 0),
                                minlength=len(keys))
    offsum = np.bincount(gid, weights=off, minlength=len(keys)) + wait0
    unattr = np.bincount(gid, weights=np.where(out & (target < 0), off, 0.0),
                         minlength=len(keys)) + wait0
    blocked = np.bincount(gid, weights=np.where(out & ~pre, off, 0.0), minlength=len(keys))
    nsw = np.bincount(gid, weights=out.astype(np.float64), minlength=len(keys))
    nss = np.bincount(gid, weights=sampled.astype(np.float64), minlength=len(keys))
    li = np.flatnonzero(last)
    est = _GapEstimate(s, switch_metric, cpu_metric, gaps)
    for g, k in enumerate(keys):
        lo = int(born[g]) if born[g] >= 0 else int(t[fi[g]])
        hi = int(ends_g[g]) if ends_g[g] >= 0 else int(t[li[g]])
        wall = max(hi - lo, 0)
        add, un, span, since, n_sw, n_ss = est.charge(k, lo, hi, charged)
        th = ThreadTime(lo, hi, 0, float(offsum[g]) + add, float(unattr[g]) + un,
                        int(nsw[g]) + n_sw, int(nss[g]) + n_ss, float(blocked[g]), span,
                        since, add)
        th.cpu = max(wall - round(th.off), 0)
        threads[k] = th
    return OffCpu(charged, resume, preempted, threads, duplicate)


class _GapEstimate:
    """Per thread: its CPU-clock and switch samples that fall in gaps of the switch records,
    to estimate and charge its time off CPU in each gap (module docstring)."""

    def __init__(self, s: Samples, switch_metric: int, cpu_metric: int, gaps: I64) -> None:
        self.gaps, self.s = gaps, s
        self.by: dict[tuple[int, int], I64] = {}
        t = s.time.astype(np.int64)
        self.gi = np.searchsorted(gaps[:, 0], t, side="right") - 1 if len(gaps) else \
            np.zeros(len(s), dtype=np.int64) - 1
        self.is_cpu = s.metric == cpu_metric
        #: every switch sample of each thread, by time: for a gap where it has none
        self.any_sw: dict[tuple[int, int], I64] = {}
        if not len(gaps) or not len(s):
            return
        every = np.flatnonzero(s.metric == switch_metric)
        every = every[np.lexsort((t[every], s.tid[every], s.pid[every]))]
        if len(every):
            p0, q0 = s.pid[every], s.tid[every]
            cut0 = np.flatnonzero((p0[1:] != p0[:-1]) | (q0[1:] != q0[:-1])) + 1
            for part in np.split(every, cut0):
                self.any_sw[(int(s.pid[part[0]]), int(s.tid[part[0]]))] = part
        inside = (self.gi >= 0) & (t < gaps[np.maximum(self.gi, 0), 1]) \
            & ((s.metric == switch_metric) | self.is_cpu)
        idx = np.flatnonzero(inside)
        idx = idx[np.lexsort((s.tid[idx], s.pid[idx]))]
        if not len(idx):
            return
        p, q = s.pid[idx], s.tid[idx]
        cut = np.flatnonzero((p[1:] != p[:-1]) | (q[1:] != q[:-1])) + 1
        for part in np.split(idx, cut):
            self.by[(int(s.pid[part[0]]), int(s.tid[part[0]]))] = part

    def charge(self, key: tuple[int, int], lo: int, hi: int, charged: F64
               ) -> tuple[float, float, int, int, int, int]:
        """Estimate the thread's time off CPU in every gap within its life [lo, hi) and
        charge it to its switch samples there by their periods; returns (time off CPU, the
        part of it without a switch sample, ns of its life in gaps, first gap's start or -1,
        the switches its gaps' switch samples stand for (their periods), those samples)."""
        if not len(self.gaps):
            return 0.0, 0.0, 0, -1, 0, 0
        a = np.clip(self.gaps[:, 0], lo, hi)
        span = np.clip(self.gaps[:, 1], lo, hi) - a
        live = np.flatnonzero(span > 0)
        if not len(live):
            return 0.0, 0.0, 0, -1, 0, 0
        part = self.by.get(key, np.zeros(0, dtype=np.int64))
        g = self.gi[part]
        w = self.s.period[part].astype(np.float64)
        c = self.is_cpu[part]
        cpu = np.bincount(g, weights=np.where(c, w, 0.0), minlength=len(self.gaps))
        nsw = np.bincount(g, weights=np.where(c, 0.0, w), minlength=len(self.gaps))
        off = np.maximum(span - cpu, 0.0)
        sw, gs = part[~c], g[~c]
        charged[sw] += off[gs] * w[~c] / nsw[gs]
        # a gap where the thread has no switch sample (the kernel's frequency mode can leave a
        # thread without one for a while): its next switch sample after the gap, else its
        # previous one, as for a switch without a sample; else its root
        un = 0.0
        own = self.any_sw.get(key, np.zeros(0, dtype=np.int64))
        times = self.s.time[own].astype(np.int64)
        for k in np.flatnonzero((nsw == 0) & (off > 0)).tolist():
            j = int(np.searchsorted(times, self.gaps[k, 1], side="left"))
            j = j if j < len(own) else int(np.searchsorted(times, self.gaps[k, 0])) - 1
            if j >= 0 and len(own):
                charged[own[j]] += off[k]
            else:
                un += float(off[k])
        return (float(off.sum()), un, int(span.sum()), int(a[live[0]]), int(nsw.sum()),
                len(sw))
