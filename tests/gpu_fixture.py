"""Raw files of callpath's CUPTI library made from CUPTI activity recorded with cupti-python.

``../shared/data/gpu/cupti-torch-h200.jsonl.gz`` holds every activity record of a PyTorch
program (kernels, copies, memsets, synchronizations, runtime and driver API calls) as NVIDIA's
``cupti-python`` delivered them on an H200. The library (``cupti_inject.c``) records the same
activity plus, for each launching API call, its calling context; the recording has none.
Here each API call record becomes the library's API record with a two-frame Python context:
the recording script's training-loop line, then a frame named after the API function
(``cudaLaunchKernel_v7000`` ...). Everything GPU-side (times, bytes, kernel names and
properties, streams, correlation ids) is the recorded data, byte for byte; only the CPU
context is made up, and says so by its file name ``<synthetic>``.
"""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path
from typing import Any

from callpath.measure.gpu import convert as cv

SCRIPT = "record_cupti.py"
LOOP_LINE = 23  # the `for i in range(20)` body of record_cupti.py


def load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with gzip.open(path, "rt") as f:
        meta = json.loads(next(f))["meta"]
        return meta, [json.loads(line) for line in f]


def _rec(tag: int, payload: bytes) -> bytes:
    return struct.pack("<II", tag, len(payload)) + payload


def _code(key: int, file: str, name: str, first: int) -> bytes:
    f, n = file.encode(), name.encode()
    return _rec(cv.R_CODE, struct.pack("<QIII", key, first, len(f), len(n)) + f + n)


def write_raw(meta: dict[str, Any], records: list[dict[str, Any]], out: Path,
              pid: int = 504) -> Path:
    """The raw file the library would have written for this activity (see module doc)."""
    rt = {v: k for k, v in meta["enums"]["runtime_api_trace_cbid"].items()}
    dr = {v: k for k, v in meta["enums"]["driver_api_trace_cbid"].items()}
    parts = [_code(1, SCRIPT, "<module>", 1)]
    api_keys: dict[str, int] = {}
    for r in records:
        if r["kind"] not in (4, 5):
            continue
        name = (rt if r["kind"] == 5 else dr).get(r["cbid"], f"cbid{r['cbid']}")
        key = api_keys.get(name)
        if key is None:
            key = api_keys[name] = 16 + len(api_keys)
            parts.append(_code(key, "<synthetic>", name, 0))
        who = r["thread_id"] & 0xFFFFFFFF | ((2 if r["kind"] == 5 else 1) << 32) \
            | ((r["cbid"] & 0xFFFF) << 40)
        parts.append(_rec(cv.R_API, struct.pack("<4Q", r["correlation_id"], who, r["start"],
                                                0 | (2 << 32))
                          + struct.pack("<4Q", key, 0, 1, LOOP_LINE)))
    for r in records:
        k = r["kind"]
        dev_ctx = r.get("device_id", 0) | (r.get("context_id", 0) << 32)
        if k in (3, 10):
            grid = r["grid_x"] * r["grid_y"] * r["grid_z"]
            block = r["block_x"] * r["block_y"] * r["block_z"]
            words = [r["correlation_id"], r["start"], r["end"], dev_ctx, r["stream_id"], grid,
                     block, r["registers_per_thread"],
                     r["static_shared_memory"] | (r["dynamic_shared_memory"] << 32),
                     r["local_memory_total"]]
            parts.append(_rec(cv.R_KERNEL, struct.pack("<10Q", *words) + r["name"].encode()))
        elif k == 1:
            parts.append(_rec(cv.R_MEMCPY, struct.pack(
                "<7Q", r["correlation_id"], r["start"], r["end"], dev_ctx, r["stream_id"],
                r["bytes"], r["copy_kind"])))
        elif k == 2:
            parts.append(_rec(cv.R_MEMSET, struct.pack(
                "<7Q", r["correlation_id"], r["start"], r["end"], dev_ctx, r["stream_id"],
                r["bytes"], r["memory_kind"])))
        elif k == 38:
            parts.append(_rec(cv.R_SYNC, struct.pack(
                "<7Q", r["correlation_id"], r["start"], r["end"], r["context_id"] << 32,
                r["stream_id"], 0, r["type"])))
    parts.append(_rec(cv.R_INFO, b"start cupti=130400 (made from cupti-python records)"))
    path = out / f"gpu-{pid}.raw"
    path.write_bytes(b"".join(parts))
    return path
