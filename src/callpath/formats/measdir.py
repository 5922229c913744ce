"""The measurement directory written by ``callpath run``: reader and writer (format version 1).

A measurement directory holds one small JSON header (``measurement.json``) and one append-only
binary file per process image (``process-<pid>-<generation>.cpm``). A process file is a sequence
of self-describing *chunks* (tag, thread, length, payload); each chunk is written and flushed as
a whole, so a file cut short by a crash or a kill loses at most its last chunk, and the reader
accepts such a file (``ProcessProfile.truncated``). Bulk data (calling-context-tree nodes, sample
counts, traces) are little-endian numpy arrays, small tables (modules, Python code locations,
thread identities) are JSON. Calling-context-tree nodes and counts are *appended*: a writer can
flush a few new nodes and count deltas whenever it likes, and the reader sums the deltas.

A node is a native frame (load-module index + link-time address inside that module) or a Python
frame (index into the process's table of Python code locations + current line), so the native
sampler (issue 4) and the Python sampler (issue 5) write the same format, and ``callpath prof``
reads one thing. See ``docs/measurement-format.md`` for the byte-level description.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError, FormatError
from callpath.formats import measdir_header as _header
from callpath.model.contexts import Identifier, IdKind

# the header's part, which needs no numpy (measdir_header), under its old names
FORMAT_NAME = _header.FORMAT_NAME
HEADER_FILE = _header.HEADER_FILE
LAUNCHER_PROGRAMS = _header.LAUNCHER_PROGRAMS
MPI_LAUNCHERS = _header.MPI_LAUNCHERS
PROCESS_GLOB = _header.PROCESS_GLOB
VERSION = _header.VERSION
MetricInfo = _header.MetricInfo
check_new_directory = _header.check_new_directory
host_id = _header.host_id
make_new_directory = _header.make_new_directory
write_header = _header.write_header
MAGIC = b"CPMEAS\x00\x00"
_FILE_HEADER = struct.Struct("<8sII")  # magic, version, reserved
_CHUNK = struct.Struct("<IIQ")  # tag, thread slot (0xffffffff: whole process), payload bytes
NO_THREAD = 0xFFFFFFFF


class Tag(IntEnum):
    """Chunk tags. Unknown tags are skipped by readers (forward compatibility)."""

    PROCESS = 1   # JSON object: pid, ppid, generation, host, rank, exe, ... (last one wins)
    MODULES = 2   # JSON list of load modules, appended to the process's module table
    THREAD = 3    # JSON object: identity of thread slot ``thread`` (last one wins)
    NODES = 4     # NODE_DTYPE array: new nodes of the thread's tree, ids continue in order
    COUNTS = 5    # COUNT_DTYPE array: deltas of (node, metric) sample counts and values
    TRACE = 6     # TRACE_DTYPE array: (time, node, metric) per sample, appended
    PYCODE = 7    # JSON list of [file, function, first line], appended to the code table
    STATS = 8     # JSON object: per-thread statistics (samples, lost, partial, ...); last wins
    METRICS = 9   # JSON list of metric descriptors (same as the header's); last wins
    END = 10      # empty: the writer closed the file normally


class NodeKind(IntEnum):
    ROOT = 0      # the thread's root (node 0 of every thread, parent -1)
    NATIVE = 1    # machine code: ``module`` indexes the module table, ``address`` link-time VMA
    PYTHON = 2    # Python frame: ``module`` indexes the code table, ``address`` current line
    PARTIAL = 3   # root of call paths that could not be unwound to the thread's entry
    UNKNOWN = 4   # a frame whose pc lies in no known module: ``address`` is the raw pc
    PLACEHOLDER = 5  # a state below the leaf frame: ``address`` is a Placeholder code


class Placeholder(IntEnum):
    """What a PLACEHOLDER node stands for (``callpath run -e REALTIME``): the thread was
    switched out at its parent's pc, in a system call (BLOCKED) or elsewhere, runnable and
    waiting for a CPU (PREEMPTED). ``callpath prof`` shows it as ``<blocked>``/``<preempted>``
    under the frame where it happened, and the trace uses it for the time off CPU.
    GIL_WAIT (``callpath run --native``): a Python thread waiting for the GIL in CPython's
    ``take_gil``, below that frame (the condition-variable and futex frames under it cut)."""

    BLOCKED = 1
    PREEMPTED = 2
    GIL_WAIT = 3


PLACEHOLDER_NAMES = {Placeholder.BLOCKED: "<blocked>", Placeholder.PREEMPTED: "<preempted>",
                     Placeholder.GIL_WAIT: "<GIL wait>"}


class NodeFlag(IntEnum):
    EXACT_PC = 1  # native: ``address`` is the sampled pc itself (leaf or interrupted frame);
                  # otherwise it is a return address and the call site is ``address - 1``
    IDLE = 2      # Python: the sample found the thread idle or waiting (not running code)
    VDSO = 4      # native: the module is the kernel's vdso (its image is saved as vdso-*.so)


NODE_DTYPE = np.dtype([("parent", "<i4"), ("kind", "u1"), ("flags", "u1"), ("reserved", "<u2"),
                       ("module", "<i4"), ("reserved2", "<u4"), ("address", "<u8")])
COUNT_DTYPE = np.dtype([("node", "<u4"), ("metric", "<u4"), ("samples", "<u8"),
                        ("value", "<f8")])
TRACE_DTYPE = np.dtype([("time", "<u8"), ("node", "<u4"), ("metric", "<u4")])


@dataclass(frozen=True)
class Module:
    """A load module mapped in a process. ``start``/``end`` is the executable mapping in the
    process; ``offset`` its file offset; ``vaddr`` the link-time address that ``start`` maps
    (native node addresses are link-time addresses: ``pc - start + vaddr``)."""

    index: int
    path: str
    start: int
    end: int
    offset: int = 0
    vaddr: int = 0
    build_id: str = ""
    saved: str = ""  # file name inside the measurement directory holding its image (vdso)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "path": self.path, "start": self.start, "end": self.end,
                "offset": self.offset, "vaddr": self.vaddr, "build_id": self.build_id,
                "saved": self.saved}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Module:
        return Module(int(d["index"]), str(d["path"]), int(d["start"]), int(d["end"]),
                      int(d.get("offset", 0)), int(d.get("vaddr", 0)), str(d.get("build_id", "")),
                      str(d.get("saved", "")))


@dataclass(frozen=True)
class PyCode:
    """A Python code object's location: nodes of kind PYTHON point here."""

    file: str
    function: str
    first_line: int


@dataclass
class ThreadProfile:
    """One execution context: a thread of a process image, with its calling context tree."""

    slot: int
    info: dict[str, Any]
    nodes: npt.NDArray[Any]           # NODE_DTYPE, node 0 is the root
    samples: npt.NDArray[np.uint64]   # (n_nodes, n_metrics) samples taken at each node
    values: npt.NDArray[np.float64]   # (n_nodes, n_metrics) sum of sample periods
    trace: npt.NDArray[Any]           # TRACE_DTYPE, in time order as written
    stats: dict[str, Any]

    @property
    def tid(self) -> int:
        return int(self.info.get("tid", -1))

    @property
    def ids(self) -> tuple[Identifier, ...]:
        """Identifier tuple as in ``callpath.model.contexts`` (NODE, RANK, THREAD, ...)."""
        return tuple(Identifier(int(k), int(lid), int(pid), int(fl))
                     for k, lid, pid, fl in self.info.get("ids", []))

    def path_of(self, node: int) -> list[int]:
        """Node ids from the root to ``node`` (a convenience for tests and quick looks)."""
        out = []
        parent = self.nodes["parent"]
        while node >= 0:
            out.append(node)
            node = int(parent[node])
        return out[::-1]


@dataclass
class ProcessProfile:
    path: Path
    info: dict[str, Any]
    modules: list[Module]
    pycode: list[PyCode]
    threads: list[ThreadProfile]
    metrics: list[MetricInfo] | None
    complete: bool   # an END chunk was seen
    truncated: bool  # the file ends inside a chunk (the writer was killed mid-write)

    @property
    def pid(self) -> int:
        return int(self.info.get("pid", -1))


@dataclass
class Measurement:
    path: Path
    header: dict[str, Any]
    metrics: list[MetricInfo]
    processes: list[ProcessProfile] = field(default_factory=list)

    @property
    def threads(self) -> Iterator[tuple[ProcessProfile, ThreadProfile]]:
        for p in self.processes:
            for t in p.threads:
                yield p, t


# ------------------------------------------------------------------------------------ writing


def process_file_name(pid: int, generation: int = 0) -> str:
    return f"process-{pid}-{generation}.cpm"


class ProcessWriter:
    """Appends chunks to one process file; every call writes and flushes whole chunks.

    Node ids are per thread slot and implicit (the order nodes are appended); the writer keeps
    the running count so callers can compute the ids of the nodes they append.
    """

    def __init__(self, directory: str | os.PathLike[str], pid: int, generation: int = 0,
                 name: str | None = None) -> None:
        # ``name``: another file of the same format (a GPU companion, measdir_gpu)
        self.path = Path(directory) / (name or process_file_name(pid, generation))
        self._f: IO[bytes] = open(self.path, "ab")  # noqa: SIM115 - closed by close()
        if self._f.tell() == 0:
            self._f.write(_FILE_HEADER.pack(MAGIC, VERSION, 0))
            self._f.flush()
        self.node_counts: dict[int, int] = {}
        self.n_modules = 0
        self.n_pycode = 0

    def _chunk(self, tag: Tag, payload: bytes, thread: int = NO_THREAD) -> None:
        pad = (-len(payload)) % 8
        self._f.write(_CHUNK.pack(int(tag), thread, len(payload)) + payload + b"\0" * pad)
        self._f.flush()

    def raw_chunk(self, tag: int, payload: bytes, thread: int = NO_THREAD) -> None:
        """A chunk of a tag this module does not define (GPU operations:
        ``callpath.formats.measdir_gpu``)."""
        pad = (-len(payload)) % 8
        self._f.write(_CHUNK.pack(tag, thread, len(payload)) + payload + b"\0" * pad)
        self._f.flush()

    def _json(self, tag: Tag, obj: Any, thread: int = NO_THREAD) -> None:
        self._chunk(tag, json.dumps(obj, separators=(",", ":")).encode(), thread)

    def process(self, **info: Any) -> None:
        self._json(Tag.PROCESS, info)

    def metrics(self, metrics: Iterable[MetricInfo]) -> None:
        self._json(Tag.METRICS, [m.to_json() for m in metrics])

    def modules(self, modules: Iterable[Module]) -> None:
        mods = list(modules)
        for i, m in enumerate(mods):
            if m.index != self.n_modules + i:
                raise ValueError(f"module index {m.index}, expected {self.n_modules + i}")
        self.n_modules += len(mods)
        self._json(Tag.MODULES, [m.to_json() for m in mods])

    def pycode(self, codes: Iterable[PyCode]) -> None:
        rows = [[c.file, c.function, c.first_line] for c in codes]
        self.n_pycode += len(rows)
        self._json(Tag.PYCODE, rows)

    def thread(self, slot: int, *, tid: int, ids: Iterable[Identifier] = (),
               **info: Any) -> None:
        """Declare (or update) thread ``slot``: its tid and identifier tuple."""
        doc = {"tid": tid, "ids": [[i.kind, i.logical_id, i.physical_id, i.flags] for i in ids]}
        doc.update(info)
        self._json(Tag.THREAD, doc, slot)

    def nodes(self, slot: int, nodes: npt.NDArray[Any]) -> int:
        """Append nodes to the thread's tree; returns the id of the first appended node."""
        arr = np.ascontiguousarray(nodes, dtype=NODE_DTYPE)
        first = self.node_counts.get(slot, 0)
        self.node_counts[slot] = first + len(arr)
        self._chunk(Tag.NODES, arr.tobytes(), slot)
        return first

    def counts(self, slot: int, counts: npt.NDArray[Any]) -> None:
        self._chunk(Tag.COUNTS, np.ascontiguousarray(counts, dtype=COUNT_DTYPE).tobytes(), slot)

    def trace(self, slot: int, trace: npt.NDArray[Any]) -> None:
        self._chunk(Tag.TRACE, np.ascontiguousarray(trace, dtype=TRACE_DTYPE).tobytes(), slot)

    def stats(self, slot: int, **stats: Any) -> None:
        self._json(Tag.STATS, stats, slot)

    def close(self) -> None:
        if not self._f.closed:
            self._chunk(Tag.END, b"")
            self._f.close()

    def __enter__(self) -> ProcessWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_nodes(parent: npt.ArrayLike, kind: npt.ArrayLike, module: npt.ArrayLike,
               address: npt.ArrayLike, flags: npt.ArrayLike = 0) -> npt.NDArray[Any]:
    """Build a NODE_DTYPE array from columns (broadcasting scalars)."""
    p = np.asarray(parent)
    out = np.zeros(p.shape[0] if p.ndim else 1, dtype=NODE_DTYPE)
    out["parent"] = parent
    out["kind"] = kind
    out["module"] = module
    out["address"] = address
    out["flags"] = flags
    return out


# ------------------------------------------------------------------------------------ reading


def read(directory: str | os.PathLike[str]) -> Measurement:
    """Read a whole measurement directory. Raises :class:`CallpathError` naming the culprit."""
    d = Path(directory)
    if not d.is_dir():
        raise CallpathError(f"{d}: not a measurement directory (expected a directory written "
                            f"by 'callpath run')")
    hp = d / HEADER_FILE
    try:
        header = json.loads(hp.read_text())
    except FileNotFoundError:
        raise FormatError(hp, "missing: not a callpath measurement directory") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(hp, f"expected a JSON object ({e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise FormatError(hp, f"expected \"format\": \"{FORMAT_NAME}\"")
    version = header.get("version")
    if not isinstance(version, int) or version > VERSION or version < 1:
        raise FormatError(hp, f"unsupported version {version!r} (this reader knows 1..{VERSION})")
    try:
        metrics = [MetricInfo.from_json(m) for m in header.get("metrics", [])]
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(hp, f"bad metric descriptor ({e})") from None
    m = Measurement(d, header, metrics)
    files = sorted(d.glob(PROCESS_GLOB), key=file_order)
    m.processes = [read_process(f, len(metrics)) for f in files]
    return m


def file_order(p: Path) -> tuple[int, int, str]:
    """Sort key of a process file (``process-<pid>-<generation>.cpm``): pid, then generation
    (public: the attribution reads process files in this order too)."""
    parts = p.stem.split("-")
    try:
        return int(parts[1]), int(parts[2]), p.name
    except (IndexError, ValueError):
        return (1 << 62, 0, p.name)


def iter_chunks(path: Path, data: bytes) -> Iterator[tuple[int, int, memoryview]]:
    """Yield (tag, thread, payload) of every complete chunk; stop quietly at a cut-off end."""
    if len(data) < _FILE_HEADER.size:
        # A process killed between creating its file and writing the header leaves a prefix
        # of the header (often nothing): an empty, truncated file, not a corrupt directory.
        if bytes(data) == _FILE_HEADER.pack(MAGIC, VERSION, 0)[:len(data)]:
            return
        raise FormatError(path, f"expected a {_FILE_HEADER.size}-byte file header, "
                          f"file has {len(data)} bytes")
    magic, version, _ = _FILE_HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise FormatError(path, f"bad magic {magic!r}, expected {MAGIC!r}", 0)
    if version > VERSION or version < 1:
        raise FormatError(path, f"unsupported process file version {version}", 8)
    view = memoryview(data)
    pos = _FILE_HEADER.size
    while pos + _CHUNK.size <= len(data):
        tag, thread, length = _CHUNK.unpack_from(data, pos)
        end = pos + _CHUNK.size + length
        if end > len(data):
            return
        yield tag, thread, view[pos + _CHUNK.size:end]
        pos = end + ((-length) % 8)


def _array(path: Path, payload: memoryview, dtype: np.dtype[Any], what: str,
           offset: int) -> npt.NDArray[Any]:
    if len(payload) % dtype.itemsize:
        raise FormatError(path, f"{what} chunk of {len(payload)} bytes is not a multiple of "
                          f"{dtype.itemsize}", offset)
    return np.frombuffer(payload, dtype=dtype).copy()


def _load_json(path: Path, payload: memoryview, what: str) -> Any:
    try:
        return json.loads(bytes(payload))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(path, f"{what} chunk: expected JSON ({e})") from None


def read_process_info(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The PROCESS object of a process file (pid, ppid, rank, comm, exe, ...) without reading
    its threads: deciding which processes are launchers needs every file's facts first."""
    p = Path(path)
    info: dict[str, Any] = {}
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return info
            with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as data:
                chunks: Any = iter_chunks(p, data)  # type: ignore[arg-type]
                for tag, _slot, payload in chunks:
                    if tag == Tag.PROCESS:  # the last one wins, as in read_process
                        obj = _load_json(p, payload, "PROCESS")
                        if isinstance(obj, dict):
                            info = obj
                    payload.release()
                chunks.close()  # drops its view of the map before the map closes
    except OSError as e:
        raise FormatError(p, f"cannot read ({e.strerror})") from None
    return info


def read_process(path: str | os.PathLike[str], n_metrics: int | None = None) -> ProcessProfile:
    """Read one process file. ``n_metrics`` bounds metric ids (from the header) when known."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise FormatError(p, f"cannot read ({e.strerror})") from None
    info: dict[str, Any] = {}
    modules: list[Module] = []
    pycode: list[PyCode] = []
    metrics: list[MetricInfo] | None = None
    tinfo: dict[int, dict[str, Any]] = {}
    tstats: dict[int, dict[str, Any]] = {}
    tnodes: dict[int, list[npt.NDArray[Any]]] = {}
    tcounts: dict[int, list[npt.NDArray[Any]]] = {}
    ttrace: dict[int, list[npt.NDArray[Any]]] = {}
    complete = False
    consumed = _FILE_HEADER.size
    for tag, slot, payload in iter_chunks(p, data):
        off = consumed
        consumed += _CHUNK.size + len(payload) + ((-len(payload)) % 8)
        complete = False
        if tag == Tag.PROCESS:
            obj = _load_json(p, payload, "PROCESS")
            if not isinstance(obj, dict):
                raise FormatError(p, "PROCESS chunk: expected a JSON object", off)
            info = obj
        elif tag == Tag.MODULES:
            rows = _load_json(p, payload, "MODULES")
            try:
                for r in rows:
                    mod = Module.from_json(r)
                    if mod.index != len(modules):
                        raise FormatError(p, f"module index {mod.index}, expected "
                                          f"{len(modules)}", off)
                    modules.append(mod)
            except (KeyError, TypeError, ValueError) as e:
                raise FormatError(p, f"MODULES chunk: bad module ({e})", off) from None
        elif tag == Tag.PYCODE:
            rows = _load_json(p, payload, "PYCODE")
            try:
                pycode.extend(PyCode(str(f), str(fn), int(ln)) for f, fn, ln in rows)
            except (TypeError, ValueError) as e:
                raise FormatError(p, f"PYCODE chunk: expected [file, function, line] ({e})",
                                  off) from None
        elif tag == Tag.THREAD:
            obj = _load_json(p, payload, "THREAD")
            if not isinstance(obj, dict):
                raise FormatError(p, "THREAD chunk: expected a JSON object", off)
            tinfo[slot] = obj
        elif tag == Tag.STATS:
            obj = _load_json(p, payload, "STATS")
            if not isinstance(obj, dict):
                raise FormatError(p, "STATS chunk: expected a JSON object", off)
            tstats[slot] = obj
        elif tag == Tag.METRICS:
            rows = _load_json(p, payload, "METRICS")
            try:
                metrics = [MetricInfo.from_json(r) for r in rows]
            except (KeyError, TypeError, ValueError) as e:
                raise FormatError(p, f"METRICS chunk: bad metric ({e})", off) from None
        elif tag == Tag.NODES:
            tnodes.setdefault(slot, []).append(_array(p, payload, NODE_DTYPE, "NODES", off))
        elif tag == Tag.COUNTS:
            tcounts.setdefault(slot, []).append(_array(p, payload, COUNT_DTYPE, "COUNTS", off))
        elif tag == Tag.TRACE:
            ttrace.setdefault(slot, []).append(_array(p, payload, TRACE_DTYPE, "TRACE", off))
        elif tag == Tag.END:
            complete = True
    truncated = consumed < len(data) or len(data) < _FILE_HEADER.size
    nm = n_metrics if n_metrics is not None else (len(metrics) if metrics is not None else 0)
    if metrics is not None:
        nm = max(nm, len(metrics))
    threads = []
    for slot in sorted(set(tinfo) | set(tnodes) | set(tcounts)):
        nodes = (np.concatenate(tnodes[slot]) if slot in tnodes
                 else np.zeros(0, dtype=NODE_DTYPE))
        n = len(nodes)
        if n and nodes["parent"][0] != -1:
            raise FormatError(p, f"thread slot {slot}: node 0 must be the root (parent -1)")
        par = nodes["parent"]
        if n and (np.any(par[1:] < 0) or np.any(par[1:] >= np.arange(1, n))):
            raise FormatError(p, f"thread slot {slot}: every node's parent must be an earlier "
                              "node")
        counts = (np.concatenate(tcounts[slot]) if slot in tcounts
                  else np.zeros(0, dtype=COUNT_DTYPE))
        metric_count = nm if nm else (int(counts["metric"].max()) + 1 if len(counts) else 0)
        if len(counts) and (counts["node"].max() >= n or counts["metric"].max() >= metric_count):
            raise FormatError(p, f"thread slot {slot}: a count names node "
                              f"{int(counts['node'].max())} or metric "
                              f"{int(counts['metric'].max())} beyond {n} nodes / "
                              f"{metric_count} metrics")
        key = counts["node"].astype(np.int64) * max(metric_count, 1) + counts["metric"]
        size = n * metric_count
        samples = np.bincount(key, weights=counts["samples"].astype(np.float64),
                              minlength=size).astype(np.uint64).reshape(n, metric_count)
        values = np.bincount(key, weights=counts["value"], minlength=size).astype(
            np.float64).reshape(n, metric_count)
        trace = (np.concatenate(ttrace[slot]) if slot in ttrace
                 else np.zeros(0, dtype=TRACE_DTYPE))
        if len(trace) and trace["node"].max() >= n:
            raise FormatError(p, f"thread slot {slot}: a trace record names node "
                              f"{int(trace['node'].max())} of {n}")
        threads.append(ThreadProfile(slot, tinfo.get(slot, {"tid": -1}), nodes, samples,
                                     values, trace, tstats.get(slot, {})))
    for mod_kind, table, what in ((NodeKind.NATIVE, modules, "module"),
                                  (NodeKind.PYTHON, pycode, "Python code")):
        for t in threads:
            sel = t.nodes["kind"] == mod_kind
            if np.any(sel) and (t.nodes["module"][sel].max() >= len(table)
                                or t.nodes["module"][sel].min() < 0):
                raise FormatError(p, f"thread slot {t.slot}: a node names {what} "
                                  f"{int(t.nodes['module'][sel].max())} of {len(table)}")
    return ProcessProfile(p, info, modules, pycode, threads, metrics, complete, truncated)


def rank_from_environ(env: dict[str, str]) -> int | None:
    """The MPI rank a launcher gave the process, from the variables the common launchers set."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        v = env.get(var)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


def context_ids(node_id: int, rank: int | None, thread_index: int) -> tuple[Identifier, ...]:
    """The identifier tuple of a thread: (NODE host, [RANK r,] THREAD t)."""
    ids = [Identifier(IdKind.NODE, node_id, node_id, 1)]
    if rank is not None:
        ids.append(Identifier(IdKind.RANK, rank, rank, 0))
    ids.append(Identifier(IdKind.THREAD, thread_index, thread_index, 0))
    return tuple(ids)


def now_ns() -> int:
    return time.time_ns()
