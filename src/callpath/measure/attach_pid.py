"""Measure a process that is already running (``callpath run --pid PID``).

Why this differs from ``launch``: the program was not started by callpath, so nothing could be
opened on it before its first instruction. Instead:

- *events per thread*: one event per existing thread (``/proc/PID/task``) and CPU, inherited,
  so that threads and children started while attached are measured too. An inherited event
  that follows a task on every CPU cannot be memory-mapped, hence per thread *and* CPU, with
  each CPU's events sending their records into one ring (``PERF_EVENT_IOC_SET_OUTPUT``). The
  task list is read again until no thread is new, so a thread started between the first read
  and the opening is not missed (its creator's event inherits only from then on);
- *the load map as it was*: the kernel reports only mappings made after the event was opened,
  so the executable mappings of ``/proc/PID/maps`` (libraries loaded long before) are written
  first into ``raw.perf`` as synthetic ``MMAP2`` records, with an ``exec`` ``COMM`` record for
  the process and a ``COMM`` record per thread name, all timed before the events are enabled.
  Post-mortem unwinding (``postmortem.finish``) then reads the file as it reads a launch's;
- *never harming the process*: perf_event sampling neither stops nor signals the program;
  detaching is closing the events. The process's end is noticed through a pidfd (it is not
  our child: its status is its parent's to read).

Permission is the kernel's ptrace access check (``PTRACE_MODE_READ`` for perf_event): the
same user (or CAP_SYS_PTRACE), and ``kernel.yama.ptrace_scope`` below 2 where Yama is built in
(Yama's scope 1 restricts only *attach* accesses, such as ``process_vm_readv``, which reading
a Python process's frames needs).
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import select
import signal
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from callpath.errors import CallpathError
from callpath.formats import measdir
from callpath.measure import perf
from callpath.measure import perf_launch as launch
from callpath.measure.perf import EventSpec
from callpath.measure.perf_events import unit_of

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_REC_MMAP2, _REC_COMM = 10, 3
_MISC_USER = 2
_PROT = {"r": 1, "w": 2, "x": 4}
_MAX_RESCANS = 20


class StopRequests:
    """Ctrl-C, SIGTERM and SIGHUP end the measurement, never callpath with a traceback.

    The signals are blocked in the sampling thread and taken with ``sigtimedwait``; but a
    process-directed signal goes to any thread that does not block it (numpy's OpenBLAS
    threads, started at import, do not), and Python then raises KeyboardInterrupt in the main
    thread. So a handler that only notes the request is installed too, for the duration."""

    def __init__(self) -> None:
        self.seen = False
        self._old: dict[int, object] = {}

    def __enter__(self) -> StopRequests:
        for sig in STOP_SIGNALS:
            self._old[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]

    def _note(self, signum: int, frame: object) -> None:
        self.seen = True

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a stop request; whether one came (now or before)."""
        if not self.seen and signal.sigtimedwait(STOP_SIGNALS, timeout) is not None:
            self.seen = True
        return self.seen


@dataclass
class AttachOptions:
    events: list[EventSpec]
    out: Path
    duration: float | None = None  # seconds; None: until the process exits or Ctrl-C
    trace: bool = False
    stack_size: int = perf.DEFAULT_STACK_SIZE
    ring_pages: int = 0


@dataclass
class AttachResult:
    exited: bool         # the process ended while attached
    threads: int         # threads found when attaching
    events: list[launch.OpenedEvent]
    failed: list[tuple[EventSpec, str]]
    raw_bytes: int
    wall_s: float


def access_error(pid: int, err: int, what: str = "measure") -> CallpathError:
    """One line naming why process ``pid`` cannot be measured and what to do about it."""
    if err == errno.ESRCH:
        return CallpathError(f"--pid {pid}: no such process")
    if err in (errno.EACCES, errno.EPERM):
        owner = _owner(pid)
        me = os.geteuid()
        if owner is not None and owner != me and me != 0:
            return CallpathError(
                f"--pid {pid}: cannot {what} a process of another user (uid {owner}; you are "
                f"uid {me}): run callpath as that user, or as root / with CAP_SYS_PTRACE")
        scope = _ptrace_scope()
        if scope == 1 and what != "measure":
            return CallpathError(
                f"--pid {pid}: kernel.yama.ptrace_scope = 1 lets only a process's ancestors "
                f"{what} it: run as root / with CAP_SYS_PTRACE, or 'sysctl "
                "kernel.yama.ptrace_scope=0'")
        if scope is not None and scope >= 2:
            fix = ("run as root / with CAP_SYS_PTRACE, or 'sysctl kernel.yama.ptrace_scope=1'"
                   if scope == 2 else "only a reboot lowers 3")
            return CallpathError(f"--pid {pid}: ptrace access is restricted "
                                 f"(kernel.yama.ptrace_scope = {scope}): {fix}")
        return CallpathError(
            f"--pid {pid}: the kernel does not permit attaching ({os.strerror(err)}); in a "
            "container, add CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE); see also "
            "/proc/sys/kernel/perf_event_paranoid")
    return CallpathError(f"--pid {pid}: cannot {what} the process ({os.strerror(err)})")


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _ptrace_scope() -> int | None:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def check_pid(pid: int) -> None:
    """Fail with one line if ``pid`` is not a live process we may read."""
    if pid <= 0:
        raise CallpathError(f"--pid {pid}: expected a process id (a positive number)")
    if pid == os.getpid():
        raise CallpathError(f"--pid {pid}: that is callpath itself")
    if not os.path.exists(f"/proc/{pid}"):
        raise CallpathError(f"--pid {pid}: no such process")
    try:
        os.readlink(f"/proc/{pid}/exe")
    except FileNotFoundError:
        raise CallpathError(f"--pid {pid}: no such process (or a kernel thread, which has "
                            "no user code to measure)") from None
    except PermissionError:
        raise access_error(pid, errno.EACCES) from None
    except OSError as e:
        raise access_error(pid, e.errno or errno.EIO) from None
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        state = ""
    if state == "Z":
        raise CallpathError(f"--pid {pid}: the process has exited (a zombie)")


def tids_of(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return []


@dataclass(frozen=True)
class MapLine:
    start: int
    end: int
    prot: int
    pgoff: int
    path: str


def read_maps(pid: int) -> list[MapLine]:
    """The mappings of ``/proc/PID/maps`` (every one; the caller picks the executable ones)."""
    out: list[MapLine] = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) < 5:
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            prot = sum(v for k, v in _PROT.items() if k in parts[1])
            path = parts[5].rstrip("\n") if len(parts) > 5 else ""
            out.append(MapLine(lo, hi, prot, int(parts[2], 16), path))
    return out


def _trailer(pid: int, tid: int, t: int) -> bytes:
    return struct.pack("<IIQIIQ", pid, tid, t, 0, 0, 0)


def _record(typ: int, misc: int, body: bytes) -> bytes:
    size = 8 + len(body)
    return struct.pack("<IHH", typ, misc, size) + body


def _padded(name: str) -> bytes:
    raw = name.encode("utf-8", "surrogateescape") + b"\0"
    return raw + b"\0" * (-len(raw) % 8)


def synthetic_records(pid: int, t: int) -> bytes:
    """``COMM`` (exec) of the process, ``COMM`` of each thread, ``MMAP2`` of each executable
    mapping, as the kernel would have written them had the events been open from the start."""
    def comm_of(path: str) -> str:
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return ""

    out = bytearray()
    comm = comm_of(f"/proc/{pid}/comm")
    out += _record(_REC_COMM, _MISC_USER | launch.MISC_COMM_EXEC,
                   struct.pack("<II", pid, pid) + _padded(comm) + _trailer(pid, pid, t))
    for m in read_maps(pid):
        if not m.prot & _PROT["x"]:
            continue
        body = struct.pack("<IIQQQIIQQII", pid, pid, m.start, m.end - m.start, m.pgoff,
                           0, 0, 0, 0, m.prot, 0x02)  # MAP_PRIVATE
        out += _record(_REC_MMAP2, _MISC_USER, body + _padded(m.path) + _trailer(pid, pid, t))
    for tid in tids_of(pid):
        name = comm_of(f"/proc/{pid}/task/{tid}/comm")
        if tid != pid and name:
            out += _record(_REC_COMM, _MISC_USER,
                           struct.pack("<II", pid, tid) + _padded(name) + _trailer(pid, tid, t))
    return bytes(out)


@dataclass
class OpenedEvents:
    """Sampling events opened, disabled, on every thread of a process and every CPU, with the
    rings they write to. ``run --pid`` of a native program samples with them alone; of a
    Python process with ``--native`` they capture the native stacks that the Python frames
    read from its memory are merged with (``remote_native``)."""

    fds: list[int] = field(default_factory=list)
    rings: list[perf.RingBuffer] = field(default_factory=list)
    events: list[launch.OpenedEvent] = field(default_factory=list)
    failed: list[tuple[EventSpec, str]] = field(default_factory=list)
    threads: int = 0  # threads found when attaching

    def raw_info(self, opts: AttachOptions, vdso: str) -> dict[str, Any]:
        """What decoding ``raw.perf`` needs (the header's ``raw``)."""
        return {"sample_type": perf.make_attr(self.events[0].spec).sample_type,
                "regs": perf.REGS_ORDER, "stack_size": opts.stack_size,
                "ids": {str(i): e.metric for e in self.events for i in e.ids},
                "trace": opts.trace, "vdso": vdso}

    def switch(self, request: int) -> None:
        """Enable or disable every event (a thread that exited meanwhile is skipped)."""
        for fd in self.fds:
            with contextlib.suppress(OSError):
                perf.ioctl(fd, request)

    def close(self) -> None:
        for r in self.rings:
            r.close()
        for fd in self.fds:
            os.close(fd)
        self.rings.clear()
        self.fds.clear()


def open_events(pid: int, opts: AttachOptions) -> OpenedEvents:
    """Open ``opts.events`` on every thread of ``pid``, disabled; the first event also reports
    the process's mappings, names, forks and exits. Fails with one line when the process
    cannot be measured; an event that the machine lacks is listed in ``failed``."""
    got = OpenedEvents()
    try:
        cpus = perf.online_cpus()
        pages = opts.ring_pages or launch.ring_pages_for(len(cpus))
        leaders: dict[int, int] = {}
        for spec in opts.events:
            ev = launch.OpenedEvent(spec, len(got.events))
            done: set[int] = set()
            try:
                for _ in range(_MAX_RESCANS):
                    new = [t for t in tids_of(pid) if t not in done]
                    if not new:
                        break
                    for tid in new:
                        done.add(tid)
                        _open_thread(spec, tid, cpus, opts, pages, sideband=not got.events,
                                     ev=ev, fds=got.fds, rings=got.rings, leaders=leaders)
            except OSError as e:
                if e.errno in (errno.EACCES, errno.EPERM, errno.ESRCH) and not got.events:
                    if e.errno == errno.ESRCH or not os.path.exists(f"/proc/{pid}"):
                        raise access_error(pid, errno.ESRCH) from None
                    if perf.explain(e.errno, spec).startswith("permission") and _paranoid() > 2:
                        raise CallpathError(f"--pid {pid}: {perf.explain(e.errno, spec)}"
                                            ) from None
                    raise access_error(pid, e.errno) from None
                got.failed.append((spec, perf.explain(e.errno or 0, spec)))
                continue
            if not ev.ids:
                raise CallpathError(f"--pid {pid}: the process has exited")
            if not got.threads:
                got.threads = len(done)
            got.events.append(ev)
        if not got.events:
            reasons = "; ".join(f"{s.name}: {r}" for s, r in got.failed)
            raise CallpathError(f"no event could be opened ({reasons})")
    except BaseException:
        got.close()
        raise
    return got


def write_load_map(out: Path, pid: int) -> None:
    """The process as it is before the events are enabled: its synthetic records in
    ``raw.perf`` and its facts (executable, rank) in the processes file."""
    t0 = time.monotonic_ns()
    with open(out / launch.RAW_FILE, "ab") as raw:
        raw.write(synthetic_records(pid, t0))
    with open(out / launch.PROCS_FILE, "a") as procs:
        facts = launch._proc_facts(pid)
        facts["time"] = t0
        procs.write(json.dumps(facts) + "\n")


def attach(pid: int, opts: AttachOptions) -> AttachResult:
    """Sample process ``pid`` until the duration passes, it exits, or SIGINT/SIGTERM/SIGHUP;
    the raw data end up in ``opts.out/raw.perf`` for ``postmortem.finish``."""
    check_pid(pid)
    out = opts.out
    created = measdir.make_new_directory(out)
    try:
        pidfd: int | None = os.pidfd_open(pid)
    except OSError as e:
        if e.errno == errno.ESRCH:
            launch._discard(out, created)
            raise access_error(pid, e.errno) from None
        pidfd = None  # an old kernel: poll /proc instead
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    stop = StopRequests().__enter__()
    got = OpenedEvents()
    try:
        got = open_events(pid, opts)
        vdso = launch._save_vdso(out)
        metrics = [measdir.MetricInfo(e.spec.name, unit_of(e.spec), e.spec.period,
                                      e.spec.frequency, event=e.spec.name) for e in got.events]
        try:
            cmdline = [a.decode("utf-8", "replace") for a in
                       Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            cmdline, exe = [], ""
        start = time.time()
        measdir.write_header(out, metrics, command=cmdline, program=exe, status="running",
                             start_time=start, raw=got.raw_info(opts, vdso), attached_pid=pid,
                             failed_events=[{"event": s.name, "reason": r}
                                            for s, r in got.failed])
        write_load_map(out, pid)
        got.switch(perf.PERF_EVENT_IOC_ENABLE)
        exited, nbytes = _drain(pid, pidfd, got.rings, out, opts.duration, stop)
        got.switch(perf.PERF_EVENT_IOC_DISABLE)
        return AttachResult(exited, got.threads, got.events, got.failed, nbytes,
                            time.time() - start)
    except BaseException:
        launch._discard(out, created)
        raise
    finally:
        stop.__exit__()
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        got.close()
        if pidfd is not None:
            os.close(pidfd)


def _paranoid() -> int:
    try:
        with open("/proc/sys/kernel/perf_event_paranoid") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return 2


def _open_thread(spec: EventSpec, tid: int, cpus: list[int], opts: AttachOptions, pages: int,
                 *, sideband: bool, ev: launch.OpenedEvent, fds: list[int],
                 rings: list[perf.RingBuffer], leaders: dict[int, int]) -> None:
    """Open ``spec`` on thread ``tid`` on every CPU, disabled; a thread that has exited
    meanwhile (ESRCH) is skipped."""
    for cpu in cpus:
        attr = perf.make_attr(spec, stack_size=opts.stack_size, sideband=sideband)
        attr.flags &= ~perf.F_ENABLE_ON_EXEC
        attr.flags |= 1 << 14  # watermark: wake the poll when a quarter is full
        attr.wakeup_events = pages * mmap.PAGESIZE // 4
        try:
            fd = launch._open_user_or_all(attr, tid, cpu)
        except OSError as e:
            if e.errno == errno.ESRCH:
                return
            raise
        fds.append(fd)
        ev.ids.append(perf.event_id(fd))
        launch.join_ring(fd, cpu, leaders, rings, pages)


def _alive(pid: int, pidfd: int | None) -> bool:
    if pidfd is not None:
        r, _w, _x = select.select([pidfd], [], [], 0)
        return not r
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _drain(pid: int, pidfd: int | None, rings: list[perf.RingBuffer], out: Path,
           duration: float | None, stop: StopRequests) -> tuple[bool, int]:
    """Copy the rings to ``raw.perf`` until the deadline, the process's end or a stop signal;
    returns whether the process ended, and the bytes written."""
    raw: IO[bytes] = open(out / launch.RAW_FILE, "ab")  # noqa: SIM115
    procs: IO[str] = open(out / launch.PROCS_FILE, "a")  # noqa: SIM115
    seen: set[tuple[int, int]] = set()
    poller = select.poll()
    for r in rings:
        poller.register(r.fd, select.POLLIN)
    deadline = None if duration is None else time.monotonic() + duration
    nbytes = 0
    exited = False
    try:
        while True:
            poller.poll(50)
            nbytes += launch.copy_rings(rings, raw, procs, seen)
            raw.flush()
            procs.flush()
            if stop.wait(0):
                break
            if not _alive(pid, pidfd):
                exited = True
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
        nbytes += launch.copy_rings(rings, raw, procs, seen)
    finally:
        raw.close()
        procs.close()
    return exited, nbytes
