"""From what callpath's CUPTI library recorded (``gpu-<pid>.raw``) to a GPU companion file.

The library writes tagged records (``cupti_inject.c``): API calls with their calling context
(native return addresses, innermost first, and Python frames as code-object keys and lines),
code-object descriptions, activity records (kernels, copies, memsets, synchronizations),
the process's ``/proc/self/maps`` at exit and a few text notes. Here the calling contexts
become one calling context tree per launching thread (NATIVE nodes at link-time addresses
of their load modules, PYTHON nodes at code locations, as the samplers record them), and the
activity records :data:`~callpath.formats.measdir_gpu.GPUOP_DTYPE` operations naming the node
of the API call with the same correlation id. The result is written as
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
 R_API_END, R_CORR) = range(1, 13)
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
    """The decoded records of one raw file."""

    pid: int
    apis: list[tuple[int, int, int, int, list[int], list[tuple[int, int]]]] = field(
        default_factory=list)  # (correlation, tid, domain<<16|cbid, time, pcs, py frames)
    codes: dict[int, tuple[str, str, int]] = field(default_factory=dict)
    ops: list[tuple[int, list[int], str]] = field(default_factory=list)  # (record tag, words, name)
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


def read_raw(path: Path) -> Raw:
    """Decode a raw file; a record cut off by a killed process ends it quietly."""
    data = path.read_bytes()
    pid = int(path.stem.split("-")[1]) if path.stem.count("-") >= 1 else 0
    raw = Raw(pid)
    pos = 0
    while pos + _HEAD.size <= len(data):
        tag, n = _HEAD.unpack_from(data, pos)
        body = data[pos + _HEAD.size:pos + _HEAD.size + n]
        if len(body) < n:
            raw.truncated = True
            break
        pos += _HEAD.size + n
        if tag == R_API and n >= _API.size:
            corr, who, t, counts = _API.unpack_from(body, 0)
            nnat, npy = counts & 0xFFFFFFFF, counts >> 32
            pcs = list(struct.unpack_from(f"<{nnat}Q", body, _API.size))
            flat = struct.unpack_from(f"<{2 * npy}Q", body, _API.size + 8 * nnat)
            frames = list(zip(flat[0::2], flat[1::2], strict=True))
            raw.apis.append((corr, who & 0xFFFFFFFF, (who >> 32) & 0xFFFFFFFF, t, pcs, frames))
        elif tag == R_CODE and n >= _CODE.size:
            key, first, flen, nlen = _CODE.unpack_from(body, 0)
            f = body[_CODE.size:_CODE.size + flen].decode(errors="replace")
            name = body[_CODE.size + flen:_CODE.size + flen + nlen].decode(errors="replace")
            raw.codes[key] = (f, name, first)
        elif tag == R_KERNEL and n >= 80:
            raw.ops.append((tag, list(struct.unpack_from("<10Q", body, 0)),
                            body[80:].decode(errors="replace")))
        elif tag in (R_MEMCPY, R_MEMSET, R_SYNC) and n >= 56:
            raw.ops.append((tag, list(struct.unpack_from("<7Q", body, 0)), ""))
        elif tag == R_MAPS:
            raw.maps = body.decode(errors="replace")
        elif tag == R_INFO:
            raw.notes.append(body.decode(errors="replace"))
        elif tag == R_API_END and n >= 24:
            corr, end, what = struct.unpack_from("<3Q", body, 0)
            raw.call_ends.append((corr, end, what))
        elif tag == R_CORR and n >= 16:
            driver, runtime = struct.unpack_from("<2Q", body, 0)
            raw.driver_corr[driver] = runtime
        elif tag == R_MEMORY and n >= 48:
            raw.memory.append(struct.unpack_from("<6Q", body, 0))
        elif tag == R_CUBIN and n >= 24:
            mid, h, size = struct.unpack_from("<3Q", body, 0)
            raw.cubins.append((mid, h, size))
    if pos < len(data):
        raw.truncated = True
    return raw


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
    if not raw.apis and not raw.ops:
        return None
    maps = parse_maps(raw.maps)
    starts = [m.start for m in maps]
    modules: list[md.Module] = []
    module_of_map: dict[int, int] = {}
    code_index: dict[int, int] = {}
    pycode: list[md.PyCode] = []
    trees: dict[int, _Tree] = {}
    slot_of_tid: dict[int, int] = {}
    at: dict[int, tuple[int, int]] = {}  # correlation -> (slot, node)

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

    natives = [native(pcs) for *_, pcs, _frames in raw.apis]
    merge = _LaunchMerge(modules, natives, keep_interpreter) if any(
        n and a[5] for n, a in zip(natives, raw.apis, strict=True)) else None
    if merge is not None and not merge.is_eval:
        # no frame of CPython's evaluation loop named in any native stack (a stripped
        # interpreter): nothing says where the Python frames belong, so Python paths, as
        # run --native falls back
        merge.save()
        merge = None
    for (corr, tid, _api, _t, pcs, frames), kept in zip(raw.apis, natives, strict=True):
        slot = slot_of_tid.setdefault(tid, len(slot_of_tid))
        tree = trees.setdefault(slot, _Tree())
        node = 0
        if frames and kept and merge is not None:
            stack = tuple((code(key), word & 0xFFFFFFFF, bool(word & PY_ENTRY))
                          for key, word in frames)
            for k in merge.path(kept, stack, complete=len(pcs) < MAX_NATIVE):
                node = tree.child(node, k[0], k[1], k[2])
        elif frames:
            for key, word in reversed(frames):
                node = tree.child(node, int(md.NodeKind.PYTHON), code(key), word & 0xFFFFFFFF)
        else:
            for mi, addr in reversed(kept):
                kind = md.NodeKind.NATIVE if mi >= 0 else md.NodeKind.UNKNOWN
                node = tree.child(node, int(kind), mi, addr)
        at[int(corr)] = (slot, node)
    if merge is not None:
        merge.save()
    main_slot = slot_of_tid.get(raw.pid, 0)
    shift = clock_offset(raw.notes)
    names: list[str] = []
    name_index: dict[str, int] = {}
    per_slot: dict[int, list[tuple[Any, ...]]] = {}
    for tag, words, kname in raw.ops:
        slot, node = at.get(int(words[0]), (main_slot, 0))
        trees.setdefault(slot, _Tree())
        dev_ctx = words[3]
        if tag == R_KERNEL:
            ni = name_index.setdefault(kname, len(names))
            if ni == len(names):
                names.append(kname)
            row = (_on(words[1], shift), _on(words[2], shift), 0, words[9], node,
                   dev_ctx & 0xFFFFFFFF,
                   dev_ctx >> 32, words[4], ni, words[5], words[6], words[7],
                   words[8] & 0xFFFFFFFF, words[8] >> 32, words[0] & 0xFFFFFFFF,
                   _OPS[tag], 0, 0)
        else:
            row = (_on(words[1], shift), _on(words[2], shift), words[5], 0, node,
                   dev_ctx & 0xFFFFFFFF, dev_ctx >> 32,
                   words[4] & 0xFFFFFFFF, mdg.NO_NAME, 0, 0, 0, 0, 0, words[0] & 0xFFFFFFFF,
                   _OPS[tag], words[6] & 0xFF, 0)
        per_slot.setdefault(slot, []).append(row)
    for slot, mrow in _memory_ops(raw, at, main_slot, shift):
        trees.setdefault(slot, _Tree())
        per_slot.setdefault(slot, []).append(mrow)
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
            rows = per_slot.get(slot)
            if rows:
                mdg.write_ops(w, slot, ops_array(rows))
        mdg.write_names(w, names)
    return out_dir / name


def _memory_ops(raw: Raw, at: dict[int, tuple[int, int]], main_slot: int,
                shift: int | None) -> list[tuple[int, tuple[int, ...]]]:
    """(thread slot, GPUOP row) of each allocation and free: the API call's time, from its
    ENTER to its EXIT (what the program waits; CUPTI's memory record has one timestamp), the
    bytes, memory kind, device, context and stream of CUPTI's memory record with the same
    correlation id (an unknown kind and no bytes without one)."""
    if not raw.call_ends:
        return []
    enter = {int(a[0]): int(a[3]) for a in raw.apis}
    # by the recorded call's correlation id (the runtime's, where the record names the
    # driver call inside it)
    memory = {raw.driver_corr.get(int(m[0]), int(m[0])): m for m in raw.memory}
    out: list[tuple[int, tuple[int, ...]]] = []
    for corr, end, what in raw.call_ends:
        start = enter.get(int(corr))
        if start is None:
            continue  # the call began before the library started
        slot, node = at.get(int(corr), (main_slot, 0))
        m = memory.get(int(corr))
        nbytes, dev_ctx, stream, kind = (m[2], m[3], m[4], m[5] & 0xFF) if m else (0, 0, 0, 0)
        op = gpu.OP_FREE if what == CALL_FREE else gpu.OP_ALLOC
        out.append((slot, (_on(start, shift), _on(max(end, start), shift), nbytes, 0, node,
                           dev_ctx & 0xFFFFFFFF, dev_ctx >> 32, stream & 0xFFFFFFFF,
                           mdg.NO_NAME, 0, 0, 0, 0, 0, corr & 0xFFFFFFFF, op, kind, 0)))
    return out


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
        # a training loop launches from the same few hundred places: each merged once
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


def _on(t: int, shift: int | None) -> int:
    """A CUPTI timestamp on CLOCK_MONOTONIC (unchanged without a clock note)."""
    return t if shift is None else max(int(t) - shift, 0)


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
        for note in read_raw(p).notes:
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
