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

from callpath.measure.records import Samples, Switches

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
    switches: int          # switch-outs recorded
    switch_samples: int    # ... of which sampled with a call path
    blocked: float = 0.0

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


def compute(s: Samples, switch_metric: int, sw: Switches, life: Life) -> OffCpu:
    """Charge every thread's off-CPU intervals to its switch samples (module docstring)."""
    n = len(s)
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
    wait0 = np.where((born >= 0) & ~out[fi] & (t[fi] > born), t[fi] - born, 0)
    offsum = np.bincount(gid, weights=off, minlength=len(keys)) + wait0
    unattr = np.bincount(gid, weights=np.where(out & (target < 0), off, 0.0),
                         minlength=len(keys)) + wait0
    blocked = np.bincount(gid, weights=np.where(out & ~pre, off, 0.0), minlength=len(keys))
    nsw = np.bincount(gid, weights=out.astype(np.float64), minlength=len(keys))
    nss = np.bincount(gid, weights=sampled.astype(np.float64), minlength=len(keys))
    li = np.flatnonzero(last)
    for g, k in enumerate(keys):
        lo = int(born[g]) if born[g] >= 0 else int(t[fi[g]])
        hi = int(ends_g[g]) if ends_g[g] >= 0 else int(t[li[g]])
        wall = max(hi - lo, 0)
        threads[k] = ThreadTime(lo, hi, max(wall - round(float(offsum[g])), 0),
                                float(offsum[g]), float(unattr[g]), int(nsw[g]),
                                int(nss[g]), float(blocked[g]))
    return OffCpu(charged, resume, preempted, threads, duplicate)
