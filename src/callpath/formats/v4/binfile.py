"""Checked access to one memory-mapped ``*.db`` file of the v4 format.

Every read goes through a bounds check that raises :class:`FormatError` naming the file, the
offset and what was expected, so a truncated or corrupt file can never cause an IndexError,
a numpy exception, a huge allocation or an endless loop further up.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.errors import FormatError

MAGIC = b"HPCTOOLKIT"
FOOTERS = {b"meta": b"_meta.db", b"prof": b"_prof.db", b"ctxt": b"__ctx.db", b"trce": b"trace.db"}
SUPPORTED_MAJOR = 4


class BinFile:
    """A read-only memory map of a v4 file with typed, bounds-checked readers."""

    def __init__(self, path: Path, fmt: bytes) -> None:
        self.path = path
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise FormatError(path, "file is missing (expected as part of a v4 database)") from None
        except OSError as e:
            raise FormatError(path, f"cannot be opened: {e.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            if size < 16 + 8:
                raise FormatError(path, f"file is {size} bytes, too short for a v4 header")
            self.mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self.size = size
        self.buf = np.frombuffer(self.mm, dtype=np.uint8)
        # The whole file as little-endian u64 words: 8-byte aligned records are gathered from it.
        self.words = np.frombuffer(self.mm, dtype="<u8", count=size // 8)
        if bytes(self.mm[:10]) != MAGIC:
            raise FormatError(path, f"bad magic {bytes(self.mm[:10])!r}, expected {MAGIC!r}", 0)
        got = bytes(self.mm[10:14])
        if got != fmt:
            raise FormatError(path, f"format {got!r}, expected {fmt!r}", 10)
        self.major = self.mm[14]
        self.minor = self.mm[15]
        if self.major != SUPPORTED_MAJOR:
            raise FormatError(path, f"major version {self.major}, only {SUPPORTED_MAJOR} is "
                              "supported", 14)
        if bytes(self.mm[size - 8:]) != FOOTERS[fmt]:
            raise FormatError(path, f"missing footer {FOOTERS[fmt]!r}: the file is truncated or "
                              "was not completely written", size - 8)

    # ---- scalars ---------------------------------------------------------------------

    def check(self, off: int, length: int, what: str) -> None:
        if off < 0 or length < 0 or off + length > self.size:
            raise FormatError(self.path, f"{what} ({length} bytes) lies past the end of the "
                              f"file ({self.size} bytes)", off)

    def _int(self, off: int, n: int, what: str) -> int:
        self.check(off, n, what)
        return int.from_bytes(self.mm[off:off + n], "little")

    def u8(self, off: int, what: str = "u8 field") -> int:
        return self._int(off, 1, what)

    def u16(self, off: int, what: str = "u16 field") -> int:
        return self._int(off, 2, what)

    def u32(self, off: int, what: str = "u32 field") -> int:
        return self._int(off, 4, what)

    def u64(self, off: int, what: str = "u64 field") -> int:
        return self._int(off, 8, what)

    def section(self, index: int) -> tuple[int, int]:
        """(size, pointer) of header section ``index`` (0-based), checked against the file."""
        sz = self.u64(0x10 + 16 * index, f"size of section {index + 1}")
        p = self.u64(0x18 + 16 * index, f"pointer of section {index + 1}")
        self.check(p, sz, f"section {index + 1}")
        return sz, p

    def cstr(self, off: int, lo: int = 0, hi: int | None = None, what: str = "string") -> str:
        """A NUL-terminated UTF-8 string that must start and end inside ``[lo, hi)``."""
        hi = self.size if hi is None else hi
        if not lo <= off < hi:
            raise FormatError(self.path, f"{what} pointer {off:#x} outside its section "
                              f"[{lo:#x}, {hi:#x})")
        end = self.mm.find(b"\0", off, hi)
        if end < 0:
            raise FormatError(self.path, f"{what} is not NUL-terminated within its section", off)
        try:
            return bytes(self.mm[off:end]).decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(self.path, f"{what} is not valid UTF-8", off) from None

    # ---- arrays ------------------------------------------------------------------------

    def array(self, off: int, dtype: npt.DTypeLike, count: int, what: str) -> npt.NDArray[Any]:
        """A zero-copy array view of ``count`` items at ``off``."""
        dt = np.dtype(dtype)
        if count < 0 or count > self.size:
            raise FormatError(self.path, f"{what}: implausible count {count}", off)
        self.check(off, count * dt.itemsize, what)
        return np.frombuffer(self.mm, dtype=dt, count=count, offset=off)

    def records(self, off: int, stride: int, count: int, fields: dict[str, tuple[str, int]],
                what: str) -> npt.NDArray[Any]:
        """``count`` structures of ``stride`` bytes (the stride stored in the file, for forward
        compatibility) viewed as a numpy record array with the named ``(type, offset)`` fields."""
        need = max((o + np.dtype(t).itemsize for t, o in fields.values()), default=0)
        if count and stride < need:
            raise FormatError(self.path, f"{what}: structure size {stride} is smaller than the "
                              f"{need} bytes of version 4.0", off)
        dt = np.dtype({"names": list(fields), "formats": [t for t, _ in fields.values()],
                       "offsets": [o for _, o in fields.values()],
                       "itemsize": max(stride, need, 1)})
        if count < 0 or count * max(stride, 1) > self.size:
            raise FormatError(self.path, f"{what}: implausible count {count}", off)
        self.check(off, count * stride, what)
        return np.ndarray((count,), dtype=dt, buffer=self.mm, offset=off)


def index_of(pointers: npt.NDArray[np.uint64], base: int, stride: int, count: int,
             path: Path, what: str) -> npt.NDArray[np.int64]:
    """Turn pointers into an array of structures into indices (-1 for a null pointer).

    A pointer that is not exactly at a structure boundary inside the array is a format error.
    """
    p = pointers.astype(np.int64)
    out = np.full(len(p), -1, dtype=np.int64)
    nz = p != 0
    if not nz.any():
        return out
    rel = p[nz] - base
    bad = (rel < 0) | (rel % max(stride, 1) != 0) | (rel // max(stride, 1) >= count)
    if bad.any():
        first = int(p[nz][bad][0])
        raise FormatError(path, f"{what} pointer {first:#x} does not point at one of the "
                          f"{count} entries at {base:#x} (stride {stride})")
    out[nz] = rel // max(stride, 1)
    return out
