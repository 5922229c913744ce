"""A structure's arrays on disk as one flat binary file: the cache format that loads in
milliseconds.

Parsing hpcstruct XML costs a Python step per scope (libtorch_cpu.so's whole structure is a
617 MB file, about a minute to parse); a :class:`Structure` is already a handful of flat
arrays and a string table, so it is stored as those arrays' bytes, back to back, after a JSON
header that names each array's dtype, offset and length. Loading maps the file and makes each
array a view of the map (``np.frombuffer``): nothing is parsed but the header, nothing copied
but the integer columns stored narrower than their type (below).
``np.savez`` was tried first: its zip members and their ``.npy`` headers (parsed with
``ast.literal_eval``) cost ~4 ms per entry, 3.7 s for the ~900 Python sources of an
``import torch`` run; this format takes a fraction of a millisecond per entry. XML stays the
interchange format with HPCToolkit (``formats/hpcstruct.py``); this is the project's own cache.

Layout: ``CPSTRUCT`` (8 bytes), the header's length (u64 little-endian), the header (UTF-8
JSON: ``meta``, ``arrays`` as ``{name: [dtype, offset, count]}``, ``crc`` of the payload),
then the payload (each array 8-byte aligned; an integer array stored in a narrower type
than its own has that type as a fourth element of its layout entry, and is widened back on
load). Entries are written atomically (a temporary
file renamed into place) and checked on load (magic, sizes, CRC-32 of the payload, array
lengths consistent with each other, the caller's header fields): an entry that does not read
back whole is treated as absent, never as an error.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.structure.model import Structure

MAGIC = b"CPSTRUCT"
#: The structure's columns, in the order the model declares them.
ARRAYS = ("kind", "parent", "name", "link_name", "file", "line", "call_file", "call_line",
          "target", "range_ptr", "range_lo", "range_hi", "map_lo", "map_hi", "map_scope")
_PER_SCOPE = ARRAYS[:9]


def save(path: str | os.PathLike[str], s: Structure, meta: dict[str, Any],
         extra: dict[str, npt.NDArray[Any]] | None = None) -> bool:
    """Write ``s`` with the JSON-able ``meta`` and ``extra`` arrays to ``path`` atomically;
    False (and nothing left behind) where it cannot be written."""
    arrays: dict[str, npt.NDArray[Any]] = {"s." + k: getattr(s, k) for k in ARRAYS}
    arrays["strings"] = strings_to_array(s.strings)
    for k, v in (extra or {}).items():
        arrays["x." + k] = v
    head = dict(meta, path=s.path, build_id=s.build_id, has_calls=s.has_calls,
                n_strings=len(s.strings))
    return save_arrays(path, head, arrays)


def strings_to_array(strings: list[str]) -> npt.NDArray[np.uint8]:
    """Strings as one NUL-separated UTF-8 array (:func:`array_to_strings` reverses it)."""
    return np.frombuffer("\0".join(strings).encode("utf-8", "surrogatepass"), dtype=np.uint8)


def array_to_strings(a: npt.NDArray[Any], n: int) -> list[str]:
    return a.tobytes().decode("utf-8", "surrogatepass").split("\0") if n else []


def save_arrays(path: str | os.PathLike[str], meta: dict[str, Any],
                arrays: dict[str, npt.NDArray[Any]]) -> bool:
    """Write named arrays and a JSON-able header to ``path`` in this module's layout,
    atomically; False where it cannot be written."""
    p = Path(path)
    layout: dict[str, list[Any]] = {}
    parts: list[bytes] = []
    off = 0
    for k, v in arrays.items():
        a, wide = _narrow(np.ascontiguousarray(v))
        b = a.tobytes()
        layout[k] = [a.dtype.str, off, int(a.size)] + ([wide] if wide else [])
        pad = -len(b) % 8
        parts.append(b + b"\0" * pad)
        off += len(b) + pad
    payload = b"".join(parts)
    header = json.dumps({"meta": meta, "arrays": layout, "size": len(payload),
                         "crc": zlib.crc32(payload)}).encode("utf-8")
    header += b" " * (-(len(header) + 16) % 8)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(MAGIC + len(header).to_bytes(8, "little") + header)
            f.write(payload)
        os.replace(tmp, p)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    except BaseException:  # interrupted (a structure child told to stop): no file left
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return True


_NARROW = (np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.uint16), np.dtype(np.int16),
           np.dtype(np.uint32), np.dtype(np.int32))


def _narrow(a: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], str | None]:
    """An integer array in the smallest integer type that holds its values, and its own type
    (None when it is kept as it is). Addresses of libraries under 4 GiB, line numbers,
    scope indices: most 8-byte columns of an entry fit in 4 or 2 bytes, and an entry's size
    is the measurement's and the cache's disk use (loading widens them back: a copy, a
    millisecond for libtorch_cpu.so's largest)."""
    if a.dtype.kind not in "iu" or a.itemsize < 2 or not a.size:
        return a, None
    lo, hi = int(a.min()), int(a.max())
    for dt in _NARROW:
        if dt.itemsize >= a.itemsize:
            break
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return a.astype(dt), a.dtype.str
    return a, None


def load(path: str | os.PathLike[str], expect: dict[str, Any] | None = None
         ) -> tuple[Structure, dict[str, Any], dict[str, npt.NDArray[Any]]] | None:
    """``(structure, meta, extra arrays)`` of an entry written by :func:`save`, or None when
    it is absent, damaged, or its header differs from ``expect`` in any field given. The
    arrays are read-only views of the mapped file."""
    got = load_arrays(path, expect)
    if got is None:
        return None
    meta, arrays = got
    try:
        cols = {k: arrays["s." + k] for k in ARRAYS}
        strings = array_to_strings(arrays["strings"], int(meta.get("n_strings", 0)))
    except (KeyError, UnicodeDecodeError, ValueError):
        return None
    extra = {k[2:]: v for k, v in arrays.items() if k.startswith("x.")}
    n = len(cols["kind"])
    if (len(strings) != meta.get("n_strings") or len(cols["range_ptr"]) != n + 1
            or any(len(cols[k]) != n for k in _PER_SCOPE)
            or not len(cols["range_lo"]) == len(cols["range_hi"]) == int(cols["range_ptr"][-1])
            or not len(cols["map_lo"]) == len(cols["map_hi"]) == len(cols["map_scope"])):
        return None
    c = cols
    s = Structure(path=str(meta.get("path", "")), build_id=meta.get("build_id"),
                  strings=strings, kind=c["kind"], parent=c["parent"], name=c["name"],
                  link_name=c["link_name"], file=c["file"], line=c["line"],
                  call_file=c["call_file"], call_line=c["call_line"], target=c["target"],
                  range_ptr=c["range_ptr"], range_lo=c["range_lo"], range_hi=c["range_hi"],
                  map_lo=c["map_lo"], map_hi=c["map_hi"], map_scope=c["map_scope"],
                  has_calls=bool(meta.get("has_calls")))
    return s, meta, extra


def load_arrays(path: str | os.PathLike[str], expect: dict[str, Any] | None = None
                ) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]] | None:
    """``(meta, arrays)`` of a file written by :func:`save_arrays`; None when absent,
    damaged, or its header differs from ``expect``."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 16:
                return None
            data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        if data[:8] != MAGIC:
            return None
        hlen = int.from_bytes(data[8:16], "little")
        doc = json.loads(bytes(data[16:16 + hlen]).decode("utf-8"))
        meta = doc["meta"]
        if not isinstance(meta, dict):
            return None
        if expect and any(meta.get(k) != v for k, v in expect.items()):
            return None
        base = 16 + hlen
        if size != base + int(doc["size"]):
            return None
        buf = memoryview(data)[base:]
        if zlib.crc32(buf) != int(doc["crc"]):
            return None
        arrays: dict[str, npt.NDArray[Any]] = {}
        for k, (dt, off, count, *wide) in doc["arrays"].items():
            a = np.frombuffer(buf, dtype=np.dtype(dt), count=int(count), offset=int(off))
            arrays[k] = a.astype(np.dtype(wide[0])) if wide else a
    except Exception:  # any entry that does not read back whole is a miss
        return None
    return meta, arrays
