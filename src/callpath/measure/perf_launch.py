"""Start a program under perf_event sampling and stream its ring buffers to disk.

The program is forked, waits on a pipe while the events are opened on it (one per CPU,
inherited, enabled on exec), then execs: nothing of the launcher is measured, and every thread
and child of the program is. The launcher then only drains the rings into ``raw.perf`` (bulk
copies; records are decoded post-mortem), notes each new process's environment (MPI rank) and
executable while it is alive, forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT that were not sent to the
program's terminal group anyway, and reaps every descendant (it is their subreaper) so no zombie
is left. The raw file is appended and flushed as it comes, so what was sampled survives the
program crashing, being killed, or the launcher itself being killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import mmap
import os
import select
import shutil
import signal
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from callpath.errors import CallpathError
from callpath.formats import measdir
from callpath.measure import perf
from callpath.measure.perf import EventSpec
from callpath.measure.perf_events import unit_of

RAW_FILE = "raw.perf"
PROCS_FILE = "raw-procs.jsonl"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
SI_KERNEL = 0x80  # si_code of signals the terminal driver sends
PR_SET_CHILD_SUBREAPER = 36
REC_COMM, REC_FORK, REC_EXIT = 3, 7, 4
MISC_COMM_EXEC = 0x2000
_FORK_SIZE = 64  # header, pid ppid tid ptid time, sample-id trailer
_HDR = struct.Struct("<IHH")
_TRAILER = struct.Struct("<IIQIIQ")  # pid, tid, time, cpu, res, identifier (sample_id_all)


@dataclass
class RunOptions:
    events: list[EventSpec]
    out: Path
    trace: bool = False
    stack_size: int = perf.DEFAULT_STACK_SIZE
    ring_pages: int = 0  # data pages per CPU ring; 0: 8 MiB, less beyond 8 CPUs (64 MiB in all)
    linger: float = 2.0     # seconds to keep measuring descendants after the program exits
    nice: int = 5           # the launcher yields the CPU to the program it measures
    #: ``-e REALTIME``: the first event is the CPU clock; context switches are sampled too
    #: (at most ``switch_frequency`` stacks per second per thread and CPU, the kernel adapting
    #: the period) and every switch out and in is recorded (``realtime_metrics``)
    realtime: bool = False
    switch_frequency: int = 250
    switch_limit: int = 2000  # switches/s of the program above which not every one is sampled


#: the software event of the switch samples of -e REALTIME (two of them: below)
SWITCH_EVENT = "context-switches"


def switch_spec(frequency: int) -> EventSpec:
    """Context switches of the program's threads, at most ``frequency`` samples per second
    per thread and CPU (the kernel adapts the period at each sample): the cap that keeps a
    program switching 10^5 times a second from being slowed by its stack copies."""
    return EventSpec(SWITCH_EVENT, 1, 3, 0, frequency)


#: the second switch event of -e REALTIME: a sample at every switch, while the program
#: switches less than ``RunOptions.switch_limit`` times a second (the launcher turns it off
#: above, on again below half of it). The kernel's frequency mode alone samples 1 in 2 or
#: worse after a burst of switches and never comes back to 1 for a thread that then
#: switches slowly (it adapts only at samples less than two ticks apart, or at a tick with
#: new events), so the blocked interval that matters would often have no call path.
EVERY_SWITCH = EventSpec(SWITCH_EVENT, 1, 3, 1, 0)

#: the carrier of -e REALTIME's switch records: a software "dummy" event (it never counts nor
#: samples) with ``context_switch``, so that the launcher can turn the records off on their own
#: while the program switches faster than ``RunOptions.switch_limit``. A pair of records is
#: the largest part of REALTIME's cost per switch (bench/offcpu.py: 1.3 of 2.3 us); above the
#: limit the time off CPU is estimated instead (``offcpu.compute``, ``GAPS_FILE``).
SWITCH_RECORDS = EventSpec("dummy", 1, 9, 1 << 62, 0)
#: -e REALTIME: the [start, end) CLOCK_MONOTONIC ns during which the switch records were off
GAPS_FILE = "switch-gaps.json"


def realtime_metrics(cpu: EventSpec, frequency: int) -> list[measdir.MetricInfo]:
    """The three metrics of ``-e REALTIME``, in this order (indices 0, 1, 2 of the header):
    wall-clock = CPU time + time off CPU, each at its call path."""
    return [
        measdir.MetricInfo("REALTIME", "ns", cpu.period, cpu.frequency,
                           "wall-clock time: CPU time (cpu-clock samples) plus time off CPU "
                           "(charged where the thread was switched out)", "REALTIME"),
        measdir.MetricInfo("CPUTIME", "ns", cpu.period, cpu.frequency,
                           "CPU time (cpu-clock samples)", cpu.name),
        measdir.MetricInfo("OFFCPU", "ns", 0, frequency,
                           "time off CPU (blocked, or runnable and waiting for a CPU), at the "
                           "call path where the thread was switched out", SWITCH_EVENT),
    ]


@dataclass
class OpenedEvent:
    spec: EventSpec
    metric: int
    ids: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)


@dataclass
class RunResult:
    exit_status: int  # as os.waitstatus_to_exitcode: negative for a fatal signal
    events: list[OpenedEvent]
    failed: list[tuple[EventSpec, str]]
    raw_bytes: int
    wall_s: float
    #: -e REALTIME: seconds during which the program switched too often for a call path at
    #: every switch (the capped event sampled alone)
    switch_capped_s: float = 0.0


def resolve_program(cmd: list[str]) -> str:
    """The executable to run, or a one-line error naming it."""
    if not cmd:
        raise CallpathError("no program to run: expected 'callpath run [options] -- CMD ARGS'")
    prog = cmd[0]
    if "/" in prog:
        path = prog
        if not os.path.exists(path):
            raise CallpathError(f"{prog}: no such file")
    else:
        found = shutil.which(prog)
        if found is None:
            raise CallpathError(f"{prog}: command not found in PATH")
        path = found
    if os.path.isdir(path):
        raise CallpathError(f"{prog}: is a directory, expected an executable program")
    if not os.access(path, os.X_OK):
        raise CallpathError(f"{prog}: not executable (permission denied)")
    return path


def probe_events(specs: list[EventSpec]) -> list[tuple[EventSpec, str | None]]:
    """Try to open each event (sampling this process, briefly): None, or the reason it fails."""
    out: list[tuple[EventSpec, str | None]] = []
    for spec in specs:
        attr = perf.make_attr(spec, inherit=False, stack_size=0)
        attr.flags &= ~perf.F_ENABLE_ON_EXEC
        try:
            fd = perf.perf_event_open(attr, 0, -1)
        except OSError as e:
            out.append((spec, perf.explain(e.errno or 0, spec)))
        else:
            os.close(fd)
            out.append((spec, None))
    return out


def _save_vdso(directory: Path) -> str:
    """Copy this process's vdso image (the same kernel maps the same vdso into the program)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if line.rstrip().endswith("[vdso]"):
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    with open("/proc/self/mem", "rb") as mem:
                        mem.seek(lo)
                        image = mem.read(hi - lo)
                    (directory / "vdso.so").write_bytes(image)
                    return "vdso.so"
    except OSError:
        pass
    return ""


def _proc_facts(pid: int) -> dict[str, Any]:
    facts: dict[str, Any] = {"pid": pid}
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
        env = dict(kv.split("=", 1) for kv in raw.decode("utf-8", "replace").split("\0")
                   if "=" in kv)
        facts["rank"] = measdir.rank_from_environ(env)
    except OSError:
        facts["rank"] = None
    try:
        facts["exe"] = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        facts["exe"] = ""
    return facts


def ring_pages_for(ncpus: int) -> int:
    """Data pages per CPU ring: 8 MiB (about 1,000 samples of 8 KiB, 1 s at 1 kHz), less
    beyond 8 CPUs so that all rings together stay at 64 MiB; a power of two, at least 1 MiB."""
    budget = (64 << 20) // max(ncpus, 1)
    size = 1 << 20
    while size * 2 <= min(budget, 8 << 20):
        size *= 2
    return size // mmap.PAGESIZE


def join_ring(fd: int, cpu: int, leaders: dict[int, int], rings: list[perf.RingBuffer],
              pages: int) -> None:
    """Send event ``fd``'s records into ``cpu``'s ring: the first event opened on a CPU
    becomes its leader and its ring is mapped (``rings``); every later one writes into the
    leader's (``PERF_EVENT_IOC_SET_OUTPUT``), so one reader drains one ring per CPU."""
    if cpu in leaders:
        perf.ioctl(fd, perf.PERF_EVENT_IOC_SET_OUTPUT, leaders[cpu])
    else:
        leaders[cpu] = fd
        rings.append(perf.RingBuffer(fd, pages))


def _open_user_or_all(attr: perf.PerfEventAttr, pid: int, cpu: int) -> int:
    """Open counting kernel time too (a sample in a system call is charged to the user
    context that made it); an unprivileged user may only count user time: retry so."""
    try:
        return perf.perf_event_open(attr, pid, cpu)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM):
            raise
        attr.flags |= perf.F_EXCLUDE_KERNEL
        return perf.perf_event_open(attr, pid, cpu)


class _Gate:
    """Fork a child that waits for 'go' before exec'ing the program."""

    def __init__(self, path: str, argv: list[str], old_mask: set[Any]) -> None:
        gate_r, self.gate_w = os.pipe()
        self.err_r, err_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # child
            try:
                os.close(self.gate_w)
                os.close(self.err_r)
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
                go = os.read(gate_r, 2)
                if go != b"go":
                    os._exit(127)
                os.close(gate_r)
                os.execv(path, argv)
            except OSError as e:
                os.write(err_w, str(e.errno or 1).encode())
            finally:
                os._exit(127)
        os.close(gate_r)
        os.close(err_w)
        self.pid = pid

    def release(self) -> int | None:
        """Let the child exec; returns the errno of a failed exec, or None."""
        os.write(self.gate_w, b"go")
        os.close(self.gate_w)
        data = os.read(self.err_r, 32)
        os.close(self.err_r)
        return int(data) if data else None

    def abort(self) -> None:
        os.close(self.gate_w)
        os.close(self.err_r)
        os.waitpid(self.pid, 0)


def run(cmd: list[str], opts: RunOptions) -> RunResult:
    """Measure ``cmd``; the raw data end up in ``opts.out/raw.perf`` (decoded by postmortem)."""
    path = resolve_program(cmd)
    out = opts.out
    created = measdir.make_new_directory(out)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    gate = _Gate(path, cmd, old_mask)
    fds: list[int] = []
    rings: list[perf.RingBuffer] = []
    opened: list[OpenedEvent] = []
    failed: list[tuple[EventSpec, str]] = []
    try:
        leaders: dict[int, int] = {}
        cpus = perf.online_cpus()
        pages = opts.ring_pages or ring_pages_for(len(cpus))
        specs = list(opts.events)
        # -e REALTIME: metric 0 is REALTIME, computed post-mortem from the CPU clock (metric
        # 1) and the two switch events (both metric 2)
        metric_of = list(range(len(specs)))
        if opts.realtime:
            specs[1:1] = [EVERY_SWITCH, switch_spec(opts.switch_frequency)]
            metric_of = [1, 2, 2] + [k + 2 for k in range(1, len(specs) - 2)]
        for spec in specs:
            ev = OpenedEvent(spec, metric_of[len(opened)])
            try:
                for cpu in cpus:
                    switches = opts.realtime and spec.name == SWITCH_EVENT
                    attr = perf.make_attr(spec, stack_size=opts.stack_size,
                                          sideband=not opened,
                                          user_callchain=not switches)
                    attr.flags |= 1 << 14  # watermark: wake the poll when a quarter is full
                    attr.wakeup_events = pages * mmap.PAGESIZE // 4
                    # a context switch happens in the kernel: counting user mode only
                    # would never sample one, so no retry without the kernel for it
                    fd = perf.perf_event_open(attr, gate.pid, cpu) if switches else \
                        _open_user_or_all(attr, gate.pid, cpu)
                    fds.append(fd)
                    ev.fds.append(fd)
                    ev.ids.append(perf.event_id(fd))
                    join_ring(fd, cpu, leaders, rings, pages)
            except OSError as e:
                why = perf.explain(e.errno or 0, spec)
                if opts.realtime and spec.name == SWITCH_EVENT and e.errno in (
                        errno.EACCES, errno.EPERM):
                    why = ("context switches are sampled in the kernel: it needs "
                           "/proc/sys/kernel/perf_event_paranoid at 1 or below, or root / "
                           "CAP_PERFMON")
                failed.append((spec, why))
                continue
            opened.append(ev)
        if opts.realtime and [e.spec for e in opened[:3]] != specs[:3]:
            gate.abort()
            _discard(out, created)
            reasons = "; ".join(f"{s.name}: {r}" for s, r in failed)
            raise CallpathError("-e REALTIME needs a CPU clock and context-switch sampling "
                                f"({reasons})")
        if not opened:
            gate.abort()
            reasons = "; ".join(f"{s.name}: {r}" for s, r in failed)
            _discard(out, created)
            raise CallpathError(f"no event could be opened ({reasons})")
        records_fds: list[int] = []
        if opts.realtime:
            for cpu in cpus:
                attr = perf.make_attr(SWITCH_RECORDS, stack_size=opts.stack_size,
                                      switch_records=True)
                attr.sample_type = perf.make_attr(opened[0].spec).sample_type
                fd = _open_user_or_all(attr, gate.pid, cpu)
                fds.append(fd)
                records_fds.append(fd)
                perf.ioctl(fd, perf.PERF_EVENT_IOC_SET_OUTPUT, leaders[cpu])
        vdso = _save_vdso(out)
        metrics = [measdir.MetricInfo(e.spec.name, unit_of(e.spec), e.spec.period,
                                      e.spec.frequency, event=e.spec.name)
                   for e in opened[3 if opts.realtime else 0:]]
        if opts.realtime:
            metrics[:0] = realtime_metrics(opened[0].spec, opts.switch_frequency)
        raw_info: dict[str, Any] = {
            "sample_type": perf.make_attr(opened[0].spec).sample_type,
            "regs": perf.REGS_ORDER, "stack_size": opts.stack_size,
            "ids": {str(i): e.metric for e in opened for i in e.ids},
            "trace": opts.trace, "vdso": vdso}
        if opts.realtime:
            raw_info["realtime"] = {"cpu_metric": 1, "switch_metric": 2,
                                    "cpu_period": opened[0].spec.period,
                                    "switch_frequency": opts.switch_frequency}
        start = time.time()
        measdir.write_header(out, metrics, command=cmd, program=path, status="running",
                             start_time=start, raw=raw_info,
                             failed_events=[{"event": s.name, "reason": r} for s, r in failed])
        if opts.nice:
            with contextlib.suppress(OSError):
                os.nice(opts.nice)  # after the fork: the program keeps its own priority
        err = gate.release()
        if err is not None:
            os.waitpid(gate.pid, 0)
            _discard(out, created)
            raise CallpathError(f"{cmd[0]}: cannot execute ({os.strerror(err)})")
        limiter = _SwitchLimiter(opened[1].fds + records_fds, opened[2].fds,
                                 opts.switch_limit) if opts.realtime else None
        status, nbytes = _drain_loop(gate.pid, rings, out, opts.linger, limiter)
        for fd in fds:
            with contextlib.suppress(OSError):
                perf.ioctl(fd, perf.PERF_EVENT_IOC_DISABLE)
        if limiter is not None:
            (out / GAPS_FILE).write_text(json.dumps(limiter.gaps()))
        return RunResult(status, opened, failed, nbytes, time.time() - start,
                         limiter.capped_s if limiter is not None else 0.0)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        for r in rings:
            r.close()
        for fd in fds:
            os.close(fd)


def _discard(out: Path, created: bool) -> None:
    """Remove what a run that never started left (no measurement to keep)."""
    for name in (measdir.HEADER_FILE, RAW_FILE, PROCS_FILE, "vdso.so"):
        with contextlib.suppress(OSError):
            (out / name).unlink()
    if created:
        with contextlib.suppress(OSError):
            out.rmdir()


class _SwitchLimiter:
    """-e REALTIME: keeps the every-switch event and the switch records on while the program
    switches less than ``limit`` times a second, off above (back on below half of it). The
    rate is the count of the always-on capped event, read on its original events (which add
    their inherited events' counts) every ``WINDOW_S``; disabling an original disables its
    inherited events too (the kernel's ioctl walks the event's children, and a thread forked
    while it is off inherits it off). ``capped_s`` says how long the cap was in force,
    ``gaps`` when (CLOCK_MONOTONIC ns, the clock of the records)."""

    #: the rate is judged over this long: a burst of switches in one 50 ms poll of a program
    #: that switches slowly on average turned the every-switch event off (1 in 8 switches of
    #: the bench's slowest rate lost their call path with 50 ms)
    WINDOW_S = 0.25

    def __init__(self, every: list[int], counted: list[int], limit: int) -> None:
        self.every, self.counted, self.limit = every, counted, limit
        self.on = True
        self.last = (time.monotonic(), 0)
        self.capped_s = 0.0
        self._gaps: list[list[int]] = []

    def gaps(self) -> list[list[int]]:
        """[start, end) of every stretch with the records off; one still open ends never."""
        return [[a, b if b >= 0 else 1 << 62] for a, b in self._gaps]

    def _count(self) -> int:
        total = 0
        for fd in self.counted:
            with contextlib.suppress(OSError):
                total += int.from_bytes(os.read(fd, 8), "little")
        return total

    def check(self) -> None:
        now, count = time.monotonic(), self._count()
        t0, c0 = self.last
        # a window's worth of switches twice over before the window ends: off at once (at
        # 10^5 switches/s a quarter second of records and stacks overflows the rings)
        early = self.on and count - c0 >= 2 * self.limit * self.WINDOW_S
        if now - t0 < self.WINDOW_S and not early:
            return
        rate = (count - c0) / (now - t0)
        self.last = (now, count)
        if not self.on:
            self.capped_s += now - t0
        want = rate < (self.limit / 2 if not self.on else self.limit)
        if want != self.on:
            req = perf.PERF_EVENT_IOC_ENABLE if want else perf.PERF_EVENT_IOC_DISABLE
            if not want:  # off from before the first ioctl, on again after the last
                self._gaps.append([time.clock_gettime_ns(time.CLOCK_MONOTONIC), -1])
            for fd in self.every:
                with contextlib.suppress(OSError):
                    perf.ioctl(fd, req)
            if want and self._gaps:
                self._gaps[-1][1] = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            self.on = want


def _drain_loop(child: int, rings: list[perf.RingBuffer], out: Path,
                linger: float, limiter: _SwitchLimiter | None = None) -> tuple[int, int]:
    raw: IO[bytes] = open(out / RAW_FILE, "ab")  # noqa: SIM115
    procs: IO[str] = open(out / PROCS_FILE, "a")  # noqa: SIM115
    seen: set[tuple[int, int]] = set()
    poller = select.poll()
    for r in rings:
        poller.register(r.fd, select.POLLIN)
    status: int | None = None
    deadline: float | None = None
    nbytes = 0
    try:
        while True:
            poller.poll(50)
            if limiter is not None:  # before the copy: a burst of switches fills the rings
                limiter.check()
            nbytes += copy_rings(rings, raw, procs, seen)
            raw.flush()
            procs.flush()
            sig = signal.sigtimedwait(FORWARDED, 0)
            while sig is not None:
                if sig.si_code != SI_KERNEL and status is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, sig.si_signo)
                sig = signal.sigtimedwait(FORWARDED, 0)
            alive = True
            while True:
                try:
                    pid, wstatus = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    alive = False
                    break
                if pid == 0:
                    break
                if pid == child:
                    status = os.waitstatus_to_exitcode(wstatus)
                    deadline = time.monotonic() + linger
            if status is not None and (not alive or time.monotonic() > (deadline or 0)):
                break
        for r in rings:
            head, views = r.pending()
            for v in views:
                raw.write(v)
                nbytes += len(v)
            r.consume(head)
    finally:
        raw.close()
        procs.close()
    return status if status is not None else 0, nbytes


def copy_rings(rings: list[perf.RingBuffer], raw: IO[bytes], procs: IO[str],
               seen: set[tuple[int, int]]) -> int:
    """Append what the rings hold to ``raw`` and note the processes born or exec'd in it
    (while they live); the bytes copied. Shared by ``run`` and ``run --pid``."""
    n = 0
    for r in rings:
        head, views = r.pending()
        if views:
            # a record may wrap around the ring's end: parse a joined copy then
            data = views[0] if len(views) == 1 else b"".join(bytes(v) for v in views)
            for v in views:
                raw.write(v)
                n += len(v)
            _note_processes(data, seen, procs)
            r.consume(head)
    return n


def _note_processes(data: bytes | memoryview, seen: set[tuple[int, int]], procs: IO[str]) -> None:
    """Read rank and executable of processes born or exec'd in this batch, while they live."""
    for pid, t in new_processes(data):
        key = (pid, t)
        if key not in seen:
            seen.add(key)
            facts = _proc_facts(pid)
            facts["time"] = t
            procs.write(json.dumps(facts) + "\n")


def new_processes(data: bytes | memoryview) -> list[tuple[int, int]]:
    """(pid, time) of each FORK record of a new process and each COMM record of an exec in a
    batch of whole records, found without walking the records one by one: at 10^5 context
    switches a second the batch holds 2x10^5 switch records, which a loop in Python read at
    about 0.4 us each, a fifth of a CPU taken from the program on a small machine
    (bench/offcpu.py). Records are 8-byte aligned, so every 8-byte word is a possible header:
    the ones with the type, misc and size of a FORK (64 bytes) or exec COMM record (56 to 64)
    whose sample-id trailer names the same thread as the body (the parent for a FORK: the
    kernel writes it in the forking thread; the thread itself for a COMM) are those records.
    A word of a copied user stack would have to repeat a whole record to pass, but the unused
    tail of a stack sample does: the kernel reserves the whole requested stack size and writes
    only ``dyn_size`` bytes of it, so the rest keeps what the ring held a lap before, earlier
    records among them (1 run in 6 of the test's shell script). Such a copy repeats a record
    already seen, (pid, time) and all, so each pair is returned once, at its first place."""
    n = len(data) // 8
    if n < 8:
        return []
    typ = np.frombuffer(data, dtype="<u4", count=2 * n)[::2]  # each word's first half
    cand = np.flatnonzero((typ == REC_FORK) | (typ == REC_COMM))
    w = np.frombuffer(data, dtype="<u8", count=n)[cand]
    misc, size = (w >> 32) & 0xFFFF, w >> 48
    cand = cand[((typ[cand] == REC_FORK) & (misc == 0) & (size == _FORK_SIZE))
                | ((typ[cand] == REC_COMM) & (misc == MISC_COMM_EXEC) & (size >= 56)
                   & (size <= 64))]
    out: list[tuple[int, int]] = []
    found: set[tuple[int, int]] = set()
    end = n * 8
    for i in cand.tolist():
        pos = i * 8
        typ1, _misc, sz = _HDR.unpack_from(data, pos)
        if pos + sz > end:
            continue
        # FORK: pid ppid tid ptid; COMM: pid tid, then the name
        pid, second, _third, ptid = struct.unpack_from("<IIII", data, pos + 8)
        tpid, ttid, t = _TRAILER.unpack_from(data, pos + sz - _TRAILER.size)[:3]
        if typ1 == REC_FORK:
            if not ((tpid, ttid) == (second, ptid) and pid != second):
                continue
        elif (tpid, ttid) != (pid, second):
            continue
        if (pid, t) not in found:
            found.add((pid, t))
            out.append((pid, t))
    return out
