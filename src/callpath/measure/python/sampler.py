"""The in-process sampler of Python programs: a timer signal, a stack walk, measurement files.

This module runs *inside the measured program*, so it is written under constraints that the rest
of callpath does not have:

- standard library only, and no import of the ``callpath`` package (whose ``__init__`` pulls in
  numpy): the bootstrap in ``shim/sitecustomize.py`` loads this file by path, before the user's
  code, in every Python process of the measured program tree;
- the signal handler does the least work that keeps the data exact: a walk from its ``frame``
  argument mapping each frame to an interned location (``locs_of[id(code)][f_lasti]``: code,
  line and whether the offset is a call), one dict lookup of the whole stack, and one update of
  the thread's aggregate for that stack. New code objects, offsets and stacks take a slow path
  once (code objects are kept alive, so their ids stay unique); tree nodes are made when data is
  flushed, per distinct stack rather than per sample;
- the data must survive ``sys.exit``, exceptions, ``os._exit``, ``SIGTERM`` and fork without exec:
  whole chunks are appended to the process's file at least once a second, before a fork, and at
  exit.

Timing: a POSIX timer on ``CLOCK_MONOTONIC`` sends ``SIGPROF`` to the main thread (Linux
``SIGEV_THREAD_ID``), which reaches 1 kHz where ``ITIMER_PROF`` stops at the kernel tick (250 Hz
here). Python runs signal handlers only in the main thread, so other threads are sampled from there
through ``sys._current_frames()``. Every sample carries two weights, the thread's CPU time and the
wall-clock time since its previous sample, so delayed or coalesced signals lose no time, and two
flags: IDLE (the thread used under 5% of a CPU over the interval: sleeping, blocked, or waiting for
the GIL) and NATIVE (its innermost Python frame was executing a call instruction, i.e. the thread
was inside a C function: for threads other than the main one, code that released the GIL).

Output: one file per process image in callpath's measurement-directory format (version 1, see
``docs/measurement-format.md``; ``callpath.formats.measdir`` reads it), with two metrics,
``CPUTIME`` and ``REALTIME`` (ns), PYTHON nodes (code-table index, line) and the IDLE flag on
leaves.

Layout: this module holds the sampler's per-process state and life cycle (start, exit, fork,
signals) and loads the modules beside it, each standard library only: ``walk.py`` (the signal
handler, the walk of other threads, the interning of new frames), ``measfile.py`` (the file
format and the flush) and ``timer.py`` (the POSIX timer and libc's facts). :class:`Sampler`
is the two halves, ``walk.Walker`` and ``measfile.Recorder``, over that state. Where this file
is ``callpath.measure.python.sampler`` they are the package's modules; loaded by path (the
bootstrap) they are loaded by path too, so the measured process still imports neither the
``callpath`` package nor numpy.
"""

from __future__ import annotations

import _thread
import atexit
import contextlib
import importlib
import importlib.util
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from types import CodeType, FrameType, ModuleType
from typing import TYPE_CHECKING, Any, NoReturn

ENV_OUT = "CALLPATH_PY_OUT"
ENV_FREQ = "CALLPATH_PY_FREQ"
ENV_TRACE = "CALLPATH_PY_TRACE"

#: The files the sampler runs from, beside this one (``native_capture.py`` is loaded only under
#: ``--native``); a copy of the sampler needs all of them.
RUNTIME_FILES = ("sampler.py", "walk.py", "measfile.py", "timer.py")


def _sibling(name: str) -> ModuleType:
    """The module ``name`` beside this file: the package's own when this file was imported as
    part of ``callpath``, else loaded by path (once per process; the bootstrap's case, where
    importing the package would import numpy into the measured program)."""
    if __package__:
        return importlib.import_module(f"{__package__}.{name}")
    key = f"_callpath_py{name}"
    mod = sys.modules.get(key)
    if mod is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        spec = importlib.util.spec_from_file_location(key, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return mod


if TYPE_CHECKING:
    from callpath.measure.python import measfile, timer, walk
else:
    timer = _sibling("timer")
    measfile = _sibling("measfile")
    walk = _sibling("walk")

_OWN_FILES = frozenset([__file__, timer.__file__, measfile.__file__, walk.__file__])


def _native_capture(sampler: Any) -> Any:
    """``callpath run --native``: the signal-time capture of native stacks
    (``native_capture.py``, loaded by path like this module), or None without ``--native``."""
    if not os.environ.get("CALLPATH_PY_NATIVE"):
        return None
    try:
        mod = _sibling("native_capture")
    except ImportError:
        return None
    return mod.from_environment(sampler)


class Sampler(walk.Walker, measfile.Recorder):
    """One per process. ``start()`` arms the timer; ``finish()`` writes the last chunks."""

    own_files = _OWN_FILES

    def __init__(self, out_dir: str, frequency: float, trace: bool) -> None:
        self.out_dir = out_dir
        self.frequency = float(frequency)
        self.period_ns = max(int(1e9 / self.frequency), 10_000)
        self.trace = trace
        self.host = socket.gethostname()
        self.node_id = timer.host_id()
        self.rank = timer.mpi_rank()
        self.call_ops = walk.call_opcodes()
        self.call_flags = walk.call_flags(self.call_ops)
        self.timer = timer.Timer(signal.SIGPROF)
        walk_module, self.walker = walk.c_walk()
        self.stack_of: Callable[..., int | None] = (
            walk_module.stack_of if walk_module is not None else walk.py_stack_of)
        # 3.12+: other threads' frames without frame objects (see _callpath_walk.c)
        self.other_stacks: Callable[[int], dict[int, list[tuple[CodeType, int]]]] | None = (
            getattr(walk_module, "other_stacks", None) if walk_module is not None else None)
        self.c_cache: Callable[[], Any] | None = (
            walk_module.Cache if walk_module is not None else None)
        # the slow path in C (``intern_stack``); CALLPATH_PY_WALK=c-walk keeps it in Python too
        self.c_intern: Callable[[FrameType, tuple[Any, ...]], int] | None = (
            walk_module.intern_stack if walk_module is not None and self.walker == "C" else None)
        self.c_handler: Callable[..., Any] | None = (
            walk_module.Handler if walk_module is not None and self.walker == "C" else None)
        self.mechanism = ""
        self.fd = -1
        self.path = ""
        self.finished = False
        self.errors = 0
        self.forked_from: int | None = None
        self.pending_signal = 0
        self.handler: Callable[[int, FrameType | None], None] | None = None
        self._orig_exit: Callable[[int], NoReturn] | None = None
        self.native: Any = None  # native_capture.NativeCapture under --native
        self._reset()

    # ---- per-process state --------------------------------------------------------------------

    def _reset(self) -> None:
        """Fresh tables: each process's file stands alone (also after fork)."""
        self.pid = os.getpid()
        self.main_ident = _thread.get_ident()
        # Locations: a location is (code index, line, NATIVE), numbered in order of appearance.
        # locs_of maps id(code) to {byte offset: location} for the offsets seen so far (-1, a
        # frame that has not started, is the first line).
        self.locs_of: dict[int, dict[int, int]] = {}
        # (code index, line, NATIVE) of each location, flat; a location's id by its key
        # (code index << 32 | line) << 1 | NATIVE: ints rather than tuples, which the garbage
        # collector would count and visit (the slow path makes them at most samples of a
        # program's start, when every stack is new)
        self.locs: list[int] = []
        self.loc_ids: dict[int, int] = {}
        # walk.stack_key(locations per frame, leaf first) -> stack << 1 | NATIVE; -1: the
        # sampler's own stack
        self.stacks: dict[bytes, int] = {}
        self.line_stacks: dict[bytes, int] = {}  # (code index, line) per frame -> id
        self.code_index: dict[int, int] = {}  # id(code) -> index; codes[] keeps them alive
        self.codes: list[CodeType] = []
        self.line_tables: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}  # read lazily
        self.codes_written = 0
        self.stack_paths: list[bytes] = []  # stack id -> its line_stacks key
        # the slow path's tables, as _callpath_walk.intern_stack takes them
        self.c_tables = (self.locs_of, self.code_index, self.codes, self.locs, self.loc_ids,
                         self.stacks, self.line_stacks, self.stack_paths, self.own_files,
                         self.call_flags, self._loc, walk.STACK_CACHE)
        self.threads: dict[int, list[Any]] = {}  # ident -> the thread's handler state
        self.tdata: list[measfile.ThreadData] = []
        self.new_threads: list[int] = []
        self.samples = 0
        self.dropped = 0
        self.busy = False
        self._drain: Callable[[dict[int, list[int]], Any], None] | None = None
        self.last_others = 0
        self.others_gap = 0
        self.t0 = time.monotonic_ns()
        self.last_flush = self.t0
        self.process_info: dict[str, Any] = {
            "pid": self.pid, "ppid": os.getppid(), "generation": 0, "host": self.host,
            "node_id": self.node_id, "rank": self.rank, "exe": sys.executable,
            "forked_from": self.forked_from, "language": "python",
            "argv": list(getattr(sys, "orig_argv", sys.argv)),
            "python": sys.version.split()[0], "implementation": sys.implementation.name,
            "frequency": self.frequency, "period_ns": self.period_ns, "trace": self.trace,
            "walker": self.walker,
            "start_unix_ns": time.time_ns(), "start_mono_ns": self.t0,
            "cpu_at_start_ns": time.process_time_ns(),
        }
        self._thread_state(self.main_ident, time.thread_time_ns(), self.t0)


    # ---- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        # Handler first, file second, timer last: SIGPROF's default action kills the process.
        self.handler = self.make_handler()
        signal.signal(signal.SIGPROF, self.handler)
        self._open()
        self._start_native(after_fork=False)
        self.mechanism = self.timer.start(self.period_ns, self.handler)
        self.process_info["mechanism"] = self.mechanism
        atexit.register(self.finish, "exit", None)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(before=self._before_fork, after_in_parent=self._after_parent,
                                after_in_child=self._after_child)
        self._orig_exit = os._exit
        os._exit = self._os_exit
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._on_term)

    def finish(self, reason: str, status: int | None) -> None:
        """Disarm, flush, and close the file with the process's end facts; idempotent."""
        if self.finished:
            return
        self.finished = True
        self.busy = True  # a signal already pending must not sample the sampler
        self.timer.stop()
        try:
            if self.native is not None:
                self.native.stop()  # its last records, before the codes they name are noted
            self._flush_locked()
            self.process_info["end"] = {
                "reason": reason, "status": status, "samples": self.samples,
                "dropped": self.dropped, "errors": self.errors, "threads": len(self.tdata),
                "end_mono_ns": time.monotonic_ns(),
                "cpu_ns": time.process_time_ns() - int(self.process_info["cpu_at_start_ns"])}
            if self.fd >= 0:
                self._write(measfile.json_chunk(measfile.TAG_PROCESS, self.process_info)
                            + measfile.chunk(measfile.TAG_END, b""))
                os.close(self.fd)
        except OSError:
            pass
        self.fd = -1
        if self.pending_signal:
            self._die(self.pending_signal)

    def _os_exit(self, status: int) -> NoReturn:
        """``os._exit`` skips atexit: close the file first (multiprocessing's fork and
        forkserver workers end this way)."""
        self.finish("os._exit", status)
        assert self._orig_exit is not None
        self._orig_exit(status)

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM with the default action: close the file, then die of the signal. If it
        interrupts ``finish`` itself (a pool's workers get it while exiting), let that finish
        first."""
        if self.finished and self.fd >= 0:
            self.pending_signal = signum
            return
        self.finish("signal", -signum)
        self._die(signum)

    @staticmethod
    def _die(signum: int) -> None:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _before_fork(self) -> None:
        if not self.finished:
            self.busy = True
            self.timer.stop()
            self.busy = False
            self.flush()

    def _after_parent(self) -> None:
        if not self.finished:
            self.timer.start(self.period_ns, self.handler)

    def _after_child(self) -> None:
        if self.finished:
            return
        self.timer.forget()
        with contextlib.suppress(OSError):
            os.close(self.fd)  # the parent's file: the child writes its own
        self.fd = -1
        self.forked_from = self.pid
        self._reset()
        # the handler's closure holds the parent's tables: bind a new one to the fresh state
        self.handler = self.make_handler()
        signal.signal(self.timer.signo, self.handler)
        self._open()
        self._start_native(after_fork=True)
        self.mechanism = self.timer.start(self.period_ns, self.handler)
        self.process_info["mechanism"] = self.mechanism

    def _start_native(self, after_fork: bool) -> None:
        """Under ``--native``, install the signal-time capture (after our SIGPROF handler,
        which it forwards to); the process metadata says whether paths will be merged."""
        try:
            if not after_fork:
                self.native = _native_capture(self)
            if self.native is not None:
                how = self.native.after_fork() if after_fork else self.native.start()
                self.process_info["native"] = how
        except Exception as e:  # never stop the program because measurement failed
            self.native = None
            self.process_info["native"] = f"python only: the native capture failed ({e})"


_SAMPLER: Sampler | None = None


def start(out_dir: str, frequency: float, trace: bool = False) -> Sampler:
    """Start measuring this process (idempotent)."""
    global _SAMPLER
    if _SAMPLER is None:
        _SAMPLER = Sampler(out_dir, frequency, trace)
        _SAMPLER.start()
    return _SAMPLER


def start_from_environment() -> Sampler | None:
    """Called by the bootstrap: measure this process if the launcher exported an output dir."""
    out = os.environ.get(ENV_OUT)
    if not out:
        return None
    try:
        freq = float(os.environ.get(ENV_FREQ, "1000"))
    except ValueError:
        freq = 1000.0
    if not freq > 0:
        freq = 1000.0
    return start(out, freq, os.environ.get(ENV_TRACE, "") not in ("", "0"))
