"""The sampler's measurement file: the layout of callpath's measurement-directory format
(version 1, ``docs/measurement-format.md``), the per-thread data that becomes its calling
context trees and counts, and :class:`Recorder`, the part of the sampler that opens the
process's file and appends whole chunks to it.

Runs inside the measured program, loaded by path by ``sampler.py`` (standard library only, no
import of the ``callpath`` package or of the other modules beside it). The layout constants
repeat ``callpath.formats.measdir``'s because this module cannot import that one; a test checks
that they agree. Why a module of its own: what is written, and when, is independent of how a
sample is taken; the signal handler only aggregates, and the flush here turns the aggregates
into tree nodes and counts, per distinct stack rather than per sample.
"""

from __future__ import annotations

import _thread
import array
import json
import os
import struct
import sys
import time
from collections.abc import Callable
from types import CodeType
from typing import Any

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


def chunk(tag: int, payload: bytes, slot: int = NO_THREAD) -> bytes:
    return _CHUNK.pack(tag, slot, len(payload)) + payload + b"\0" * ((-len(payload)) % 8)


def json_chunk(tag: int, obj: Any, slot: int = NO_THREAD) -> bytes:
    return chunk(tag, json.dumps(obj, separators=(",", ":")).encode(), slot)


class ThreadData:
    """Per-thread state: sampling clocks, calling context tree, counters.

    ``state`` is what the signal handler touches, a list for the cheapest access: the thread's
    index, the time and CPU time of its previous sample, its unflushed samples aggregated by
    sample key (``{key: [samples, cpu ns, wall ns]}``), and its unflushed trace (``time, key``
    pairs), and the C stack walk's cache of its previous stack (or None). A sample key is
    ``(stack << 1 | NATIVE) << 1 | IDLE``.
    """

    __slots__ = ("cpu", "first_mono", "ident", "idle", "index", "info", "leaf_of", "native",
                 "new_nodes", "nodes", "samples", "state", "tree", "wall")

    def __init__(self, index: int, ident: int, cpu: int, t: int) -> None:
        self.index = index
        self.ident = ident
        self.first_mono = t
        self.state: list[Any] = [index, t, cpu, {}, array.array("q"), None]
        # the tree's nodes by ((parent << 32 | code index) << 32 | line) << 1 | IDLE, and the
        # leaf of each stack by stack << 1 | IDLE: int keys, which the garbage collector
        # neither counts nor visits (tuples it does, and a program's start makes many)
        self.tree: dict[int, int] = {}
        self.leaf_of: dict[int, int] = {}
        self.nodes = 1  # node 0 is the root
        self.new_nodes: list[bytes] = [_NODE.pack(-1, KIND_ROOT, 0, 0, -1, 0, 0)]
        self.samples = self.idle = self.native = self.cpu = self.wall = 0
        self.info: dict[str, Any] = {}


class Recorder:
    """The writing half of :class:`Sampler` (``sampler.py``): the process's file, its threads,
    and the flush of what the handler aggregated. The attributes below are the sampler's
    per-process state (set by ``Sampler._reset``) that this half reads and updates."""

    out_dir: str
    frequency: float
    trace: bool
    node_id: int
    rank: int | None
    fd: int
    path: str
    pid: int
    main_ident: int
    process_info: dict[str, Any]
    c_cache: Callable[[], Any] | None
    threads: dict[int, list[Any]]
    tdata: list[ThreadData]
    new_threads: list[int]
    codes: list[CodeType]
    codes_written: int
    stack_paths: list[bytes]
    samples: int
    busy: bool
    last_flush: int
    native: Any
    _drain: Callable[[dict[int, list[int]], Any], None] | None

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
                    + json_chunk(TAG_PROCESS, self.process_info)
                    + json_chunk(TAG_METRICS, metric_descriptors(self.frequency)))

    def _write(self, data: bytes) -> None:
        while data:
            n = os.write(self.fd, data)
            data = data[n:]

    def _thread_state(self, ident: int, cpu: int, t: int) -> list[Any]:
        """Register a thread the first time it is seen: index in order of appearance, name."""
        idx = len(self.tdata)
        td = ThreadData(idx, ident, cpu, t)
        name, native = "", None
        if ident == self.main_ident:
            name, native = "MainThread", _thread.get_native_id()
        threading = sys.modules.get("threading")
        if threading is not None:
            th = threading._active.get(ident)
            if th is not None:
                name, native = th.name, getattr(th, "native_id", native)
        if ident == _thread.get_ident():
            # the calling thread's own id, never threading's: 3.11 keeps a forked child's
            # Thread.native_id at the parent's value (a pool worker was labelled with the
            # parent's tid)
            native = _thread.get_native_id()
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

    # ---- writing ------------------------------------------------------------------------------

    def _leaf(self, td: ThreadData, sid: int, idle: int) -> int:
        """The thread's tree node for a stack (inserting its path); idle leaves are distinct."""
        node = 0
        pairs = array.array("i", self.stack_paths[sid])  # (code index, line) per frame, leaf first
        tree = td.tree
        for i in range(len(pairs) - 2, -1, -2):
            ci, line = pairs[i], pairs[i + 1]
            fl = NODE_FLAG_IDLE if idle and i == 0 else 0
            k = ((node << 32 | ci) << 32 | line & 0xFFFFFFFF) << 1 | (fl != 0)
            child = tree.get(k)
            if child is None:
                child = td.nodes
                td.nodes += 1
                tree[k] = child
                td.new_nodes.append(_NODE.pack(node, KIND_PYTHON, fl, 0, ci, 0, line))
            node = child
        td.leaf_of[sid << 1 | idle] = node
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
        out: list[bytes] = []
        if self.codes_written < len(self.codes):
            rows = [[co.co_filename, getattr(co, "co_qualname", co.co_name), co.co_firstlineno]
                    for co in self.codes[self.codes_written:]]
            self.codes_written = len(self.codes)
            out.append(json_chunk(TAG_PYCODE, rows))
        for th in self.new_threads:
            out.append(json_chunk(TAG_THREAD, self.tdata[th].info, th))
        self.new_threads = []
        for td in self.tdata:
            agg = td.state[3]
            if not agg:
                continue
            th = td.index
            leaf_of = td.leaf_of
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
                leaf = leaf_of.get(sid << 1 | idle)
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
                out.append(chunk(TAG_NODES, b"".join(td.new_nodes), th))
                td.new_nodes = []
            # a sum can only be negative when the handler's own time (taken as wall-clock
            # time) was preempted and the thread then went idle: nothing was spent there
            rows_b = [_COUNT.pack(node, METRIC_CPU, n, float(max(cpu, 0)))
                      + _COUNT.pack(node, METRIC_WALL, n, float(wall))
                      for node, (n, cpu, wall) in counts.items()]
            out.append(chunk(TAG_COUNTS, b"".join(rows_b), th))
            if tr:
                out.append(chunk(TAG_TRACE, b"".join(
                    _TRACE.pack(tr[i], leaf_by_key[tr[i + 1]], METRIC_CPU)
                    for i in range(0, len(tr), 2)), th))
            out.append(json_chunk(TAG_STATS, self._stats(td), th))
        if out:
            self._write(b"".join(out))
        if self.native is not None:
            self.native.flush()
        self.last_flush = time.monotonic_ns()

    @staticmethod
    def _stats(td: ThreadData) -> dict[str, Any]:
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
