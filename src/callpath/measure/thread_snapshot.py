"""Every thread's registers and stack at one instant, for ``callpath dump --pid`` (native
frames of a program that hangs).

Why ptrace here and perf_event in ``run --pid``: a thread blocked in ``time.sleep`` or on a
lock is off the CPU, so no CPU-clock sample ever comes from it, and its registers are not in
``/proc``. Each thread is seized and interrupted (``PTRACE_SEIZE``, ``PTRACE_INTERRUPT``: no
signal is sent, and a system call it waits in is restarted by the kernel when it goes on, as
under gdb or ``py-spy dump``), its user registers and the used part of its stack are copied,
and it is let go (``PTRACE_DETACH``, passing on any signal that arrived meanwhile). All threads
are held together, so the Python frames read while they are held (``remote_python``) belong
to the same instant as the native stacks. The stacks are unwound afterwards, with nothing
held, by the unwinder ``run`` uses (``measure.unwind``, CFI and recipes).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from callpath.formats import measdir as md

PTRACE_GETREGS, PTRACE_DETACH = 12, 17
PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4206, 0x4207
PTRACE_EVENT_STOP = 128
WALL = 0x40000000  # __WALL: wait for threads too
#: the most of a thread's stack copied (from its sp up to the end of its stack mapping)
MAX_STACK = 1 << 20
#: how long a thread may take to stop (one in uninterruptible disk wait stops only when the
#: wait ends): after that it is shown without native frames
STOP_TIMEOUT_S = 1.0
_USER_REGS = 27  # struct user_regs_struct, x86-64
_R15, _R14, _R13, _R12, _RBP, _RBX, _RIP, _RSP = 0, 1, 2, 3, 4, 5, 16, 19

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def _ptrace(request: int, tid: int, data: int | ctypes.Array[ctypes.c_uint64] = 0) -> None:
    arg = ctypes.cast(data, ctypes.c_void_p) if isinstance(data, ctypes.Array) else \
        ctypes.c_void_p(data)
    if _libc.ptrace(request, tid, None, arg) < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@dataclass
class ThreadState:
    """One held thread: its registers and stack copy, or why there are none."""

    tid: int
    pc: int = 0
    sp: int = 0
    saved: tuple[int, ...] = ()  # rbx rbp r12 r13 r14 r15
    stack: bytes = b""
    error: str = ""
    refused: bool = False  # the kernel refused to let us hold it (permission)
    _signal: int = 0  # a signal that arrived while held: passed on at detach


@dataclass
class Held:
    threads: dict[int, ThreadState] = field(default_factory=dict)
    seized: list[int] = field(default_factory=list)


def _ranges(pid: int) -> list[tuple[int, int]]:
    """The process's mappings (start, end), read once for all its threads' stacks."""
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                lo, hi = line.split(None, 1)[0].split("-")
                out.append((int(lo, 16), int(hi, 16)))
    except OSError:
        pass
    return out


def _stack_end(ranges: list[tuple[int, int]], sp: int) -> int:
    for lo, hi in ranges:
        if lo <= sp < hi:
            return hi
    return sp


def _wait_stopped(tid: int, deadline: float) -> int | None:
    """Wait for ``tid``'s stop; the signal to pass on (0 if none), or None if it did not stop
    (or exited)."""
    while True:
        try:
            got, status = os.waitpid(tid, os.WNOHANG | WALL)
        except ChildProcessError:
            return None
        if got == tid:
            if not os.WIFSTOPPED(status):
                return None  # it exited
            sig = os.WSTOPSIG(status)
            if status >> 16 == PTRACE_EVENT_STOP or sig == signal.SIGTRAP:
                return 0
            return sig  # a signal-delivery stop: the thread is held; the signal goes on later
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.0005)


@contextlib.contextmanager
def hold(pid: int, tids: list[int]) -> Iterator[Held]:
    """Hold every thread of ``tids`` (the ones that can be), with its registers and stack
    read; they go on when the block ends, whatever happens in it."""
    held = Held()
    try:
        for tid in tids:
            st = held.threads[tid] = ThreadState(tid)
            try:
                _ptrace(PTRACE_SEIZE, tid)
            except OSError as e:
                st.error = f"cannot hold it ({e.strerror})"
                if e.errno == errno.EPERM and _tracer(pid, tid):
                    st.error = "it is being traced by another process (a debugger)"
                else:
                    st.refused = e.errno in (errno.EPERM, errno.EACCES)
                continue
            held.seized.append(tid)
            try:
                _ptrace(PTRACE_INTERRUPT, tid)
            except OSError as e:
                st.error = f"cannot stop it ({e.strerror})"
        deadline = time.monotonic() + STOP_TIMEOUT_S
        ranges = _ranges(pid)
        for tid in held.seized:
            st = held.threads[tid]
            if st.error:
                continue
            sig = _wait_stopped(tid, deadline)
            if sig is None:
                st.error = "it did not stop (exited, or in an uninterruptible wait)"
                continue
            st._signal = sig
            regs = (ctypes.c_uint64 * _USER_REGS)()
            try:
                _ptrace(PTRACE_GETREGS, tid, regs)
            except OSError as e:
                st.error = f"cannot read its registers ({e.strerror})"
                continue
            st.pc, st.sp = int(regs[_RIP]), int(regs[_RSP])
            st.saved = tuple(int(regs[i]) for i in (_RBX, _RBP, _R12, _R13, _R14, _R15))
            size = min(_stack_end(ranges, st.sp) - st.sp, MAX_STACK) & ~7
            try:
                with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
                    st.stack = os.pread(mem.fileno(), size, st.sp) if size > 0 else b""
            except OSError as e:
                st.error = f"cannot read its stack ({e.strerror})"
        yield held
    finally:
        for tid in held.seized:
            with contextlib.suppress(OSError):
                _ptrace(PTRACE_DETACH, tid, held.threads[tid]._signal)


def _tracer(pid: int, tid: int) -> int:
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


Key = tuple[int, int, int, int]


@dataclass
class Unwound:
    """Per thread: its native frames leaf first, which are evaluation activations, and
    whether the unwinding reached the thread's entry; the modules the frames name."""

    frames: dict[int, tuple[list[Key], list[bool], bool]]
    modules: list[md.Module]
    elves: list[object]
    interpreter: frozenset[int]


def unwind_held(pid: int, states: list[ThreadState], scratch: Path) -> Unwound:
    """Unwind the stacks read (``scratch``: where the vdso's image is put for the unwinder)."""
    from callpath.measure import attach_pid as attach
    from callpath.measure import perf_launch as launch
    from callpath.measure import postmortem, unwind
    from callpath.measure.loadmap import Mapping
    from callpath.measure.python import native_merge as merge

    ok = [s for s in states if not s.error and s.sp]
    maps = [Mapping(0, m.start, m.end, m.pgoff, m.path, "") for m in attach.read_maps(pid)
            if m.prot & 4 and m.end <= postmortem.USER_LIMIT]  # not [vsyscall]
    vdso = launch._save_vdso(scratch)
    mm, mods, _names = postmortem.module_map(sorted(maps, key=lambda m: m.start), scratch,
                                             vdso)
    if not ok:
        return Unwound({}, mods, list(mm.elves), frozenset())
    blobs = [np.frombuffer(s.stack[:len(s.stack) & ~7], dtype=np.uint64) for s in ok]
    nwords = np.array([len(b) for b in blobs], dtype=np.int64)
    stack0 = np.concatenate([[0], np.cumsum(nwords)[:-1]]).astype(np.int64)
    words = np.concatenate(blobs) if blobs else np.zeros(0, dtype=np.uint64)
    fr = unwind.unwind(words, np.array([s.pc for s in ok], dtype=np.uint64),
                       np.array([s.sp for s in ok], dtype=np.uint64),
                       np.array([s.saved for s in ok], dtype=np.uint64).reshape(-1, 6),
                       stack0, nwords, mm, merge._compiler())
    is_eval, _gil = merge._eval_frames(fr, mm)  # dump shows take_gil's frames as they are
    interpreter = frozenset(int(m) for m in np.unique(fr.module[is_eval]).tolist() if m >= 0)
    order = np.lexsort((fr.depth, fr.sample))
    out: dict[int, tuple[list[Key], list[bool], bool]] = {}
    for i, s in enumerate(ok):
        sel = order[fr.sample[order] == i]
        keys: list[Key] = [(int(md.NodeKind.NATIVE) if m >= 0 else int(md.NodeKind.UNKNOWN),
                            int(m), int(a), int(md.NodeFlag.EXACT_PC) if x else 0)
                           for m, a, x in zip(fr.module[sel].tolist(), fr.address[sel].tolist(),
                                              fr.exact[sel].tolist(), strict=True)]
        evl = is_eval[sel].tolist()
        complete = bool(fr.complete[i])
        if not complete and keys and keys[-1][0] == int(md.NodeKind.UNKNOWN):
            keys.pop()
            evl.pop()
        out[s.tid] = (keys, evl, complete)
    return Unwound(out, mods, list(mm.elves), interpreter)
