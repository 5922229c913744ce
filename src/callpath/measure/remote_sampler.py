"""Sample the Python call paths of a running CPython process from outside it (``run --pid``).

Why a sampler outside the process: an already running program has no sampler inside it and
cannot be given one without injecting code. At every tick this reads each thread's Python stack
from the interpreter's memory (``remote_python``; the program is never stopped) and the
thread's scheduler state from ``/proc``: a thread found running is charged the tick's CPU time
(CPUTIME), every thread the wall time since its previous sample (REALTIME), the two metrics the
in-process sampler writes. The result is an ordinary measurement directory with PYTHON nodes
(file, function, line), so ``prof``, ``report`` and ``view`` read it unchanged.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from callpath.formats import measdir
from callpath.measure.attach import STOP_SIGNALS, StopRequests
from callpath.measure.remote_python import PyThread, RemotePython

METRICS = [
    measdir.MetricInfo("CPUTIME", "ns", 0, 0, "CPU time: ticks at which the thread was found "
                       "running (read from outside the process)", "python:remote-cpu"),
    measdir.MetricInfo("REALTIME", "ns", 0, 0, "wall-clock time since the thread's previous "
                       "sample", "python:remote-wall"),
]


@dataclass
class _Thread:
    index: int
    tid: int
    name: str
    parent: list[int] = field(default_factory=lambda: [-1])
    code: list[int] = field(default_factory=lambda: [-1])
    line: list[int] = field(default_factory=lambda: [0])
    idle: list[int] = field(default_factory=lambda: [0])
    children: dict[tuple[int, int, int, int], int] = field(default_factory=dict)
    counts: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    last: int = 0
    samples: int = 0
    unreadable: int = 0


@dataclass
class RemoteResult:
    samples: int
    unreadable: int
    ticks: int
    exited: bool
    wall_s: float
    threads: int


_STAT_FDS: dict[tuple[int, int], int] = {}


def _running(pid: int, tid: int) -> bool:
    """Whether the thread is on a CPU (or runnable): its /proc stat, kept open and re-read
    with pread (opening it at every tick cost a sixth of the sampler's CPU)."""
    fd = _STAT_FDS.get((pid, tid))
    try:
        if fd is None:
            fd = os.open(f"/proc/{pid}/task/{tid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            _STAT_FDS[(pid, tid)] = fd
        text = os.pread(fd, 1024, 0)
        return text.rsplit(b")", 1)[1].split()[0] == b"R"
    except (OSError, IndexError):
        return False


def _close_stats() -> None:
    for fd in _STAT_FDS.values():
        os.close(fd)
    _STAT_FDS.clear()


def _name(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


class RemoteSampler:
    """Aggregates samples into per-thread trees as they come (memory grows with distinct
    paths, not with time)."""

    def __init__(self, remote: RemotePython, frequency: float) -> None:
        self.remote = remote
        self.period_ns = int(1e9 / frequency)
        self.threads: dict[int, _Thread] = {}
        self.codes: dict[tuple[str, str, int], int] = {}

    def _node(self, th: _Thread, parent: int, code: int, line: int, idle: int) -> int:
        key = (parent, code, line, idle)
        n = th.children.get(key)
        if n is None:
            n = len(th.parent)
            th.children[key] = n
            th.parent.append(parent)
            th.code.append(code)
            th.line.append(line)
            th.idle.append(idle)
        return n

    def add(self, t: PyThread, now: int) -> None:
        pid = self.remote.pid
        th = self.threads.get(t.native_id)
        if th is None:
            th = _Thread(len(self.threads), t.native_id, _name(pid, t.native_id), last=now)
            self.threads[t.native_id] = th
        if t.error:
            th.unreadable += 1
            th.last = now
            return
        running = _running(pid, t.native_id)
        node = 0
        for i, f in enumerate(reversed(t.frames)):
            key = (f.code.file, f.code.name, f.code.first_line)
            ci = self.codes.setdefault(key, len(self.codes))
            leaf = i == len(t.frames) - 1
            node = self._node(th, node, ci, f.line, int(leaf and not running))
        wall = max(now - th.last, 0) if th.samples else self.period_ns
        th.last = now
        th.samples += 1
        if running:
            c = th.counts.setdefault((node, 0), [0, 0.0])
            c[0] += 1
            c[1] += self.period_ns
        c = th.counts.setdefault((node, 1), [0, 0.0])
        c[0] += 1
        c[1] += wall

    def write(self, out: Path, facts: dict[str, Any],
              metrics: list[measdir.MetricInfo]) -> None:
        pid = self.remote.pid
        node_id = measdir.host_id()
        rank = facts.get("rank")
        codes = sorted(self.codes.items(), key=lambda kv: kv[1])
        with measdir.ProcessWriter(out, pid, 0) as w:
            w.process(pid=pid, ppid=int(facts.get("ppid", 0) or 0), generation=0,
                      exe=facts.get("exe", ""), comm=facts.get("comm", ""), rank=rank,
                      host=os.uname().nodename, node_id=node_id, forked_from=None,
                      python=".".join(map(str, self.remote.version)))
            w.metrics(metrics)
            w.modules([])
            w.pycode(measdir.PyCode(f, n, ln) for (f, n, ln), _ in codes)
            order = sorted(self.threads.values(), key=lambda th: (th.tid != pid, th.index))
            for slot, th in enumerate(order):
                w.thread(slot, tid=th.tid, ids=measdir.context_ids(node_id, rank, slot),
                         index=slot, name=th.name)
                kind = np.where(np.array(th.code) < 0, measdir.NodeKind.ROOT,
                                measdir.NodeKind.PYTHON)
                flags = np.array(th.idle) * int(measdir.NodeFlag.IDLE)
                w.nodes(slot, measdir.make_nodes(th.parent, kind, th.code, th.line, flags))
                rows = np.zeros(len(th.counts), dtype=measdir.COUNT_DTYPE)
                for i, ((node, metric), (n, v)) in enumerate(sorted(th.counts.items())):
                    rows[i] = (node, metric, n, v)
                w.counts(slot, rows)
                w.stats(slot, samples=th.samples, unreadable=th.unreadable)


def record(pid: int, remote: RemotePython, out: Path, *, duration: float | None,
           frequency: float, pidfd: int | None,
           stop: StopRequests) -> tuple[RemoteSampler, RemoteResult]:
    """Sample until ``duration`` passes, the process exits, or SIGINT/SIGTERM/SIGHUP."""
    sampler = RemoteSampler(remote, frequency)
    period = 1.0 / frequency
    start = time.monotonic()
    deadline = None if duration is None else start + duration
    ticks = unreadable = 0
    exited = False
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        nxt = start
        while True:
            now = time.monotonic_ns()
            try:
                threads = remote.threads()
            except ProcessLookupError:
                exited = True
                break
            except PermissionError as e:
                from callpath.measure.attach import access_error

                raise access_error(pid, e.errno or 1, "read the memory of") from None
            except Exception:
                unreadable += 1
                threads = []
            ticks += 1
            for t in threads:
                sampler.add(t, now)
            nxt += period
            if deadline is not None and time.monotonic() >= deadline:
                break
            wait = max(nxt - time.monotonic(), 0.0)
            if wait == 0.0:
                nxt = time.monotonic()  # fell behind (a loaded machine): no burst to catch up
            if stop.wait(wait):
                break
            if not _alive(pid, pidfd):
                exited = True
                break
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        _close_stats()
    samples = sum(th.samples for th in sampler.threads.values())
    unreadable += sum(th.unreadable for th in sampler.threads.values())
    return sampler, RemoteResult(samples, unreadable, ticks, exited, time.monotonic() - start,
                                 len(sampler.threads))


def _alive(pid: int, pidfd: int | None) -> bool:
    from callpath.measure.attach import _alive as alive

    return alive(pid, pidfd)


def attach_python(pid: int, out: Path, *, duration: float | None, frequency: float,
                  remote: RemotePython) -> RemoteResult:
    """Measure the Python process ``pid`` into the new measurement directory ``out``."""
    from callpath.measure import launch

    created = measdir.make_new_directory(out)
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except OSError:
        pidfd = None
    try:
        cmdline = [a.decode("utf-8", "replace") for a in
                   Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        facts = launch._proc_facts(pid)
        facts["comm"] = Path(f"/proc/{pid}/comm").read_text().strip()
        facts["ppid"] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        cmdline, facts = [], {"pid": pid}
    metrics = [measdir.MetricInfo(m.name, m.unit, m.period, round(frequency), m.description,
                                  m.event) for m in METRICS]
    start = time.time()
    # a stop signal from now on ends the sampling, not the program: the header is the sign
    # that sampling is starting (the notebook magic waits for it, then may stop us at once)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        with StopRequests() as stop:
            measdir.write_header(out, metrics, command=cmdline, program=facts.get("exe", ""),
                                 status="running", start_time=start, attached_pid=pid,
                                 sampler="python-remote")
            sampler, res = record(pid, remote, out, duration=duration, frequency=frequency,
                                  pidfd=pidfd, stop=stop)
            sampler.write(out, facts, metrics)
    except BaseException:
        launch._discard(out, created)
        raise
    finally:
        while signal.sigtimedwait(STOP_SIGNALS, 0) is not None:
            pass  # a second Ctrl-C while writing: the measurement is already complete
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if pidfd is not None:
            os.close(pidfd)
    summary = {"samples": res.samples, "partial": 0, "lost": 0, "throttled": 0,
               "undecodable": res.unreadable, "ticks": res.ticks,
               "contexts": [{"pid": pid, "tid": th.tid, "thread": i, "rank": facts.get("rank"),
                             "samples": th.samples, "partial": th.unreadable}
                            for i, th in enumerate(sampler.threads.values())]}
    measdir.write_header(out, metrics, command=cmdline, program=facts.get("exe", ""),
                         status="complete", start_time=start, attached_pid=pid,
                         sampler="python-remote", summary=summary)
    return res
