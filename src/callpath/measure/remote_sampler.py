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
from typing import TYPE_CHECKING, Any

import numpy as np

from callpath.formats import measdir
from callpath.measure.attach_pid import STOP_SIGNALS, StopRequests
from callpath.measure.remote_python import PyThread, RemotePython

if TYPE_CHECKING:
    from callpath.measure.remote_native import NativeCapture, NativeStacks, Pairing

#: a frame of the tree: (kind, code or module, line or address, flags), as merge.Key
Key = tuple[int, int, int, int]
#: a Python stack as interned: (code index, line, entry) innermost first
PyStack = tuple[tuple[int, int, bool], ...]

_PYTHON = int(measdir.NodeKind.PYTHON)

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
    #: the calling context tree: node 0 is the root; node i > 0 has parent ``parent[i]`` and
    #: the frame ``keys[i]`` (kind, code or module, line or address, flags)
    parent: list[int] = field(default_factory=lambda: [-1])
    keys: list[Key] = field(default_factory=lambda: [(int(measdir.NodeKind.ROOT), -1, 0, 0)])
    children: dict[tuple[int, Key], int] = field(default_factory=dict)
    counts: dict[tuple[int, int], list[float]] = field(default_factory=dict)
    last: int = 0
    samples: int = 0
    unreadable: int = 0
    #: with --native, the ticks kept until the native samples are unwound: time, running,
    #: wall, Python stack (an index into the sampler's interned stacks; unreadable: < 0),
    #: the innermost frame's instruction pointer
    log: list[tuple[int, bool, int, int, int]] = field(default_factory=list)

    def insert(self, path: list[Key], idle: bool) -> int:
        """The leaf node of ``path`` (root first), made where missing; ``idle`` marks it."""
        node = 0
        last = len(path) - 1
        for d, key in enumerate(path):
            if d == last and idle:
                key = (key[0], key[1], key[2], key[3] | int(measdir.NodeFlag.IDLE))
            n = self.children.get((node, key))
            if n is None:
                n = len(self.parent)
                self.children[(node, key)] = n
                self.parent.append(node)
                self.keys.append(key)
            node = n
        return node

    def charge(self, node: int, running: bool, period: int, wall: int) -> None:
        if running:
            c = self.counts.setdefault((node, 0), [0, 0.0])
            c[0] += 1
            c[1] += period
        c = self.counts.setdefault((node, 1), [0, 0.0])
        c[0] += 1
        c[1] += wall


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
    paths, not with time); with ``--native``, keeps each tick (a few words) until the native
    stacks are unwound, then merges and aggregates them (``merge_native``)."""

    def __init__(self, remote: RemotePython, frequency: float, native: bool = False) -> None:
        self.remote = remote
        self.period_ns = int(1e9 / frequency)
        self.threads: dict[int, _Thread] = {}
        self.codes: dict[tuple[str, str, int], int] = {}
        self.native = native
        self.stacks: dict[PyStack, int] = {}
        self.modules: list[measdir.Module] = []
        self.pairing: Pairing | None = None
        self.interpreter_frames = "elided"

    def add(self, t: PyThread, now: int) -> None:
        pid = self.remote.pid
        th = self.threads.get(t.native_id)
        if th is None:
            th = _Thread(len(self.threads), t.native_id, _name(pid, t.native_id), last=now)
            self.threads[t.native_id] = th
        if t.error:
            th.unreadable += 1
            th.last = now
            if self.native:
                th.log.append((now, False, 0, -1 - len(th.log), 0))
            return
        running = _running(pid, t.native_id)
        stack: PyStack = tuple((self.codes.setdefault((f.code.file, f.code.name,
                                                       f.code.first_line), len(self.codes)),
                                f.line, f.entry) for f in t.frames)
        wall = max(now - th.last, 0) if th.samples else self.period_ns
        th.last = now
        th.samples += 1
        if self.native:
            th.log.append((now, running, wall, self.stacks.setdefault(stack, len(self.stacks)),
                           t.frames[0].instr if t.frames else 0))
            return
        th.charge(th.insert(_python_path(stack), not running), running, self.period_ns, wall)

    def merge_native(self, native: NativeStacks, keep_interpreter: bool) -> Pairing:
        """Each kept tick with its native sample (``remote_native``), into the trees."""
        from callpath.measure.remote_native import (
            Pairing,
            keep_used_modules,
            merged_path,
            nearest_samples,
        )

        stacks = list(self.stacks)
        pairing = Pairing()
        memo: dict[tuple[int, int, int], tuple[list[Key], str]] = {}
        for th in self.threads.values():
            if not th.log:
                continue
            times = np.array([e[0] for e in th.log], dtype=np.int64)
            ids = np.array([e[3] for e in th.log], dtype=np.int64)
            st = native.times.get(th.tid, np.zeros(0, dtype=np.int64))
            rows = native.paths.get(th.tid, [])
            after, before = nearest_samples(times, ids, st)
            for (t, running, wall, sid, instr), ka, kb in zip(th.log, after.tolist(),
                                                              before.tolist(), strict=True):
                if sid < 0:
                    continue  # unreadable: counted, no path
                path: list[Key] = []
                cands = sorted((abs(int(st[k]) - t), k) for k in (ka, kb) if k >= 0)
                k = next((k for _d, k in cands if native.holds(th.tid, k, instr)), -1)
                if k >= 0:
                    got = memo.get((th.tid, k, sid))
                    if got is None:
                        got = memo[(th.tid, k, sid)] = merged_path(
                            stacks[sid], rows[k], native.interpreter, keep_interpreter,
                            native.gil)
                    path, state = got
                    if state == "unmatched":
                        pairing.unmatched += 1
                    else:
                        pairing.merged += 1
                        pairing.partial += state == "partial"
                elif cands:
                    pairing.unconfirmed += 1
                else:
                    pairing.python_only += 1
                if not path:
                    path = _python_path(stacks[sid])
                th.charge(th.insert(path, not running), running, self.period_ns, wall)
            th.log.clear()
        # threads that run no Python code (BLAS or OpenMP workers, a C library's threads):
        # each native sample is their CPU time there (no tick reads them: no wall time)
        for tid in sorted(set(native.paths) - set(self.threads)):
            th = _Thread(len(self.threads), tid, _name(self.remote.pid, tid))
            self.threads[tid] = th
            for k in range(len(native.paths[tid])):
                node = th.insert(native.native_path(tid, k), False)
                c = th.counts.setdefault((node, 0), [0, 0.0])
                c[0] += 1
                c[1] += float(native.period[native.index[tid][k]])
                th.samples += 1
            pairing.native_only_threads += 1
        used = {k[1] for th in self.threads.values() for k in th.keys
                if k[0] == int(measdir.NodeKind.NATIVE)}
        self.modules, renum = keep_used_modules(native.modules, used)
        for th in self.threads.values():
            th.keys = [(k[0], renum[k[1]], k[2], k[3]) if k[0] == int(measdir.NodeKind.NATIVE)
                       else k for k in th.keys]
        self.pairing = pairing
        self.interpreter_frames = "kept" if keep_interpreter else "elided"
        return pairing

    def write(self, out: Path, facts: dict[str, Any],
              metrics: list[measdir.MetricInfo]) -> None:
        pid = self.remote.pid
        node_id = measdir.host_id()
        rank = facts.get("rank")
        codes = sorted(self.codes.items(), key=lambda kv: kv[1])
        info: dict[str, Any] = {}
        if self.pairing is not None:
            p = self.pairing
            info["native_merge"] = {"merged": p.merged, "python_only": p.python_only,
                                    "unconfirmed": p.unconfirmed,
                                    "native_only_threads": p.native_only_threads,
                                    "unmatched": p.unmatched, "partial": p.partial,
                                    "interpreter_frames": self.interpreter_frames}
        with measdir.ProcessWriter(out, pid, 0) as w:
            w.process(pid=pid, ppid=int(facts.get("ppid", 0) or 0), generation=0,
                      exe=facts.get("exe", ""), comm=facts.get("comm", ""), rank=rank,
                      host=os.uname().nodename, node_id=node_id, forked_from=None,
                      python=".".join(map(str, self.remote.version)), **info)
            w.metrics(metrics)
            w.modules(self.modules)
            w.pycode(measdir.PyCode(f, n, ln) for (f, n, ln), _ in codes)
            order = sorted(self.threads.values(), key=lambda th: (th.tid != pid, th.index))
            for slot, th in enumerate(order):
                w.thread(slot, tid=th.tid, ids=measdir.context_ids(node_id, rank, slot),
                         index=slot, name=th.name)
                keys = np.array(th.keys, dtype=np.int64).reshape(-1, 4)
                w.nodes(slot, measdir.make_nodes(th.parent, keys[:, 0], keys[:, 1],
                                                 keys[:, 2].astype(np.uint64), keys[:, 3]))
                rows = np.zeros(len(th.counts), dtype=measdir.COUNT_DTYPE)
                for i, ((node, metric), (n, v)) in enumerate(sorted(th.counts.items())):
                    rows[i] = (node, metric, n, v)
                w.counts(slot, rows)
                w.stats(slot, samples=th.samples, unreadable=th.unreadable)


def _python_path(stack: PyStack) -> list[Key]:
    """A Python stack (innermost first) as a path of PYTHON frames, root first."""
    return [(_PYTHON, ci, line, 0) for ci, line, _entry in reversed(stack)]


def record(pid: int, remote: RemotePython, out: Path, *, duration: float | None,
           frequency: float, pidfd: int | None, stop: StopRequests,
           native: NativeCapture | None = None) -> tuple[RemoteSampler, RemoteResult]:
    """Sample until ``duration`` passes, the process exits, or SIGINT/SIGTERM/SIGHUP; with
    ``native``, its rings are copied at every tick."""
    sampler = RemoteSampler(remote, frequency, native=native is not None)
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
                from callpath.measure.attach_pid import access_error

                raise access_error(pid, e.errno or 1, "read the memory of") from None
            except Exception:
                unreadable += 1
                threads = []
            ticks += 1
            for t in threads:
                sampler.add(t, now)
            if native is not None:
                native.copy()
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
    from callpath.measure.attach_pid import _alive as alive

    return alive(pid, pidfd)


def attach_python(pid: int, out: Path, *, duration: float | None, frequency: float,
                  remote: RemotePython, native: bool = False, keep_interpreter: bool = False,
                  stack_size: int = 0) -> tuple[RemoteResult, Pairing | None]:
    """Measure the Python process ``pid`` into the new measurement directory ``out``; with
    ``native``, its native stacks too, merged below the Python frames (``remote_native``)."""
    from callpath.measure import perf_launch as launch

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
    capture: NativeCapture | None = None
    pairing: Pairing | None = None
    # a stop signal from now on ends the sampling, not the program: the header is the sign
    # that sampling is starting (the notebook magic waits for it, then may stop us at once)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        if native:
            from callpath.measure.remote_native import NativeCapture

            capture = NativeCapture(pid, out, stack_size)
        with StopRequests() as stop:
            measdir.write_header(out, metrics, command=cmdline, program=facts.get("exe", ""),
                                 status="running", start_time=start, attached_pid=pid,
                                 sampler="python-remote", native=native)
            if capture is not None:
                capture.start()
            try:
                sampler, res = record(pid, remote, out, duration=duration,
                                      frequency=frequency, pidfd=pidfd, stop=stop,
                                      native=capture)
            finally:
                if capture is not None:
                    capture.stop()
            if capture is not None:
                from callpath.measure.remote_native import unwind_samples

                stacks = unwind_samples(out, capture.raw_info, pid)
                pairing = sampler.merge_native(stacks, keep_interpreter)
                if not any(m.saved for m in sampler.modules):
                    for f in out.glob("vdso*.so"):
                        f.unlink()
            sampler.write(out, facts, metrics)
    except BaseException:
        if capture is not None:
            capture.opened.close()
        launch._discard(out, created)
        raise
    finally:
        while signal.sigtimedwait(STOP_SIGNALS, 0) is not None:
            pass  # a second Ctrl-C while writing: the measurement is already complete
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        if pidfd is not None:
            os.close(pidfd)
    summary = {"samples": res.samples, "partial": pairing.partial if pairing else 0,
               "lost": 0, "throttled": 0,
               "undecodable": res.unreadable, "ticks": res.ticks,
               "contexts": [{"pid": pid, "tid": th.tid, "thread": i, "rank": facts.get("rank"),
                             "samples": th.samples, "partial": th.unreadable}
                            for i, th in enumerate(sampler.threads.values())]}
    measdir.write_header(out, metrics, command=cmdline, program=facts.get("exe", ""),
                         status="complete", start_time=start, attached_pid=pid,
                         sampler="python-remote", native=native, summary=summary)
    return res, pairing
