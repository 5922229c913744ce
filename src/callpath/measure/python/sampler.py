"""The in-process sampler of Python programs: a timer signal, a stack walk, measurement files.

This module runs *inside the measured program*, so it is written under constraints that the rest
of callpath does not have:

- standard library only, and no import of the ``callpath`` package (whose ``__init__`` pulls in
  numpy): the bootstrap in ``shim/sitecustomize.py`` loads this file by path, before the user's
  code, in every Python process of the measured program tree;
- the signal handler does the least work that keeps the data exact: a walk from its ``frame``
  argument appending ``(id(code), f_lasti)`` pairs, one dict lookup for the whole stack, one
  ``array.extend`` of six integers per thread. Code objects are interned (and kept alive, so their
  ids stay unique) only when a stack is seen for the first time; byte offsets become line numbers,
  and stacks become calling-context-tree nodes, when data is flushed;
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
from typing import Any, NoReturn

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

# ---- samples as buffered in memory -------------------------------------------------------------
FIELDS = 6  # time (ns, CLOCK_MONOTONIC), thread index, stack id, CPU ns, wall ns, flags
FLAG_IDLE = 1
FLAG_NATIVE = 2

ENV_OUT = "CALLPATH_PY_OUT"
ENV_FREQ = "CALLPATH_PY_FREQ"
ENV_TRACE = "CALLPATH_PY_TRACE"

IDLE_CPU_SHARE = 20  # IDLE when cpu * 20 < wall, i.e. under 5% of one CPU
OTHERS_BUDGET = 50  # sample other threads at most every 50 x the CPU time it took last time
STACK_CACHE = 50_000  # entries of the offset-keyed stack cache before it is cleared
FLUSH_NS = 1_000_000_000  # flush at least once a second ...
FLUSH_SAMPLES = 4096  # ... or when this many thread-samples are buffered

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
    """Per-thread state: sampling clocks, calling context tree, counters."""

    __slots__ = ("counts", "cpu", "first_mono", "ident", "idle", "index", "info", "native",
                 "new_nodes", "nodes", "prev_cpu", "prev_t", "samples", "trace", "tree", "wall")

    def __init__(self, index: int, ident: int, cpu: int, t: int) -> None:
        self.index = index
        self.ident = ident
        self.prev_t = t
        self.prev_cpu = cpu
        self.first_mono = t
        self.tree: dict[tuple[int, int, int, int], int] = {}
        self.nodes = 1  # node 0 is the root
        self.new_nodes: list[bytes] = [_NODE.pack(-1, KIND_ROOT, 0, 0, -1, 0, 0)]
        self.counts: dict[int, list[int]] = {}  # node -> [samples, cpu ns, wall ns] (unflushed)
        self.trace: list[bytes] = []
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
        self.mechanism = ""
        self.fd = -1
        self.path = ""
        self.finished = False
        self.errors = 0
        self.forked_from: int | None = None
        self.pending_signal = 0
        self.handler: Callable[[int, FrameType | None], None] | None = None
        self._orig_exit: Callable[[int], NoReturn] | None = None
        self._reset()

    # ---- per-process state --------------------------------------------------------------------

    def _reset(self) -> None:
        """Fresh tables: each process's file stands alone (also after fork)."""
        self.pid = os.getpid()
        self.main_ident = _thread.get_ident()
        # (id(code), f_lasti) per frame -> stack id; -1: a stack of the sampler itself
        self.stacks: dict[tuple[int, ...], int] = {}
        self.line_stacks: dict[tuple[int, ...], int] = {}  # (code index, line) per frame -> id
        self.line_memo: dict[tuple[int, int], int] = {}  # (code index, f_lasti) -> line
        self.n_stacks = 0
        self.code_index: dict[int, int] = {}  # id(code) -> index; codes[] keeps them alive
        self.codes: list[CodeType] = []
        self.code_ops: list[bytes] = []
        self.line_tables: list[tuple[list[int], list[int]] | None] = []
        self.codes_written = 0
        self.pending_stacks: list[tuple[int, list[int]]] = []  # (stack id, [code idx, line]...)
        self.stack_paths: list[list[tuple[int, int]]] = []  # stack id -> root-first (code, line)
        self.threads: dict[int, list[int]] = {}  # ident -> [index, prev t, prev cpu]
        self.tdata: list[_ThreadData] = []
        self.new_threads: list[int] = []
        self.leaf_of: dict[tuple[int, int, int], int] = {}  # (thread, stack, idle) -> leaf node
        self.buf = array.array("q")
        self.samples = 0
        self.dropped = 0
        self.busy = False
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

    def _thread_state(self, ident: int, cpu: int, t: int) -> list[int]:
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
        state = [idx, t, cpu]
        self.threads[ident] = state
        return state

    # ---- the signal handler -------------------------------------------------------------------

    def make_handler(self) -> Callable[[int, FrameType | None], None]:
        """The handler as a closure over local bindings (the fastest lookups CPython has)."""
        stacks = self.stacks
        buf = self.buf
        threads = self.threads
        walk_new = self._new_stack
        mono = time.monotonic_ns
        tcpu = time.thread_time_ns
        n_others = _thread._count
        call_ops = self.call_ops
        code_index = self.code_index
        code_ops = self.code_ops
        sampler = self

        def on_sample(signum: int, frame: FrameType | None) -> None:
            if sampler.busy or frame is None:
                sampler.dropped += 1
                return
            sampler.busy = True
            try:
                t = mono()
                st = threads[sampler.main_ident]
                c = tcpu()
                key: list[int] = []
                ap = key.append
                f: FrameType | None = frame
                while f is not None:
                    ap(id(f.f_code))
                    ap(f.f_lasti)
                    f = f.f_back
                sid = stacks.get(tuple(key))
                if sid is None:
                    sid = walk_new(tuple(key), frame)
                if sid < 0:  # the signal hit the sampler's own code (finishing, forking)
                    return
                wall = t - st[1]
                dc = c - st[2]
                flags = FLAG_IDLE if dc * IDLE_CPU_SHARE < wall else 0
                ops = code_ops[code_index[key[0]]]
                if 0 <= key[1] < len(ops) and ops[key[1]] in call_ops:
                    flags |= FLAG_NATIVE
                buf.extend((t, st[0], sid, dc, wall, flags))
                st[1] = t
                n = 1
                if n_others() and t - sampler.last_others >= sampler.others_gap:
                    # Many threads make this walk long: keep it under ~2% of the time by
                    # visiting them less often (their weights still cover every interval).
                    # Its cost is measured in CPU time, which preemption does not inflate.
                    c0 = tcpu()
                    n += sampler._sample_others(t)
                    sampler.others_gap = (tcpu() - c0) * OTHERS_BUDGET
                    sampler.last_others = t
                sampler.samples += n
                if len(buf) >= FLUSH_SAMPLES * FIELDS or t - sampler.last_flush >= FLUSH_NS:
                    sampler._flush_locked()
                # the handler's own CPU time is the profiler's, not the program's
                st[2] = tcpu()
            except BaseException:
                # Never let the profiler raise into the user's code; give up after a few.
                sampler.errors += 1
                if sampler.errors > 10:
                    sampler.timer.stop()
            finally:
                sampler.busy = False

        return on_sample

    def _sample_others(self, t: int) -> int:
        """Sample every thread but the main one (which the handler sampled from its frame)."""
        threads = self.threads
        stacks = self.stacks
        buf = self.buf
        code_index = self.code_index
        code_ops = self.code_ops
        call_ops = self.call_ops
        cpu_of = time.clock_gettime_ns
        clock_of = time.pthread_getcpuclockid
        main = self.main_ident
        frames = sys._current_frames()
        n = 0
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
            key: list[int] = []
            ap = key.append
            f: FrameType | None = top
            while f is not None:
                ap(id(f.f_code))
                ap(f.f_lasti)
                f = f.f_back
            sid = stacks.get(tuple(key))
            if sid is None:
                sid = self._new_stack(tuple(key), top)
            if sid < 0:
                continue
            wall = t - st[1]
            dc = c - st[2]
            flags = FLAG_IDLE if dc * IDLE_CPU_SHARE < wall else 0
            ops = code_ops[code_index[key[0]]]
            if 0 <= key[1] < len(ops) and ops[key[1]] in call_ops:
                flags |= FLAG_NATIVE
            buf.extend((t, st[0], sid, dc, wall, flags))
            st[1] = t
            st[2] = c
            n += 1
        if len(threads) > len(frames):
            for ident in [i for i in threads if i not in frames and i != main]:
                del threads[ident]
        return n

    def _new_stack(self, key: tuple[int, ...], frame: FrameType) -> int:
        """Slow path, on a miss of the offset-keyed cache: name the stack by its lines.

        Stacks are identified by (code, line) per frame. The handler's cache is keyed by byte
        offsets (cheaper to read than lines), and recursion multiplies offset-distinct stacks
        (``fib(n-1) + fib(n-2)``: two offsets per level, one line), so that cache is bounded
        and cleared when full, while the line-keyed table only grows with new call paths.
        """
        if frame.f_code.co_filename == _THIS_FILE:
            self.stacks[key] = -1
            return -1
        pairs: list[int] = []
        f: FrameType | None = frame
        code_index = self.code_index
        line_memo = self.line_memo
        while f is not None:
            co = f.f_code
            ci = code_index.get(id(co))
            if ci is None:
                ci = len(self.codes)
                code_index[id(co)] = ci
                self.codes.append(co)
                self.code_ops.append(co.co_code)
                self.line_tables.append(None)
            lasti = f.f_lasti
            line = line_memo.get((ci, lasti))
            if line is None:
                line = line_memo[(ci, lasti)] = self._line_of(ci, lasti)
            pairs.append(ci)
            pairs.append(line)
            f = f.f_back
        lkey = tuple(pairs)
        sid = self.line_stacks.get(lkey)
        if sid is None:
            sid = self.n_stacks
            self.n_stacks += 1
            self.line_stacks[lkey] = sid
            self.pending_stacks.append((sid, pairs))
        if len(self.stacks) >= STACK_CACHE:
            self.stacks.clear()  # in place: the handler holds this very dict
        if len(line_memo) >= STACK_CACHE:
            line_memo.clear()
        self.stacks[key] = sid
        return sid

    # ---- writing ------------------------------------------------------------------------------

    def _line_of(self, ci: int, lasti: int) -> int:
        """Source line of a byte offset, through the code object's line table (memoised)."""
        table = self.line_tables[ci]
        co = self.codes[ci]
        if table is None:
            starts: list[int] = []
            lines: list[int] = []
            for start, _end, line in co.co_lines():
                starts.append(start)
                lines.append(line if line else -1)  # None, or 0 (the module's RESUME)
            table = (starts, lines)
            self.line_tables[ci] = table
        if lasti < 0:
            return co.co_firstlineno
        i = bisect_right(table[0], lasti) - 1
        line = table[1][i] if i >= 0 else -1
        return line if line >= 0 else co.co_firstlineno

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
        """Turn buffered samples into tree nodes and counts; append them in one write."""
        if self.fd < 0:
            return
        for sid, pairs in self.pending_stacks:
            while len(self.stack_paths) <= sid:
                self.stack_paths.append([])
            self.stack_paths[sid] = [(pairs[i], pairs[i + 1])
                                     for i in range(len(pairs) - 2, -1, -2)]
        self.pending_stacks = []
        buf = self.buf
        tdata = self.tdata
        leaf_of = self.leaf_of
        trace = self.trace
        touched = set()
        for i in range(0, len(buf), FIELDS):
            t, th, sid, cpu, wall, fl = buf[i:i + FIELDS]
            idle = fl & FLAG_IDLE
            td = tdata[th]
            leaf = leaf_of.get((th, sid, idle))
            if leaf is None:
                leaf = self._leaf(td, sid, idle)
            c = td.counts.get(leaf)
            if c is None:
                td.counts[leaf] = [1, cpu, wall]
            else:
                c[0] += 1
                c[1] += cpu
                c[2] += wall
            td.samples += 1
            td.cpu += cpu
            td.wall += wall
            if idle:
                td.idle += 1
            if fl & FLAG_NATIVE:
                td.native += 1
            if trace:
                td.trace.append(_TRACE.pack(t, leaf, METRIC_CPU))
            touched.add(th)
        del buf[:]
        out: list[bytes] = []
        if self.codes_written < len(self.codes):
            rows = [[co.co_filename, getattr(co, "co_qualname", co.co_name), co.co_firstlineno]
                    for co in self.codes[self.codes_written:]]
            self.codes_written = len(self.codes)
            out.append(_json_chunk(TAG_PYCODE, rows))
        for th in self.new_threads:
            out.append(_json_chunk(TAG_THREAD, tdata[th].info, th))
        self.new_threads = []
        for th in sorted(touched):
            td = tdata[th]
            if td.new_nodes:
                out.append(_chunk(TAG_NODES, b"".join(td.new_nodes), th))
                td.new_nodes = []
            rows_b = [_COUNT.pack(node, METRIC_CPU, n, float(cpu))
                      + _COUNT.pack(node, METRIC_WALL, n, float(wall))
                      for node, (n, cpu, wall) in td.counts.items()]
            out.append(_chunk(TAG_COUNTS, b"".join(rows_b), th))
            td.counts = {}
            if td.trace:
                out.append(_chunk(TAG_TRACE, b"".join(td.trace), th))
                td.trace = []
            out.append(_json_chunk(TAG_STATS, self._stats(td), th))
        if out:
            self._write(b"".join(out))
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
        self.mechanism = self.timer.start(self.period_ns, self.handler)


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
