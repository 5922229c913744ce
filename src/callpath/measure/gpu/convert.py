"""From what callpath's CUPTI library recorded (``gpu-<pid>.raw``) to a GPU companion file.

The library writes tagged records (``cupti_inject.c``): API calls with their calling context
(native return addresses, innermost first, and Python frames as code-object keys and lines),
code-object descriptions, activity records (kernels, copies, memsets, synchronizations),
the process's ``/proc/self/maps`` at exit and a few text notes. Each distinct calling context
and kernel name is written once (``R_STACK``, ``R_NAME``) and named by number in the launches
(``R_LAUNCH``) and kernel records (``R_KERNEL_N``) that follow; a library whose table of them
is full writes the rest whole (``R_API``, ``R_KERNEL``), and both forms are read here.

Here the calling contexts become one calling context tree per launching thread (NATIVE nodes
at link-time addresses of their load modules, PYTHON nodes at code locations, as the samplers
record them), and the activity records :data:`~callpath.formats.measdir_gpu.GPUOP_DTYPE`
operations naming the node of the API call with the same correlation id. The result is
written as
``gpu-<pid>-<gen>.cpm`` (:mod:`callpath.formats.measdir_gpu`) and the raw file removed.

Native paths are cut at the driver: the frames inside this library, libcupti and libcuda are
dropped, so the innermost frame is the runtime's (or the program's) call into the driver, as
hpcprof shows ``cudaLaunchKernel`` above ``<gpu kernel>``. A thread that holds the GIL of a
Python interpreter gets its Python frames as its path. With ``--native``
(``CALLPATH_GPU_NATIVE=1``) its native frames were recorded too, and the two are merged as
``run --native`` merges a sample's (``native_merge.merge_paths``, then ``readable_path``): each
activation of CPython's evaluation loop among the native frames is replaced by the Python
frames it ran (the library marks where each activation begins), so the launch sits under the
Python line that called into the library, the library's own frames (PyTorch's operator
dispatch, cuBLAS) between them.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.formats import measdir as md
from callpath.formats import measdir_gpu as mdg
from callpath.measure.elfinfo import ElfInfo
from callpath.model import gpu_names as gpu
from callpath.model.contexts import Identifier, IdKind

(R_API, R_CODE, R_KERNEL, R_MEMCPY, R_MEMSET, R_SYNC, R_MAPS, R_INFO, R_CUBIN, R_MEMORY,
 R_API_END, R_CORR, R_STACK, R_LAUNCH, R_NAME, R_KERNEL_N) = range(1, 17)
CALL_ALLOC, CALL_FREE = 2, 3  # the library's kinds of an allocating or freeing API call
_HEAD = struct.Struct("<II")
_API = struct.Struct("<4Q")
_CODE = struct.Struct("<QIII")
_OPS = {R_KERNEL: gpu.OP_KERNEL, R_MEMCPY: gpu.OP_MEMCPY, R_MEMSET: gpu.OP_MEMSET,
        R_SYNC: gpu.OP_SYNC}
CUPTI_ERROR_MULTIPLE_SUBSCRIBERS = 39  # CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
#: modules whose frames are the measurement's or the driver's, not the program's
DRIVER_MODULES = ("libcallpath_cupti", "libcupti.so", "libcuda.so")


@dataclass
class Raw:
    """The decoded records of one raw file.

    A training loop launches from the same few hundred places millions of times, so the
    launches' calling contexts are kept as indices into the distinct ones (``stacks``, each
    decoded once) and the launches and operations as arrays, in record order."""

    pid: int
    # API calls: correlation id, thread, the call (its domain, 1 driver or 2 runtime, | its
    # callback id << 8), time, index in ``stacks``
    api_corr: npt.NDArray[np.uint64] = field(default_factory=lambda: _u64(0))
    api_tid: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    api_kind: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    api_time: npt.NDArray[np.uint64] = field(default_factory=lambda: _u64(0))
    api_stack: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    #: distinct calling contexts: native return addresses (innermost first) and Python frames
    #: (code-object key, line | PY_ENTRY)
    stacks: list[tuple[list[int], list[tuple[int, int]]]] = field(default_factory=list)
    codes: dict[int, tuple[str, str, int]] = field(default_factory=dict)
    # activity records: tag, the record's words (kernels 10, the others 7 then zeros) and
    # the kernel's index in ``names`` (-1 for the others)
    op_tag: npt.NDArray[np.uint32] = field(default_factory=lambda: np.zeros(0, np.uint32))
    op_words: npt.NDArray[np.uint64] = field(
        default_factory=lambda: np.zeros((0, 10), np.uint64))
    op_name: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    names: list[str] = field(default_factory=list)
    maps: str = ""
    notes: list[str] = field(default_factory=list)
    cubins: list[tuple[int, int, int]] = field(default_factory=list)  # (module id, hash, size)
    # allocations and frees: (correlation, API call's end, CALL_ALLOC or CALL_FREE), and
    # CUPTI's memory records (correlation, time, bytes, device | context << 32, stream,
    # memory kind | operation << 32)
    call_ends: list[tuple[int, int, int]] = field(default_factory=list)
    memory: list[tuple[int, ...]] = field(default_factory=list)
    # the driver's allocating or freeing call inside a recorded runtime one: its correlation
    # id -> the runtime call's
    driver_corr: dict[int, int] = field(default_factory=dict)
    truncated: bool = False

    @property
    def apis(self) -> list[tuple[int, int, int, int, list[int], list[tuple[int, int]]]]:
        """Each API call as (correlation, tid, kind, time, native pcs, Python frames)."""
        return [(c, t, k, tm, list(self.stacks[s][0]), list(self.stacks[s][1]))
                for c, t, k, tm, s in zip(self.api_corr.tolist(), self.api_tid.tolist(),
                                          self.api_kind.tolist(), self.api_time.tolist(),
                                          self.api_stack.tolist(), strict=True)]


def _u64(n: int) -> npt.NDArray[np.uint64]:
    return np.zeros(n, np.uint64)


def _words(buf: npt.NDArray[np.uint8], positions: npt.ArrayLike, nwords: int
           ) -> npt.NDArray[np.uint64]:
    """The ``nwords`` little-endian 64-bit words at each byte position of ``buf`` (records
    are not aligned), gathered in blocks so that the index stays small."""
    pos = np.asarray(positions, dtype=np.int64)
    out = np.empty((len(pos), nwords), np.uint64)
    offsets = np.arange(8 * nwords, dtype=np.int64)
    for lo in range(0, len(pos), 1 << 16):
        chunk = buf[pos[lo:lo + (1 << 16), None] + offsets]
        out[lo:lo + len(chunk)] = chunk.view("<u8").reshape(len(chunk), nwords)
    return out


def read_raw(path: Path, *, notes_only: bool = False) -> Raw:
    """Decode a raw file; a record cut off by a killed process ends it quietly.
    ``notes_only``: the text notes only (what ``summary_notes`` needs), skipping the rest.

    One pass over the records' headers keeps the positions of the fixed-size ones (API
    calls, activity records) and the distinct calling contexts (by their bytes); their
    fields are then read as arrays."""
    pid = int(path.stem.split("-")[1]) if path.stem.count("-") >= 1 else 0
    raw = Raw(pid)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data: mmap.mmap | bytes = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) \
            if size else b""
    try:
        _scan(raw, data, notes_only)
    finally:
        if isinstance(data, mmap.mmap):
            with contextlib.suppress(BufferError):  # an array still on it: left to the GC
                data.close()
    return raw


def _record_table(data: mmap.mmap | bytes) -> tuple[npt.NDArray[np.int64], int]:
    """(tag, payload offset, payload length) of each whole record, and the offset after the
    last one: by ``_callpath_records`` where it is built, else :func:`_walk_records`."""
    try:
        from callpath.measure.gpu import _callpath_records
    except ImportError:
        return _walk_records(data)
    table, pos = _callpath_records.scan(data)
    return np.frombuffer(table, dtype=np.int64).reshape(-1, 3), int(pos)


def _walk_records(data: mmap.mmap | bytes) -> tuple[npt.NDArray[np.int64], int]:
    """:func:`_record_table` in Python."""
    rows: list[int] = []
    head = _HEAD.unpack_from
    pos, end = 0, len(data)
    while pos + 8 <= end:
        tag, n = head(data, pos)
        if pos + 8 + n > end:
            break
        rows += (tag, pos + 8, n)
        pos += 8 + n
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3), pos


def _scan(raw: Raw, data: mmap.mmap | bytes, notes_only: bool) -> None:
    """Fill ``raw`` from the records: the launches and activity records as arrays, the
    others (few: definitions, notes, the load map ...) one by one, in file order."""
    table, end = _record_table(data)
    raw.truncated = end < len(data)
    tags, at, size = table[:, 0], table[:, 1], table[:, 2]
    if notes_only:
        for i in np.flatnonzero(tags == R_INFO).tolist():
            raw.notes.append(data[at[i]:at[i] + size[i]].decode(errors="replace"))
        return
    launch = ((tags == R_LAUNCH) & (size >= 32)) | ((tags == R_API) & (size >= _API.size))
    kernel = ((tags == R_KERNEL_N) & (size >= 88)) | ((tags == R_KERNEL) & (size >= 80))
    activity = kernel | (np.isin(tags, (R_MEMCPY, R_MEMSET, R_SYNC)) & (size >= 56))
    # the library's numbers of contexts and kernel names -> their indices here
    stack_of: dict[bytes, int] = {}
    name_of: dict[bytes, int] = {}
    stack_defs: list[tuple[int, int, int]] = []  # (the library's number, record, index)
    name_defs: list[tuple[int, int, int]] = []
    whole_stack: dict[int, int] = {}  # record -> context, for launches written whole
    whole_name: dict[int, int] = {}

    def intern(table: dict[bytes, int], key: bytes) -> int:
        got = table.get(key)
        if got is None:
            got = table[key] = len(table)
        return got

    rare = ~((tags == R_LAUNCH) | (tags == R_KERNEL_N) | (activity & (tags != R_KERNEL)))
    for i in np.flatnonzero(rare).tolist():
        tag, b, n = int(tags[i]), int(at[i]), int(size[i])
        end_i = b + n
        if tag == R_API:
            if n >= _API.size:
                whole_stack[i] = intern(stack_of, data[b + 24:end_i])  # counts and frames
        elif tag == R_KERNEL:
            if n >= 80:
                whole_name[i] = intern(name_of, data[b + 80:end_i])
        elif tag == R_STACK:
            if n >= 16:
                stack_defs.append((struct.unpack_from("<Q", data, b)[0], i,
                                   intern(stack_of, data[b + 8:end_i])))
        elif tag == R_NAME:
            if n >= 8:
                name_defs.append((struct.unpack_from("<Q", data, b)[0], i,
                                  intern(name_of, data[b + 8:end_i])))
        elif tag == R_CODE:
            if n >= _CODE.size:
                key, first, flen, nlen = _CODE.unpack_from(data, b)
                c = b + _CODE.size
                raw.codes[key] = (data[c:c + flen].decode(errors="replace"),
                                  data[c + flen:c + flen + nlen].decode(errors="replace"),
                                  first)
        elif tag == R_MAPS:
            raw.maps = data[b:end_i].decode(errors="replace")
        elif tag == R_INFO:
            raw.notes.append(data[b:end_i].decode(errors="replace"))
        elif tag == R_API_END and n >= 24:
            corr, t_end, what = struct.unpack_from("<3Q", data, b)
            raw.call_ends.append((corr, t_end, what))
        elif tag == R_CORR and n >= 16:
            driver, runtime = struct.unpack_from("<2Q", data, b)
            raw.driver_corr[driver] = runtime
        elif tag == R_MEMORY and n >= 48:
            raw.memory.append(struct.unpack_from("<6Q", data, b))
        elif tag == R_CUBIN and n >= 24:
            mid, h, csize = struct.unpack_from("<3Q", data, b)
            raw.cubins.append((mid, h, csize))
    if not (launch.any() or activity.any()):
        return
    buf = np.frombuffer(data, dtype=np.uint8)
    rows = np.flatnonzero(launch)
    if len(rows):
        by_id = (tags[rows] == R_LAUNCH)
        stack = np.full(len(rows), -1, dtype=np.int64)
        stack[by_id] = _numbered(_words(buf, at[rows[by_id]] + 24, 1)[:, 0], rows[by_id],
                                 stack_defs)
        stack[~by_id] = [whole_stack[i] for i in rows[~by_id].tolist()]
        rows, stack = rows[stack >= 0], stack[stack >= 0]  # a number never defined: left out
        w = _words(buf, at[rows], 3)
        raw.api_corr, raw.api_time = w[:, 0], w[:, 2]
        raw.api_tid = (w[:, 1] & np.uint64(0xFFFFFFFF)).astype(np.int64)
        raw.api_kind = ((w[:, 1] >> np.uint64(32)) & np.uint64(0xFFFFFFFF)).astype(np.int64)
        raw.api_stack = stack
        raw.stacks = [_stack(key) for key in stack_of]
    rows = np.flatnonzero(activity)
    if len(rows):
        is_kernel = kernel[rows]
        name = np.full(len(rows), -1, dtype=np.int64)
        by_id = is_kernel & (tags[rows] == R_KERNEL_N)
        name[by_id] = _numbered(_words(buf, at[rows[by_id]] + 80, 1)[:, 0], rows[by_id],
                                name_defs)
        whole = is_kernel & ~by_id
        name[whole] = [whole_name[i] for i in rows[whole].tolist()]
        keep = ~is_kernel | (name >= 0)
        rows, is_kernel, name = rows[keep], is_kernel[keep], name[keep]
        raw.op_tag = np.where(is_kernel, R_KERNEL, tags[rows]).astype(np.uint32)
        raw.op_words = np.zeros((len(rows), 10), np.uint64)
        raw.op_words[:, :7] = _words(buf, at[rows], 7)
        raw.op_words[is_kernel, 7:] = _words(buf, at[rows[is_kernel]] + 56, 3)
        raw.op_name = name
        raw.names = [k.decode(errors="replace") for k in name_of]
    del buf


def _numbered(ids: npt.NDArray[np.uint64], rows: npt.NDArray[np.int64],
              defined: list[tuple[int, int, int]]) -> npt.NDArray[np.int64]:
    """The index of each of the library's numbers used at each record, as the last definition
    of that number before the record gives it (-1 where there is none). ``defined``: (number,
    record, index) of each definition, in record order. (A process writes each number once;
    files written one after the other reuse them.)"""
    out = np.full(len(ids), -1, dtype=np.int64)
    if not len(ids) or not defined:
        return out
    d = np.array(defined, dtype=np.int64).reshape(-1, 3)
    d = d[np.lexsort((d[:, 1], d[:, 0]))]  # by number, then record
    span = int(max(int(rows.max()), int(d[:, 1].max()))) + 1
    known = d[:, 0].astype(np.uint64)
    wanted = ids.astype(np.uint64)
    key_def = d[:, 0] * span + d[:, 1]
    ok = wanted <= np.uint64(int(d[:, 0].max()))
    key = np.where(ok, wanted.astype(np.int64) * span + rows, 0)
    j = np.searchsorted(key_def, key, side="right") - 1
    hit = ok & (j >= 0) & (known[np.maximum(j, 0)] == wanted)
    out[hit] = d[j[hit], 2]
    return out


def _stack(key: bytes) -> tuple[list[int], list[tuple[int, int]]]:
    """(native pcs, Python frames) of an API record's frame counts and frames; frames the
    counts promise beyond the record's end are left out."""
    (counts,) = struct.unpack_from("<Q", key, 0)
    nnat = min(counts & 0xFFFFFFFF, (len(key) - 8) // 8)
    npy = min(counts >> 32, (len(key) - 8 - 8 * nnat) // 16)
    pcs = list(struct.unpack_from(f"<{nnat}Q", key, 8))
    flat = struct.unpack_from(f"<{2 * npy}Q", key, 8 + 8 * nnat)
    return pcs, list(zip(flat[0::2], flat[1::2], strict=True))


@dataclass
class _Map:
    start: int
    end: int
    offset: int
    path: str


def parse_maps(text: str) -> list[_Map]:
    """Executable file mappings of ``/proc/PID/maps``, by start address."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
            continue
        a, b = (int(x, 16) for x in parts[0].split("-"))
        out.append(_Map(a, b, int(parts[2], 16), parts[5].strip()))
    out.sort(key=lambda m: m.start)
    return out


class _Tree:
    """One thread's calling context tree, interned (parent, kind, module, address)."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, int]] = [(-1, int(md.NodeKind.ROOT), -1, 0)]
        self.index: dict[tuple[int, int, int, int], int] = {}

    def child(self, parent: int, kind: int, module: int, address: int) -> int:
        key = (parent, kind, module, address)
        got = self.index.get(key)
        if got is None:
            got = self.index[key] = len(self.rows)
            self.rows.append(key)
        return got

    def nodes(self) -> npt.NDArray[Any]:
        a = np.array(self.rows, dtype=np.int64).reshape(-1, 4)
        return md.make_nodes(a[:, 0], a[:, 1], a[:, 2], a[:, 3].astype(np.uint64))


#: the library's MAX_NATIVE: a launch with this many native frames may have lost its outermost
MAX_NATIVE = 512
#: the library's mark of a Python frame that begins an activation of the evaluation loop
PY_ENTRY = 1 << 32


def convert(raw_path: Path, out_dir: Path, *, trace: bool, generation: int | None = None,
            keep_interpreter: bool = False) -> Path | None:
    """Write the companion file of one raw file (see the module docstring); returns its path,
    or None when the process recorded nothing. ``keep_interpreter``: as ``run --native
    --keep-interpreter-frames``, CPython's frames between Python frames stay in merged
    paths."""
    raw = read_raw(raw_path)
    if not len(raw.api_corr) and not len(raw.op_tag):
        return None
    maps = parse_maps(raw.maps)
    starts = [m.start for m in maps]
    modules: list[md.Module] = []
    module_of_map: dict[int, int] = {}
    code_index: dict[int, int] = {}
    pycode: list[md.PyCode] = []
    trees: dict[int, _Tree] = {}

    def module(mi: int) -> int | None:
        got = module_of_map.get(mi)
        if got is None:
            m = maps[mi]
            info = ElfInfo.get(m.path)
            vaddr = info.link_address(m.offset) if info.ok else None
            if vaddr is None:
                return None
            got = module_of_map[mi] = len(modules)
            modules.append(md.Module(got, m.path, m.start, m.end, m.offset, vaddr,
                                     info.build_id))
        return got

    def code(key: int) -> int:
        ci = code_index.get(key)
        if ci is None:
            f, name, first = raw.codes.get(key, ("<unknown>", "<unknown>", 0))
            ci = code_index[key] = len(pycode)
            pycode.append(md.PyCode(f, name, first))
        return ci

    def native(pcs: list[int]) -> list[tuple[int, int]]:
        """(module, link-time address) of the program's frames, innermost first."""
        kept: list[tuple[int, int]] = []
        program = False
        for pc in pcs:
            i = bisect.bisect_right(starts, pc) - 1
            inside = i >= 0 and pc < maps[i].end
            if not program and (not inside or any(
                    d in os.path.basename(maps[i].path) for d in DRIVER_MODULES)):
                continue  # still in the measurement's or the driver's frames
            program = True
            mi = module(i) if inside else None
            if mi is None:
                kept.append((-1, pc))
                continue
            m = modules[mi]
            kept.append((mi, pc - m.start + m.vaddr))
        if kept and kept[-1][0] < 0:
            kept.pop()  # glibc's backtrace ends with a null or garbage return address
        return kept

    # everything below works on the distinct calling contexts, in order of first use, so
    # that modules, code objects and tree nodes are numbered as a pass over the launches
    # in record order would number them
    natives = [native(pcs) for pcs, _frames in raw.stacks]
    merge = _LaunchMerge(modules, natives, keep_interpreter) if any(
        n and st[1] for n, st in zip(natives, raw.stacks, strict=True)) else None
    if merge is not None and not merge.is_eval:
        # no frame of CPython's evaluation loop named in any native stack (a stripped
        # interpreter): nothing says where the Python frames belong, so Python paths, as
        # run --native falls back
        merge.save()
        merge = None

    def path(s: int) -> list[tuple[int, int, int]]:
        """The tree path, root first, of distinct context ``s``: (kind, module, address)."""
        (pcs, frames), kept = raw.stacks[s], natives[s]
        if frames and kept and merge is not None:
            stack = tuple((code(key), word & 0xFFFFFFFF, bool(word & PY_ENTRY))
                          for key, word in frames)
            return [k[:3] for k in merge.path(kept, stack, complete=len(pcs) < MAX_NATIVE)]
        if frames:
            return [(int(md.NodeKind.PYTHON), code(key), word & 0xFFFFFFFF)
                    for key, word in reversed(frames)]
        return [(int(md.NodeKind.NATIVE if mi >= 0 else md.NodeKind.UNKNOWN), mi, addr)
                for mi, addr in reversed(kept)]

    # threads numbered in order of their first launch
    slot_of_tid: dict[int, int] = {}
    api_slot = np.zeros(len(raw.api_corr), dtype=np.int64)
    api_node = np.zeros(len(raw.api_corr), dtype=np.int64)
    if len(raw.api_corr):
        tids, first_of_tid, tid_inv = np.unique(raw.api_tid, return_index=True,
                                                return_inverse=True)
        slot_of_uniq = np.empty(len(tids), dtype=np.int64)
        slot_of_uniq[np.argsort(first_of_tid, kind="stable")] = np.arange(len(tids))
        slot_of_tid = {int(t): int(sl) for t, sl in zip(tids, slot_of_uniq, strict=True)}
        api_slot = slot_of_uniq[tid_inv.reshape(-1)]
        # each (thread, context) pair once, in order of first use
        pair = api_slot * len(raw.stacks) + raw.api_stack
        pairs, first_of_pair, pair_inv = np.unique(pair, return_index=True,
                                                   return_inverse=True)
        node_of_pair = np.zeros(len(pairs), dtype=np.int64)
        paths: dict[int, list[tuple[int, int, int]]] = {}
        for j in np.argsort(first_of_pair, kind="stable").tolist():
            slot, s = divmod(int(pairs[j]), len(raw.stacks))
            tree = trees.setdefault(slot, _Tree())
            got = paths.get(s)
            if got is None:
                got = paths[s] = path(s)
            node = 0
            for kind, mod, addr in got:
                node = tree.child(node, kind, mod, addr)
            node_of_pair[j] = node
        api_node = node_of_pair[pair_inv.reshape(-1)]
    if merge is not None:
        merge.save()
    main_slot = slot_of_tid.get(raw.pid, 0)
    shift = clock_offset(raw.notes)
    launches = _ByCorrelation(raw.api_corr, api_slot, api_node, raw.api_time)
    op_slot, op_node = launches.find(raw.op_words[:, 0], main_slot)
    ops = _activity_ops(raw, op_node, shift)
    mem_slot, mem_ops = _memory_ops(raw, launches, main_slot, shift)
    all_slot = np.concatenate([op_slot, mem_slot])
    all_ops = np.concatenate([ops, mem_ops])
    for slot in np.unique(all_slot).tolist():
        trees.setdefault(int(slot), _Tree())
    names = raw.names
    if raw.pid and (generation is None):
        gens = sorted(int(p.stem.split("-")[2]) for p in out_dir.glob(f"process-{raw.pid}-*.cpm")
                      if p.stem.split("-")[2].isdigit())
        generation = gens[-1] if gens else 0
    name = f"gpu-{raw.pid}-{generation or 0}.cpm"
    node_id = md.host_id()
    exe = maps[0].path if maps else ""
    tid_of_slot = {s: t for t, s in slot_of_tid.items()}
    with md.ProcessWriter(out_dir, raw.pid, generation or 0, name=name) as w:
        w.process(pid=raw.pid, generation=generation or 0, exe=exe,
                  comm=os.path.basename(exe), rank=None, host=os.uname().nodename,
                  node_id=node_id, forked_from=None, gpu_trace=trace,
                  gpu_clock="monotonic" if shift is not None else "cupti",
                  gpu_notes=raw.notes, gpu_truncated=raw.truncated,
                  gpu_kernel_binaries=kernel_binaries(out_dir, raw.cubins, names))
        w.modules(modules)
        w.pycode(pycode)
        order = sorted(trees, key=lambda s: (tid_of_slot.get(s) != raw.pid, s))
        for idx, slot in enumerate(order):
            tid = tid_of_slot.get(slot, raw.pid)
            w.thread(slot, tid=tid, index=idx,
                     ids=[Identifier(int(IdKind.NODE), node_id, node_id, 1),
                          Identifier(int(IdKind.THREAD), idx, idx)])
            w.nodes(slot, trees[slot].nodes())
            mine = all_ops[all_slot == slot]
            if len(mine):
                mdg.write_ops(w, slot, mine)
        mdg.write_names(w, names)
    return out_dir / name


class _ByCorrelation:
    """The launching API calls by correlation id (the last record of an id wins)."""

    def __init__(self, corr: npt.NDArray[np.uint64], slot: npt.NDArray[np.int64],
                 node: npt.NDArray[np.int64], time: npt.NDArray[np.uint64]) -> None:
        order = np.argsort(corr, kind="stable")
        c = corr[order]
        last = np.ones(len(c), dtype=bool)
        last[:-1] = c[1:] != c[:-1]
        keep = order[last]
        self.corr, self.slot, self.node, self.time = c[last], slot[keep], node[keep], time[keep]

    def index(self, corr: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.int64],
                                                             npt.NDArray[np.bool_]]:
        """Each id's index in the sorted arrays, and whether a launch has it."""
        corr = np.asarray(corr, dtype=np.uint64)
        if not len(self.corr):
            return np.zeros(len(corr), dtype=np.int64), np.zeros(len(corr), dtype=bool)
        i = np.minimum(np.searchsorted(self.corr, corr), len(self.corr) - 1)
        return i, self.corr[i] == corr

    def find(self, corr: npt.NDArray[np.uint64], main_slot: int
             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(thread slot, node) of each id's launch; the main thread's root without one."""
        i, hit = self.index(corr)
        if not len(self.corr):
            return np.full(len(corr), main_slot, dtype=np.int64), np.zeros(len(corr), np.int64)
        return np.where(hit, self.slot[i], main_slot), np.where(hit, self.node[i], 0)


def _on_monotonic(t: npt.NDArray[np.uint64], shift: int | None) -> npt.NDArray[np.uint64]:
    """CUPTI timestamps on CLOCK_MONOTONIC (unchanged without a clock note)."""
    if shift is None:
        return t
    out: npt.NDArray[np.uint64] = np.maximum(t.astype(np.int64) - np.int64(shift),
                                             0).astype(np.uint64)
    return out


def _activity_ops(raw: Raw, node: npt.NDArray[np.int64], shift: int | None
                  ) -> npt.NDArray[Any]:
    """GPUOP records of the kernels, copies, memsets and synchronizations (record order)."""
    w = raw.op_words
    out = np.zeros(len(w), dtype=mdg.GPUOP_DTYPE)
    if not len(w):
        return out
    kernel = raw.op_tag == R_KERNEL
    low = np.uint64(0xFFFFFFFF)
    out["start"] = _on_monotonic(w[:, 1], shift)
    out["end"] = _on_monotonic(w[:, 2], shift)
    out["bytes"] = np.where(kernel, 0, w[:, 5])
    out["lmem"] = np.where(kernel, w[:, 9], 0)
    out["node"] = node
    out["device"] = w[:, 3] & low
    out["context"] = w[:, 3] >> np.uint64(32)
    out["stream"] = w[:, 4] & low
    out["name"] = np.where(kernel, raw.op_name, mdg.NO_NAME)
    out["grid"] = np.where(kernel, w[:, 5], 0)
    out["block"] = np.where(kernel, w[:, 6], 0)
    out["regs"] = np.where(kernel, w[:, 7], 0)
    out["smem_static"] = np.where(kernel, w[:, 8] & low, 0)
    out["smem_dynamic"] = np.where(kernel, w[:, 8] >> np.uint64(32), 0)
    out["correlation"] = w[:, 0] & low
    lut = np.zeros(max(_OPS) + 1, dtype=np.uint8)
    for tag, kind in _OPS.items():
        lut[tag] = kind
    out["kind"] = lut[raw.op_tag]
    out["sub"] = np.where(kernel, 0, w[:, 6] & np.uint64(0xFF))
    return out


def _memory_ops(raw: Raw, launches: _ByCorrelation, main_slot: int, shift: int | None
                ) -> tuple[npt.NDArray[np.int64], npt.NDArray[Any]]:
    """(thread slot, GPUOP record) of each allocation and free: the API call's time, from its
    ENTER to its EXIT (what the program waits; CUPTI's memory record has one timestamp), the
    bytes, memory kind, device, context and stream of CUPTI's memory record with the same
    correlation id (an unknown kind and no bytes without one)."""
    slots: list[int] = []
    rows: list[tuple[int, ...]] = []
    if raw.call_ends:
        # by the recorded call's correlation id (the runtime's, where the record names the
        # driver call inside it)
        memory = {raw.driver_corr.get(int(m[0]), int(m[0])): m for m in raw.memory}
        corrs = np.array([c for c, _, _ in raw.call_ends], dtype=np.uint64)
        idx, hit = launches.index(corrs)
        for (corr, end, what), i, h in zip(raw.call_ends, idx.tolist(), hit.tolist(),
                                           strict=True):
            if not h:
                continue  # the call began before the library started
            start = int(launches.time[i])
            m = memory.get(int(corr))
            nbytes, dev_ctx, stream, kind = (m[2], m[3], m[4], m[5] & 0xFF) if m \
                else (0, 0, 0, 0)
            op = gpu.OP_FREE if what == CALL_FREE else gpu.OP_ALLOC
            slots.append(int(launches.slot[i]))
            rows.append((start, max(end, start), nbytes, 0,
                         int(launches.node[i]), dev_ctx & 0xFFFFFFFF, dev_ctx >> 32,
                         stream & 0xFFFFFFFF, mdg.NO_NAME, 0, 0, 0, 0, 0, corr & 0xFFFFFFFF,
                         op, kind, 0))
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=mdg.GPUOP_DTYPE)
    out = ops_array(rows)
    out["start"] = _on_monotonic(out["start"], shift)
    out["end"] = _on_monotonic(out["end"], shift)
    return np.asarray(slots, dtype=np.int64), out


class _LaunchMerge:
    """One path through Python and native code per launch recorded with both (``--native``):
    ``run --native``'s merge applied to the library's backtrace and Python frames."""

    def __init__(self, modules: list[md.Module], natives: list[list[tuple[int, int]]],
                 keep_interpreter: bool) -> None:
        from callpath.measure.python import native_merge as nm

        self.nm = nm
        self.keep = keep_interpreter
        self.cache = nm.forward_cache()
        self.elves: list[ElfInfo | None] = [ElfInfo.get(m.path) for m in modules]
        # the evaluation loop's frames, per distinct (module, return address): looked up at
        # the call instruction (the address before the return address), as the merge does
        distinct = sorted({f for n in natives for f in n if f[0] >= 0})
        mod = np.array([m for m, _ in distinct], dtype=np.int64)
        addr = np.array([a - 1 for _, a in distinct], dtype=np.uint64)
        is_eval, _gil = nm.eval_ranges(mod, addr, self.elves, self.cache)
        self.is_eval = {f for f, e in zip(distinct, is_eval.tolist(), strict=True) if e}
        self.interpreter = frozenset(m for m, _ in self.is_eval)
        self.forwards = nm.Forwarding(self.elves, self.cache)
        self.classes = nm.PathClasses(self.interpreter, frozenset(), frozenset())
        # the caller merges each distinct context once; contexts that differ only in the
        # frames cut (the library's, the driver's) are merged once too
        self.memo: dict[tuple[Any, ...], list[tuple[int, int, int, int]]] = {}

    def path(self, kept: list[tuple[int, int]], stack: tuple[tuple[int, int, bool], ...],
             complete: bool) -> list[tuple[int, int, int, int]]:
        """The merged path, root first, of a launch's native frames (``kept``, innermost
        first) and Python frames (code index, line, entry; innermost first)."""
        memo_key = (tuple(kept), stack, complete)
        got = self.memo.get(memo_key)
        if got is not None:
            return got
        from callpath.measure.remote_native import groups_of

        native = int(md.NodeKind.NATIVE)
        unknown = int(md.NodeKind.UNKNOWN)
        keys = [(native if m >= 0 else unknown, m, a, 0) for m, a in kept]
        evl = [f in self.is_eval for f in kept]
        path, _state = self.nm.merge_paths(keys, evl, complete, groups_of(stack))
        got = self.memo[memo_key] = self.nm.readable_path(
            path, self.interpreter, frozenset(), frozenset(), self.keep, self.forwards,
            self.forwards.through_pointer, self.classes)
        return got

    def save(self) -> None:
        if self.cache is not None:
            self.cache.save()


def kernel_binaries(out_dir: Path, cubins: list[tuple[int, int, int]], names: list[str]
                    ) -> list[list[Any]]:
    """``[name index, gpubins/FILE, address]`` of each kernel found among the functions of a
    GPU binary the process loaded (a cubin, or a fatbin holding cubins), at the address that
    ``callpath struct`` and hpcrun give it: its offset in the file."""
    from callpath.errors import CallpathError
    from callpath.structure.cubin import cubins_of, functions_of

    where: dict[str, tuple[str, int]] = {}
    for h in dict.fromkeys(h for _, h, _ in cubins):
        rel = f"gpubins/{h:016x}.gpubin"
        try:
            data = (out_dir / rel).read_bytes()
            for cb in cubins_of(data, path=rel)[0]:
                for fn in functions_of(cb):
                    where.setdefault(fn.name, (rel, fn.address))
        except (OSError, CallpathError):
            continue
    return [[i, *where[n]] for i, n in enumerate(names) if n in where]


def clock_offset(notes: list[str]) -> int | None:
    """CUPTI's clock minus CLOCK_MONOTONIC (ns), from the library's ``clock`` notes (the
    mean of its readings at start and end); None where it wrote none."""
    offs = []
    for note in notes:
        if note.startswith("clock "):
            f = dict(w.split("=", 1) for w in note.split()[2:] if "=" in w)
            try:
                offs.append(int(f["cupti"]) - int(f["mono"]))
            except (KeyError, ValueError):
                continue
    return sum(offs) // len(offs) if offs else None


def ops_array(rows: list[tuple[Any, ...]]) -> npt.NDArray[Any]:
    """GPUOP records from rows holding the fields in :data:`GPUOP_DTYPE`'s order."""
    cols = np.array(rows, dtype=np.uint64).reshape(len(rows), -1)
    out = np.zeros(len(rows), dtype=mdg.GPUOP_DTYPE)
    for j, f in enumerate(mdg.GPUOP_DTYPE.names or ()):
        out[f] = cols[:, j]
    return out


def summary_notes(raw_dir: Path) -> list[str]:
    """Notes of the raw files in ``raw_dir`` that a user must hear about (another CUPTI
    subscriber, activity kinds that could not be enabled), one line each."""
    out = []
    for p in sorted(raw_dir.glob("gpu-*.raw")):
        for note in read_raw(p, notes_only=True).notes:
            pid = p.stem.split("-")[1]
            words = note.split(" ", 2)
            if note.startswith("subscribe-failed") and len(words) > 1 and words[1] == \
                    str(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS):
                out.append(f"process {pid}: CUPTI refused a second subscriber: another tool "
                           "(torch.profiler, Nsight Systems, another callpath) measures this "
                           "process's GPU; its GPU operations are not measured")
            elif note.startswith("subscribe-failed"):
                out.append(f"process {pid}: CUPTI could not start (error "
                           f"{' '.join(words[1:])}); its GPU operations are not measured")
            elif note.startswith("activity-failed"):
                out.append(f"process {pid}: CUPTI could not enable activity "
                           f"kind {note.split()[1]} ({note.split(' ', 3)[-1]})")
    return out


def convert_all(out_dir: Path, *, trace: bool, keep_interpreter: bool = False) -> list[Path]:
    """Convert every raw file of a measurement directory (then removed)."""
    made = []
    for p in sorted(out_dir.glob("gpu-*.raw")):
        got = convert(p, out_dir, trace=trace, keep_interpreter=keep_interpreter)
        if got is not None:
            made.append(got)
        p.unlink()
    return made
