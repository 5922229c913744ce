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
leaves. The layout constants are repeated here because this module cannot import that one; a
test checks that they agree.
"""

from __future__ import annotations

import _thread
import array
import atexit
import contextlib
import json
import os
import signal
import socket
import struct
import sys
import time
from bisect import bisect_right
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, NoReturn, cast

# ---- the measurement-directory format (callpath.formats.measdir), version 1 --------------------
FILE_MAGIC = b"CPMEAS\x00\x00"
FILE_VERSION = 1
_FILE_HEADER = struct.Struct("<8sII")
_CHUNK = struct.Struct("<IIQ")  # tag, thread slot, payload length
_NODE = struct.Struct("<iBBHiIQ")  # parent, kind, flags, reserved, module, reserved, address
_COUNT = struct.Struct("<IIQd")  # node, metric, samples, value
_TRACE = struct.Struct("<QII")  # time, node, metric
NO_THREAD = 0xFFFFFFFF
TAG_PROCESS, TAG_THREAD, TAG_NODES, TAG_COUNTS, TAG_TRACE = 1, 3, 4, 5, 6
TAG_PYCODE, TAG_STATS, TAG_METRICS, TAG_END = 7, 8, 9, 10
KIND_ROOT, KIND_PYTHON = 0, 2
NODE_FLAG_IDLE = 2
ID_NODE, ID_RANK, ID_THREAD = 1, 2, 3  # callpath.model.contexts.IdKind
METRIC_CPU, METRIC_WALL = 0, 1

ENV_OUT = "CALLPATH_PY_OUT"
ENV_FREQ = "CALLPATH_PY_FREQ"
ENV_TRACE = "CALLPATH_PY_TRACE"
# "python": the handler and the walk in Python even where the C ones are built; "c-walk": the
# handler in Python, the walk in C (for measuring what each part costs)
ENV_WALK = "CALLPATH_PY_WALK"

IDLE_CPU_SHARE = 20  # IDLE when cpu * 20 < wall, i.e. under 5% of one CPU
OTHERS_BUDGET = 50  # sample other threads at most every 50 x the CPU time it took last time
STACK_CACHE = 50_000  # entries of the offset-keyed stack cache before it is cleared
FLUSH_NS = 1_000_000_000  # flush at least once a second ...
TRACE_FLUSH = 2 * 8192  # ... or when the trace holds this many samples (two integers each)

_THIS_FILE = __file__
_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def metric_descriptors(frequency: float) -> list[dict[str, Any]]:
    """The two metrics every Python process file carries (and the launcher's header repeats)."""
    f = round(frequency)
    return [
        {"name": "CPUTIME", "unit": "ns", "period": 0, "frequency": f,
         "event": "python:thread-cpu-time",
         "description": "CPU time of the thread since its previous sample (per-thread CPU clock)"},
        {"name": "REALTIME", "unit": "ns", "period": 0, "frequency": f,
         "event": "python:wall-clock",
         "description": "wall-clock time since the thread's previous sample"},
    ]


def mpi_rank(env: Any = None) -> int | None:
    """The MPI rank that the launcher (Open MPI, MPICH/PMI, PMIx, Slurm) exported, if any."""
    env = os.environ if env is None else env
    for var in _RANK_VARS:
        value = env.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def _call_opcodes() -> frozenset[int]:
    import opcode
    return frozenset(v for k, v in opcode.opmap.items() if k.startswith(("CALL", "PRECALL")))


def _c_walk() -> tuple[Any, str]:
    """The C stack walk and handler (``_callpath_walk.c``, built by ``pip install`` when a
    compiler and Python's headers are there) for this interpreter, loaded by path like this
    module; else None, and the handler walks in Python. Returns its module and the walker's
    name for the metadata: ``C`` (C handler and walk), ``C walk`` (``CALLPATH_PY_WALK=c-walk``:
    the handler in Python), or ``python`` with the reason."""
    choice = os.environ.get(ENV_WALK, "")
    if choice == "python":
        return None, "python (CALLPATH_PY_WALK=python)"
    try:
        import importlib.machinery
        import importlib.util
        here = os.path.dirname(os.path.abspath(__file__))
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(here, "_callpath_walk" + suffix)
            if os.path.exists(path):
                spec = importlib.util.spec_from_file_location("_callpath_walk", path)
                if spec is None or spec.loader is None:
                    break
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                if all(callable(getattr(mod, name, None))
                       for name in ("stack_of", "Cache", "Handler")):
                    return mod, "C walk (CALLPATH_PY_WALK=c-walk)" if choice == "c-walk" else "C"
    except (ImportError, OSError, AttributeError):
        pass
    return None, "python (no C walk built for this interpreter)"


def _native_capture(sampler: Any) -> Any:
    """``callpath run --native``: the signal-time capture of native stacks
    (``native_capture.py``, loaded by path like this module), or None without ``--native``."""
    if not os.environ.get("CALLPATH_PY_NATIVE"):
        return None
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native_capture.py")
    spec = importlib.util.spec_from_file_location("_callpath_native_capture", path)
    if spec is None or spec.loader is None:
        return None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.from_environment(sampler)


def py_stack_of(frame: FrameType, locs_of: dict[int, dict[int, int]],
                stacks: dict[tuple[int, ...], int], cache: Any = None) -> int | None:
    """The stack walk in Python, where the C one (``_callpath_walk.stack_of``, same signature
    and answer) is not built: ``stacks`` of the frames' locations leaf first, or None when a
    code object, offset or stack is new (the slow path's business). ``cache`` is ignored.
    Subscripts, not ``.get``: they are specialised bytecodes, not method calls."""
    key: list[int] = []
    ap = key.append
    f: FrameType | None = frame
    try:
        while f is not None:
            ap(locs_of[id(f.f_code)][f.f_lasti])
            f = f.f_back
        return stacks[tuple(key)]
    except KeyError:
        return None


def _libc() -> Any:
    try:
        import ctypes
        return ctypes, ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return None, None


def host_id() -> int:
    """gethostid(), the NODE identifier (as ``measdir.host_id``)."""
    _ct, lib = _libc()
    try:
        return int(lib.gethostid()) & 0xFFFFFFFF if lib is not None else 0
    except AttributeError:
        return 0


class _Timer:
    """A POSIX interval timer on CLOCK_MONOTONIC that signals one thread (ctypes, Linux).

    Falls back to ``setitimer(ITIMER_REAL)`` (SIGALRM to the process) where ``timer_create`` with
    ``SIGEV_THREAD_ID`` is unavailable.
    """

    CLOCK_MONOTONIC = 1
    SIGEV_THREAD_ID = 4

    def __init__(self, signo: int) -> None:
        self.signo = signo
        self._id: Any = None
        self._ct, self._lib = _libc()
        if self._lib is not None:
            ct = self._ct
            try:
                self._lib.timer_create.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p]
                self._lib.timer_settime.argtypes = [ct.c_void_p, ct.c_int, ct.c_void_p,
                                                    ct.c_void_p]
                self._lib.timer_delete.argtypes = [ct.c_void_p]
            except AttributeError:
                self._lib = None

    def start(self, period_ns: int, handler: Any) -> str:
        """Arm the timer for the calling thread (whose handler of ``signo`` must already be
        ``handler``); returns the mechanism used."""
        self.stop()
        if self._lib is not None and self.signo != signal.SIGALRM:
            ct = self._ct
            # struct sigevent: sigval (8), signo (4), notify (4), union holding the tid (48)
            sev = ct.create_string_buffer(struct.pack(
                "<QiiI44x", 0, self.signo, self.SIGEV_THREAD_ID, _thread.get_native_id()), 64)
            tid = ct.c_void_p()
            if self._lib.timer_create(self.CLOCK_MONOTONIC, sev, ct.byref(tid)) == 0:
                sec, nsec = divmod(period_ns, 1_000_000_000)
                spec = ct.create_string_buffer(struct.pack("<qqqq", sec, nsec, sec, nsec), 32)
                if self._lib.timer_settime(tid, 0, spec, None) == 0:
                    self._id = tid
                    return "timer_create(CLOCK_MONOTONIC, SIGEV_THREAD_ID)"
                self._lib.timer_delete(tid)
        self.signo = signal.SIGALRM
        self._id = "itimer"
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, period_ns / 1e9, period_ns / 1e9)
        return "setitimer(ITIMER_REAL)"

    def stop(self) -> None:
        if self._id is None:
            return
        if self._id == "itimer":
            signal.setitimer(signal.ITIMER_REAL, 0, 0)
        else:
            self._lib.timer_delete(self._id)
        self._id = None

    def forget(self) -> None:
        """After fork: the child has no timers (POSIX), so there is nothing to delete."""
        self._id = None


def _chunk(tag: int, payload: bytes, slot: int = NO_THREAD) -> bytes:
    return _CHUNK.pack(tag, slot, len(payload)) + payload + b"\0" * ((-len(payload)) % 8)


def _json_chunk(tag: int, obj: Any, slot: int = NO_THREAD) -> bytes:
    return _chunk(tag, json.dumps(obj, separators=(",", ":")).encode(), slot)


class _ThreadData:
    """Per-thread state: sampling clocks, calling context tree, counters.

    ``state`` is what the signal handler touches, a list for the cheapest access: the thread's
    index, the time and CPU time of its previous sample, its unflushed samples aggregated by
    sample key (``{key: [samples, cpu ns, wall ns]}``), and its unflushed trace (``time, key``
    pairs), and the C stack walk's cache of its previous stack (or None). A sample key is
    ``(stack << 1 | NATIVE) << 1 | IDLE``.
    """

    __slots__ = ("cpu", "first_mono", "ident", "idle", "index", "info", "native", "new_nodes",
                 "nodes", "samples", "state", "tree", "wall")

    def __init__(self, index: int, ident: int, cpu: int, t: int) -> None:
        self.index = index
        self.ident = ident
        self.first_mono = t
        self.state: list[Any] = [index, t, cpu, {}, array.array("q"), None]
        self.tree: dict[tuple[int, int, int, int], int] = {}
        self.nodes = 1  # node 0 is the root
        self.new_nodes: list[bytes] = [_NODE.pack(-1, KIND_ROOT, 0, 0, -1, 0, 0)]
        self.samples = self.idle = self.native = self.cpu = self.wall = 0
        self.info: dict[str, Any] = {}


class Sampler:
    """One per process. ``start()`` arms the timer; ``finish()`` writes the last chunks."""

    def __init__(self, out_dir: str, frequency: float, trace: bool) -> None:
        self.out_dir = out_dir
        self.frequency = float(frequency)
        self.period_ns = max(int(1e9 / self.frequency), 10_000)
        self.trace = trace
        self.host = socket.gethostname()
        self.node_id = host_id()
        self.rank = mpi_rank()
        self.call_ops = _call_opcodes()
        self.timer = _Timer(signal.SIGPROF)
        walk_module, self.walker = _c_walk()
        self.stack_of: Callable[..., int | None] = (
            walk_module.stack_of if walk_module is not None else py_stack_of)
        self.c_cache: Callable[[], Any] | None = (
            walk_module.Cache if walk_module is not None else None)
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
        self.locs: list[tuple[int, int, int]] = []
        self.loc_ids: dict[tuple[int, int, int], int] = {}
        # locations per frame, leaf first -> stack << 1 | NATIVE; -1: the sampler's own stack
        self.stacks: dict[tuple[int, ...], int] = {}
        self.line_stacks: dict[tuple[int, ...], int] = {}  # (code index, line) per frame -> id
        self.n_stacks = 0
        self.code_index: dict[int, int] = {}  # id(code) -> index; codes[] keeps them alive
        self.codes: list[CodeType] = []
        self.line_tables: list[tuple[list[int], list[int]]] = []
        self.codes_written = 0
        self.pending_stacks: list[tuple[int, tuple[int, ...]]] = []  # (stack, (code, line)...)
        self.stack_paths: list[list[tuple[int, int]]] = []  # stack id -> root-first (code, line)
        self.threads: dict[int, list[Any]] = {}  # ident -> the thread's handler state
        self.tdata: list[_ThreadData] = []
        self.new_threads: list[int] = []
        self.leaf_of: dict[tuple[int, int, int], int] = {}  # (thread, stack, idle) -> leaf node
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

    def _open(self) -> None:
        os.makedirs(self.out_dir, exist_ok=True)
        gen = 0
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        while True:
            path = os.path.join(self.out_dir, f"process-{self.pid}-{gen}.cpm")
            try:
                self.fd = os.open(path, flags, 0o644)
                break
            except FileExistsError:
                gen += 1  # an exec() of this pid (or a recycled pid) wrote the earlier ones
        self.path = path
        self.process_info["generation"] = gen
        self._write(_FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, 0)
                    + _json_chunk(TAG_PROCESS, self.process_info)
                    + _json_chunk(TAG_METRICS, metric_descriptors(self.frequency)))

    def _write(self, data: bytes) -> None:
        while data:
            n = os.write(self.fd, data)
            data = data[n:]

    def _thread_state(self, ident: int, cpu: int, t: int) -> list[Any]:
        """Register a thread the first time it is seen: index in order of appearance, name."""
        idx = len(self.tdata)
        td = _ThreadData(idx, ident, cpu, t)
        name, native = "", None
        if ident == self.main_ident:
            name, native = "MainThread", _thread.get_native_id()
        threading = sys.modules.get("threading")
        if threading is not None:
            th = threading._active.get(ident)
            if th is not None:
                name, native = th.name, getattr(th, "native_id", native)
        ids = [[ID_NODE, self.node_id, self.node_id, 1]]
        if self.rank is not None:
            ids.append([ID_RANK, self.rank, self.rank, 0])
        ids.append([ID_THREAD, idx, idx, 0])
        td.info = {"tid": native if native is not None else -1, "index": idx, "ids": ids,
                   "name": name, "ident": ident}
        self.tdata.append(td)
        self.new_threads.append(idx)
        if self.c_cache is not None:
            td.state[5] = self.c_cache()
        self.threads[ident] = td.state
        return td.state

    # ---- the signal handler -------------------------------------------------------------------

    def make_handler(self) -> Callable[[int, FrameType | None], None]:
        """The main thread's SIGPROF handler: the C one (``_callpath_walk.Handler``) where it
        is built, else this closure. Both do the same per sample: read two clocks, map each
        frame to a location (``locs_of[id(code)][f_lasti]``: recursion through different call
        sites of one line gives one key, not one per combination), look the stack up, and add
        the sample to the thread's aggregate, which is what gets written; anything new (a code
        object, an offset, a stack) takes the slow path once, other threads and the periodic
        flush are visited from here. The C handler aggregates in its own table, which
        ``_flush_locked`` drains first.
        """
        st = self.threads[self.main_ident]
        if self.c_handler is not None:
            h = self.c_handler(self, self.locs_of, self.stacks, st[5], st[1], st[2],
                               self.last_flush, self.trace, FLUSH_NS, TRACE_FLUSH,
                               IDLE_CPU_SHARE, _thread._count)
            self._drain = h.drain
            return cast(Callable[[int, FrameType | None], None], h)
        self._drain = None
        return self._py_handler(st)

    def _py_handler(self, st: list[Any]) -> Callable[[int, FrameType | None], None]:
        """The handler in Python, as a closure over local bindings (the fastest lookups
        CPython has): every bytecode here runs about a thousand times a second with cold
        caches (the program evicts them between samples)."""
        stacks = self.stacks
        locs_of = self.locs_of
        walk_new = self._new_stack
        mono = time.monotonic_ns
        tcpu = time.thread_time_ns
        n_others = _thread._count
        agg = st[3]
        trace = st[4] if self.trace else None
        cache = st[5]
        share = IDLE_CPU_SHARE
        sampler = self
        stack_of = self.stack_of

        def on_sample(signum: int, frame: FrameType | None) -> None:
            if sampler.busy or frame is None:
                sampler.dropped += 1
                return
            sampler.busy = True
            try:
                t = mono()
                c = tcpu()
                v = stack_of(frame, locs_of, stacks, cache)  # C or Python; None: a miss
                if v is None:
                    v = walk_new(frame)
                if v < 0:  # the signal hit the sampler's own code (finishing, forking)
                    return
                dc = c - st[2]
                wall = t - st[1]
                k = v << 1 | (dc * share < wall)
                try:
                    r = agg[k]
                    r[0] += 1
                    r[1] += dc
                    r[2] += wall
                except KeyError:
                    agg[k] = [1, dc, wall]
                if trace is not None:
                    trace.append(t)
                    trace.append(k)
                st[1] = t
                if n_others():
                    sampler._maybe_others(t)
                if t - sampler.last_flush >= FLUSH_NS or (
                        trace is not None and len(trace) >= TRACE_FLUSH):
                    sampler._flush_locked()
                # The handler's own CPU time is the profiler's, not the program's; it is taken
                # as the handler's wall-clock time (reading a CPU clock costs 5 times more).
                st[2] = c + mono() - t
            except BaseException:
                sampler._handler_error()
            finally:
                sampler.busy = False

        return on_sample

    def _handler_error(self) -> None:
        """Never let the profiler raise into the user's code; give up after a few errors."""
        self.errors += 1
        if self.errors > 10:
            self.timer.stop()

    def _maybe_others(self, t: int) -> None:
        """Sample the other threads, unless the last walk of them was too recent: many
        threads make it long, so it is kept under ~2% of the time by visiting them less often
        (their weights still cover every interval). Its cost is measured in CPU time, which
        preemption does not inflate."""
        if t - self.last_others >= self.others_gap:
            c0 = time.thread_time_ns()
            self._sample_others(t)
            self.others_gap = (time.thread_time_ns() - c0) * OTHERS_BUDGET
            self.last_others = t

    def _sample_others(self, t: int) -> None:
        """Sample every thread but the main one (which the handler sampled from its frame)."""
        threads = self.threads
        stacks = self.stacks
        locs_of = self.locs_of
        cpu_of = time.clock_gettime_ns
        clock_of = time.pthread_getcpuclockid
        main = self.main_ident
        trace = self.trace
        stack_of = self.stack_of
        frames = sys._current_frames()
        for ident, top in frames.items():
            if ident == main:
                continue
            try:
                c = cpu_of(clock_of(ident))
            except OSError:
                continue  # the thread is exiting
            st = threads.get(ident)
            if st is None or c < st[2]:  # new thread, or a new one reusing an ident
                # its CPU clock started at zero; its wall time is counted from one period ago
                st = self._thread_state(ident, 0, t - self.period_ns)
            v = stack_of(top, locs_of, stacks, st[5])
            if v is None:
                v = self._new_stack(top)
            if v < 0:
                continue
            dc = c - st[2]
            wall = t - st[1]
            k = v << 1 | (dc * IDLE_CPU_SHARE < wall)
            r = st[3].get(k)
            if r is None:
                st[3][k] = [1, dc, wall]
            else:
                r[0] += 1
                r[1] += dc
                r[2] += wall
            if trace:
                st[4].append(t)
                st[4].append(k)
            st[1] = t
            st[2] = c
        if len(threads) > len(frames):
            for ident in [i for i in threads if i not in frames and i != main]:
                del threads[ident]

    # ---- the slow path: new code objects, offsets and stacks ----------------------------------

    def _register(self, co: CodeType) -> dict[int, int]:
        """Intern a code object (kept alive, so that its id stays unique) and its line table."""
        ci = len(self.codes)
        self.code_index[id(co)] = ci
        self.codes.append(co)
        starts: list[int] = []
        lines: list[int] = []
        for start, _end, line in co.co_lines():
            starts.append(start)
            lines.append(line if line else -1)  # None, or 0 (the module's RESUME)
        self.line_tables.append((starts, lines))
        table: dict[int, int] = {}
        self.locs_of[id(co)] = table
        return table

    def _loc(self, co: CodeType, lasti: int) -> int:
        """The location of a byte offset: its line, and whether it is a call (NATIVE)."""
        ci = self.code_index[id(co)]
        if lasti < 0:
            line, native = co.co_firstlineno, 0
        else:
            starts, lines = self.line_tables[ci]
            i = bisect_right(starts, lasti) - 1
            line = lines[i] if i >= 0 else -1
            if line < 0:
                line = co.co_firstlineno
            ops = co.co_code
            native = 1 if lasti < len(ops) and ops[lasti] in self.call_ops else 0
        loc = (ci, line, native)
        lid = self.loc_ids.get(loc)
        if lid is None:
            lid = self.loc_ids[loc] = len(self.locs)
            self.locs.append(loc)
        return lid

    def _new_stack(self, frame: FrameType) -> int:
        """Slow path, on a miss of the handler's lookup: intern what is new, name the stack.

        Returns ``stack << 1 | NATIVE`` (the leaf's location says whether it is inside a call),
        or -1 for a stack whose leaf is the sampler itself. Stacks that differ only in the
        NATIVE bit of their leaf share a stack id; the cache is bounded and cleared when full
        (deep recursion of varying depth makes many), the line-keyed table only grows with new
        call paths.
        """
        key: list[int] = []
        f: FrameType | None = frame
        locs_of = self.locs_of
        while f is not None:
            co = f.f_code
            table = locs_of.get(id(co))
            if table is None:
                table = self._register(co)
            lasti = f.f_lasti
            lid = table.get(lasti)
            if lid is None:
                lid = table[lasti] = self._loc(co, lasti)
            key.append(lid)
            f = f.f_back
        tkey = tuple(key)
        value = self.stacks.get(tkey)
        if value is not None:
            return value
        if frame.f_code.co_filename == _THIS_FILE:
            value = -1
        else:
            locs = self.locs
            lkey = tuple(x for lid in key for x in locs[lid][:2])
            sid = self.line_stacks.get(lkey)
            if sid is None:
                sid = self.n_stacks
                self.n_stacks += 1
                self.line_stacks[lkey] = sid
                self.pending_stacks.append((sid, lkey))
            value = sid << 1 | locs[key[0]][2]
        if len(self.stacks) >= STACK_CACHE:
            self.stacks.clear()  # in place: the handler holds this very dict
        self.stacks[tkey] = value
        return value

    # ---- writing ------------------------------------------------------------------------------

    def _leaf(self, td: _ThreadData, sid: int, idle: int) -> int:
        """The thread's tree node for a stack (inserting its path); idle leaves are distinct."""
        node = 0
        path = self.stack_paths[sid]
        last = len(path) - 1
        tree = td.tree
        for depth, (ci, line) in enumerate(path):
            fl = NODE_FLAG_IDLE if idle and depth == last else 0
            k = (node, ci, line, fl)
            child = tree.get(k)
            if child is None:
                child = td.nodes
                td.nodes += 1
                tree[k] = child
                td.new_nodes.append(_NODE.pack(node, KIND_PYTHON, fl, 0, ci, 0, line))
            node = child
        self.leaf_of[(td.index, sid, idle)] = node
        return node

    def _flush_locked(self) -> None:
        """Turn the aggregated samples into tree nodes and counts; append them in one write.

        The work here is per distinct (thread, stack) since the last flush, not per sample.
        """
        if self.fd < 0:
            return
        if self._drain is not None:  # the C handler's samples of the main thread
            main = self.tdata[0].state
            self._drain(main[3], main[4] if self.trace else None)
        for sid, pairs in self.pending_stacks:
            while len(self.stack_paths) <= sid:
                self.stack_paths.append([])
            self.stack_paths[sid] = [(pairs[i], pairs[i + 1])
                                     for i in range(len(pairs) - 2, -1, -2)]
        self.pending_stacks = []
        leaf_of = self.leaf_of
        out: list[bytes] = []
        if self.codes_written < len(self.codes):
            rows = [[co.co_filename, getattr(co, "co_qualname", co.co_name), co.co_firstlineno]
                    for co in self.codes[self.codes_written:]]
            self.codes_written = len(self.codes)
            out.append(_json_chunk(TAG_PYCODE, rows))
        for th in self.new_threads:
            out.append(_json_chunk(TAG_THREAD, self.tdata[th].info, th))
        self.new_threads = []
        for td in self.tdata:
            agg = td.state[3]
            if not agg:
                continue
            th = td.index
            items = list(agg.items())
            agg.clear()  # in place: the handler holds this very dict
            trace = td.state[4]
            tr = trace.tolist() if len(trace) else []
            del trace[:]
            counts: dict[int, list[int]] = {}
            leaf_by_key: dict[int, int] = {}
            for k, (n, cpu, wall) in items:
                idle = k & 1
                sid = k >> 2
                leaf = leaf_of.get((th, sid, idle))
                if leaf is None:
                    leaf = self._leaf(td, sid, idle)
                leaf_by_key[k] = leaf
                c = counts.get(leaf)
                if c is None:
                    counts[leaf] = [n, cpu, wall]
                else:
                    c[0] += n
                    c[1] += cpu
                    c[2] += wall
                td.samples += n
                td.cpu += cpu
                td.wall += wall
                if idle:
                    td.idle += n
                if k & 2:
                    td.native += n
                self.samples += n
            if td.new_nodes:
                out.append(_chunk(TAG_NODES, b"".join(td.new_nodes), th))
                td.new_nodes = []
            # a sum can only be negative when the handler's own time (taken as wall-clock
            # time) was preempted and the thread then went idle: nothing was spent there
            rows_b = [_COUNT.pack(node, METRIC_CPU, n, float(max(cpu, 0)))
                      + _COUNT.pack(node, METRIC_WALL, n, float(wall))
                      for node, (n, cpu, wall) in counts.items()]
            out.append(_chunk(TAG_COUNTS, b"".join(rows_b), th))
            if tr:
                out.append(_chunk(TAG_TRACE, b"".join(
                    _TRACE.pack(tr[i], leaf_by_key[tr[i + 1]], METRIC_CPU)
                    for i in range(0, len(tr), 2)), th))
            out.append(_json_chunk(TAG_STATS, self._stats(td), th))
        if out:
            self._write(b"".join(out))
        if self.native is not None:
            self.native.flush()
        self.last_flush = time.monotonic_ns()

    @staticmethod
    def _stats(td: _ThreadData) -> dict[str, Any]:
        return {"samples": td.samples, "idle_samples": td.idle, "native_samples": td.native,
                "cpu_time_ns": td.cpu, "wall_time_ns": td.wall, "nodes": td.nodes,
                "first_mono_ns": td.first_mono}

    def flush(self) -> None:
        """Flush from outside the handler (fork, exit): keep the handler out meanwhile."""
        was = self.busy
        self.busy = True
        try:
            self._flush_locked()
        finally:
            self.busy = was

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
                self._write(_json_chunk(TAG_PROCESS, self.process_info) + _chunk(TAG_END, b""))
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
