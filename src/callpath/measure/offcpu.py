"""Time off CPU from context-switch samples (``callpath run -e REALTIME``).

Every sample of a REALTIME run carries its thread's CPU time (the event's ``time_enabled``,
``perf.make_attr(read_time=True)``) beside its wall-clock time. Between two consecutive samples
of a thread, the time it spent off CPU is therefore exact, whatever happened in between:
``(T_i - T_(i-1)) - (C_i - C_(i-1))``. That time is charged to the call path of the latest
context-switch sample at or before ``T_(i-1)``: the place where the thread was switched out
(with one sample per switch, which the kernel gives while a thread switches less often than
the cap, it is exactly the interval that switch began). Off-CPU time before a thread's first
switch sample (a new thread waiting for its first CPU) has no call path and goes to the
thread's root. No record per context switch is needed, so a program switching 10^5 times a
second pays only for the sampled switches (``launch.switch_spec``).

Everything here is vectorised over all samples of a measurement: one sort by (thread, time),
differences, a running maximum for "latest switch sample", one ``bincount``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.measure.records import Samples

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass
class OffCpu:
    """Per sample: the off-CPU time charged to it (switch samples only, ns) and when the
    thread ran again after it (``resume``, ns, for the trace); per thread key (pid, tid): the
    thread's life and what it is made of."""

    charged: F64
    resume: npt.NDArray[np.uint64]
    threads: dict[tuple[int, int], ThreadTime]


@dataclass
class ThreadTime:
    """One thread's wall-clock time from its start (fork, or the exec that enabled the
    events) to its exit (or its last sample), in ns: ``cpu`` from the kernel's clock of the
    thread, ``off`` = off-CPU time found between samples, ``unattributed`` the part of ``off``
    before the thread's first switch sample (charged to its root)."""

    start: int
    end: int
    cpu: int
    off: float
    unattributed: float
    switches: int          # context switches the switch samples stand for (sum of periods)
    switch_samples: int
    # set by postmortem once the leaves are classified: off-CPU time in a system call
    blocked: float = 0.0

    @property
    def wall(self) -> int:
        return max(self.end - self.start, 0)


def compute(s: Samples, switch_metric: int, starts: dict[tuple[int, int], int],
            exits: dict[tuple[int, int], int]) -> OffCpu:
    """Charge every thread's off-CPU time to its switch samples (module docstring).

    ``starts``/``exits``: (pid, tid) → time of the thread's birth (fork record; the exec for
    a process's first thread, whose events start counting there) and of its exit record.
    """
    n = len(s)
    charged = np.zeros(n, dtype=np.float64)
    resume = s.time.copy()
    threads: dict[tuple[int, int], ThreadTime] = {}
    if n == 0:
        return OffCpu(charged, resume, threads)
    order = np.lexsort((s.time, s.tid, s.pid))
    pid, tid = s.pid[order], s.tid[order]
    t = s.time[order].astype(np.int64)
    c = s.cputime[order].astype(np.int64)
    sw = s.metric[order] == switch_metric
    pos = np.arange(n, dtype=np.int64)
    first = np.ones(n, dtype=bool)
    first[1:] = (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])
    group_start = np.maximum.accumulate(np.where(first, pos, 0))
    last = np.ones(n, dtype=bool)
    last[:-1] = first[1:]
    # off-CPU time in (T_(i-1), T_i], for i not the first of its thread
    off = np.zeros(n, dtype=np.float64)
    off[1:] = (np.diff(t) - np.diff(c)).astype(np.float64)
    # before the first sample: from the thread's start (the CPU clock starts there too)
    keys = list(zip(pid[first].tolist(), tid[first].tolist(), strict=True))
    born = np.array([starts.get(k, -1) for k in keys], dtype=np.int64)
    fi = np.flatnonzero(first)
    off[fi] = np.where(born >= 0, (t[fi] - born) - c[fi], 0).astype(np.float64)
    np.maximum(off, 0.0, out=off)  # two clocks (CLOCK_MONOTONIC, the scheduler's): ns jitter
    latest_sw = np.maximum.accumulate(np.where(sw, pos, -1))
    latest_sw = np.where(latest_sw >= group_start, latest_sw, -1)
    target = np.full(n, -1, dtype=np.int64)
    target[1:] = latest_sw[:-1]
    target[first] = -1
    # after the last sample: a thread last seen switching out stayed off CPU until its exit
    # (the CPU it used after waking is below one clock period: no clock sample came)
    li = np.flatnonzero(last)
    ends = np.array([exits.get(k, -1) for k in zip(pid[li].tolist(), tid[li].tolist(),
                                                    strict=True)], dtype=np.int64)
    tail = np.where(sw[li] & (ends > t[li]), ends - t[li], 0).astype(np.float64)
    to_sample = target >= 0
    sums: F64 = np.bincount(target[to_sample], weights=off[to_sample],
                            minlength=n).astype(np.float64)
    sums[li] += tail  # the last sample is its own latest switch when it is a switch
    charged[order] = sums
    # when each switch sample's thread ran again: the off-CPU time of the interval right
    # after it (exact with one sample per switch)
    nxt = np.zeros(n, dtype=np.float64)
    nxt[:-1] = np.where(~last[:-1], off[1:], 0.0)
    nxt[li] = tail
    resume[order] = (t + np.where(sw, nxt, 0.0).astype(np.int64)).astype(np.uint64)
    unattr = np.bincount(np.cumsum(first) - 1, weights=np.where(target < 0, off, 0.0))
    offsum = np.bincount(np.cumsum(first) - 1, weights=off) + tail
    nsw = np.bincount(np.cumsum(first) - 1, weights=np.where(sw, s.period[order], 0))
    nsws = np.bincount(np.cumsum(first) - 1, weights=sw.astype(np.float64))
    for g, (k, b) in enumerate(zip(keys, born.tolist(), strict=True)):
        end = int(ends[g]) if ends[g] >= 0 else int(t[li[g]])
        start = b if b >= 0 else int(t[fi[g]])
        # CPU time: the clock at the last sample, plus what ran after it (none when it was
        # a switch-out that lasted to the exit)
        cpu_end = int(c[li[g]]) + max(end - int(t[li[g]]) - int(tail[g]), 0)
        threads[k] = ThreadTime(start, end, cpu_end, float(offsum[g]), float(unattr[g]),
                                int(nsw[g]), int(nsws[g]))
    return OffCpu(charged, resume, threads)
