"""The framing every v4 file shares (``../specs/hpctoolkit-FORMATS.md``): the magic and version,
the header of (size, pointer) pairs, the footer, numpy dtypes for C-like records at explicit
offsets, UTF-8 strings without NUL, and :class:`Section`, a section assembled in memory at a
known file offset.

Why a module of its own: ``meta.db`` (:mod:`~callpath.formats.v4.meta_db`) and the three value
files (:mod:`~callpath.formats.v4.value_dbs`) are written by different code but framed the same
way; this is that common part, and nothing here knows about experiments.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.formats.v4.blocks import align_up

MAGIC = b"HPCTOOLKIT"
MAJOR, MINOR = 4, 0
FOOTERS = {b"meta": b"_meta.db", b"prof": b"_prof.db", b"ctxt": b"__ctx.db", b"trce": b"trace.db"}


def cstruct(fields: list[tuple[str, str, int]], size: int) -> np.dtype[Any]:
    """A numpy dtype for a C-like structure with explicit field offsets; padding stays zero
    in arrays made with ``np.zeros``."""
    return np.dtype({"names": [f[0] for f in fields], "formats": [f[1] for f in fields],
                     "offsets": [f[2] for f in fields], "itemsize": size})


def encode_string(s: str, what: str) -> bytes:
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise CallpathError(f"{what} {s!r} cannot be written as UTF-8: {e.reason}") from None
    if b"\0" in b:
        raise CallpathError(f"{what} {s!r} contains a NUL character, which v4 strings cannot hold")
    return b


def file_header(fmt: bytes, sections: list[tuple[int, int]]) -> bytes:
    """The common header: magic, format, version, then (size, pointer) of every section."""
    out = bytearray(MAGIC + fmt + bytes([MAJOR, MINOR]))
    for size, ptr in sections:
        out += size.to_bytes(8, "little") + ptr.to_bytes(8, "little")
    return bytes(out)


def footer(fmt: bytes, pos: int) -> bytes:
    """Padding to an 8-byte boundary, then the footer (as hpcprof places it)."""
    return bytes(align_up(pos) - pos) + FOOTERS[fmt]


class Section:
    """A section being assembled in memory at a known absolute file offset."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.buf = bytearray()

    @property
    def pos(self) -> int:
        return self.base + len(self.buf)

    def align(self, a: int = 8) -> int:
        self.buf += bytes(align_up(len(self.buf), a) - len(self.buf))
        return self.pos

    def put(self, data: bytes | bytearray | memoryview | npt.NDArray[Any]) -> int:
        at = self.pos
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data).view(np.uint8).tobytes()
        self.buf += data
        return at

    def reserve(self, n: int) -> int:
        at = self.pos
        self.buf += bytes(n)
        return at

    def patch(self, at: int, data: bytes | npt.NDArray[Any]) -> None:
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data).view(np.uint8).tobytes()
        rel = at - self.base
        self.buf[rel:rel + len(data)] = data

    def strings(self, items: Iterable[str], what: str) -> dict[str, int]:
        """Place each distinct string once (NUL-terminated); return string -> pointer."""
        table: dict[str, int] = {}
        for s in items:
            if s not in table:
                table[s] = self.put(encode_string(s, what) + b"\0")
        return table

    @property
    def size(self) -> int:
        return len(self.buf)
