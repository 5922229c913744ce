"""GPU operations in a measurement directory (``callpath run -e gpu=nvidia``).

A process's GPU operations live in a *companion file* ``gpu-<pid>-<gen>.cpm`` beside its
``process-<pid>-<gen>.cpm``: the same chunk format (:mod:`callpath.formats.measdir`), written
after the program ends from what the CUPTI library recorded. Its threads are the threads that
launched GPU work, each with a calling context tree of the launching API calls (NATIVE and
PYTHON nodes, as in process files); two chunk tags are added (readers of process files skip
them):

- ``GPUOPS`` (11, per thread slot): :data:`GPUOP_DTYPE` records, one per kernel, memory copy,
  memset or synchronization, each naming the node of the API call that launched it;
- ``GPUNAMES`` (12, whole process): JSON list of kernel names (as CUPTI gives them, mangled),
  appended; a record's ``name`` indexes the concatenation.

Kept apart from the process file because the two are written by different writers (the CPU
sampler while the program runs, the GPU conversion after it), and so that a process file
stays readable by readers that know nothing of GPUs. ``callpath prof`` joins a companion to
its process by file name and its threads to the process's threads by tid.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.errors import FormatError
from callpath.formats import measdir as md

GPU_GLOB = "gpu-*.cpm"
TAG_GPUOPS = 11
TAG_GPUNAMES = 12
NO_NAME = 0xFFFFFFFF

#: one GPU operation (80 bytes). Times are CUPTI timestamps (ns). ``node`` is the launching
#: API call's node in the thread's tree; ``kind`` one of callpath.model.gpu_names.OP_*; ``sub`` the
#: copy kind (memcpy), memory kind (memset) or synchronization type (sync) as CUPTI numbers
#: them; ``grid`` blocks per launch, ``block`` threads per block, ``lmem`` local memory total.
GPUOP_DTYPE = np.dtype([
    ("start", "<u8"), ("end", "<u8"), ("bytes", "<u8"), ("lmem", "<u8"),
    ("node", "<u4"), ("device", "<u4"), ("context", "<u4"), ("stream", "<u4"),
    ("name", "<u4"), ("grid", "<u4"), ("block", "<u4"), ("regs", "<u4"),
    ("smem_static", "<u4"), ("smem_dynamic", "<u4"), ("correlation", "<u4"),
    ("kind", "u1"), ("sub", "u1"), ("reserved", "<u2")])


def companion_name(process_file: str) -> str:
    """``process-12-0.cpm`` -> ``gpu-12-0.cpm``."""
    return "gpu-" + process_file[len("process-"):] if process_file.startswith("process-") \
        else "gpu-" + process_file


def process_name(companion: str) -> str:
    """``gpu-12-0.cpm`` -> ``process-12-0.cpm``."""
    return "process-" + companion[len("gpu-"):]


def write_ops(w: md.ProcessWriter, slot: int, ops: npt.NDArray[Any]) -> None:
    w.raw_chunk(TAG_GPUOPS, np.ascontiguousarray(ops, dtype=GPUOP_DTYPE).tobytes(), slot)


def write_names(w: md.ProcessWriter, names: list[str]) -> None:
    w.raw_chunk(TAG_GPUNAMES, json.dumps(names, separators=(",", ":")).encode())


@dataclass
class GpuFile:
    """A companion file: its process-file part (threads, trees, modules, Python code) and the
    GPU operations of each thread slot."""

    process: md.ProcessProfile
    ops: dict[int, npt.NDArray[Any]] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)

    def binaries(self) -> dict[int, tuple[str, int]]:
        """Kernel name index -> (GPU binary's path, the kernel's address in it), from
        PROCESS ``gpu_kernel_binaries`` (paths relative to the measurement directory)."""
        out: dict[int, tuple[str, int]] = {}
        for row in self.process.info.get("gpu_kernel_binaries") or []:
            try:
                i, rel, addr = int(row[0]), str(row[1]), int(row[2])
            except (TypeError, ValueError, IndexError):
                continue
            out[i] = (str(self.process.path.parent / rel), addr)
        return out


def read(path: str | os.PathLike[str]) -> GpuFile:
    """Read a companion file (raises :class:`FormatError` naming the file and what is
    wrong)."""
    p = Path(path)
    proc = md.read_process(p)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise FormatError(p, f"cannot read ({e.strerror})") from None
    ops: dict[int, list[npt.NDArray[Any]]] = {}
    names: list[str] = []
    for tag, slot, payload in md.iter_chunks(p, data):
        if tag == TAG_GPUOPS:
            if len(payload) % GPUOP_DTYPE.itemsize:
                raise FormatError(p, f"GPUOPS chunk of {len(payload)} bytes is not a "
                                  f"multiple of {GPUOP_DTYPE.itemsize}")
            ops.setdefault(slot, []).append(np.frombuffer(payload, GPUOP_DTYPE).copy())
        elif tag == TAG_GPUNAMES:
            try:
                got = json.loads(bytes(payload))
            except (UnicodeDecodeError, ValueError) as e:
                raise FormatError(p, f"GPUNAMES chunk: expected a JSON list ({e})") from None
            if not isinstance(got, list):
                raise FormatError(p, "GPUNAMES chunk: expected a JSON list")
            names += [str(x) for x in got]
    out = GpuFile(proc, {s: np.concatenate(v) for s, v in ops.items()}, names)
    for slot, arr in out.ops.items():
        th = next((t for t in proc.threads if t.slot == slot), None)
        n = len(th.nodes) if th is not None else 0
        bad = (arr["node"] >= n) | ((arr["name"] != NO_NAME) & (arr["name"] >= len(names)))
        if bad.any():
            raise FormatError(p, f"thread {slot}: a GPU operation names a node or kernel name "
                              "that does not exist")
    return out
