"""An ELF file's headers read directly: segments, sections, build-id, debuglink.

pyelftools builds a Python object per section (and parses every GNU hash table on the way):
about 10 ms per library, a second and a half for the 80 libraries of an ``import torch``
process, on every post-mortem and every ``prof`` that only needed a build-id. These are a few
hundred bytes at known offsets: read here with ``struct`` for 64-bit little-endian files (the
only ones the unwinder and the analysis handle); :func:`read_headers` returns None for any
other file, and callers fall back to pyelftools.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

SHT_NOBITS, SHT_NOTE, SHT_PROGBITS = 8, 7, 1
PT_LOAD = 1
NT_GNU_BUILD_ID = 3
SHN_XINDEX = 0xFFFF


@dataclass(frozen=True)
class SectionHeader:
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int


@dataclass(frozen=True)
class SegmentHeader:
    type: int
    flags: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int


@dataclass
class ElfHeaders:
    """What the headers of one file say (no section data but the notes and debuglink)."""

    path: str
    machine: int
    type: int
    entry: int
    sections: list[SectionHeader] = field(default_factory=list)
    segments: list[SegmentHeader] = field(default_factory=list)
    build_id: str = ""
    debuglink: str | None = None

    def section(self, name: str) -> SectionHeader | None:
        for s in self.sections:
            if s.name == name:
                return s
        return None

    def has_dwarf(self) -> bool:
        """As ``structure.elf.ElfModule.has_dwarf``: a non-empty ``.debug_info`` with bytes."""
        for name in (".debug_info", ".zdebug_info"):
            s = self.section(name)
            if s is not None and s.type != SHT_NOBITS and s.size > 0:
                return True
        return False


def read_headers(path: str) -> ElfHeaders | None:
    """The headers of a 64-bit little-endian ELF file; None for anything else (another class
    or byte order, not ELF, truncated, unreadable)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return _read(fd, path)
    except (OSError, struct.error, ValueError, IndexError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def _read(fd: int, path: str) -> ElfHeaders | None:
    head = os.pread(fd, 64, 0)
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    (etype, machine, _v, entry, phoff, shoff, _flags, _ehsize, phentsize, phnum, shentsize,
     shnum, shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", head, 16)
    out = ElfHeaders(path, machine, etype, entry)
    if phoff and phnum and phentsize >= 56:
        raw = os.pread(fd, phentsize * phnum, phoff)
        for i in range(len(raw) // phentsize):
            ptype, pflags, off, vaddr, _paddr, filesz, memsz = struct.unpack_from(
                "<IIQQQQQ", raw, i * phentsize)
            out.segments.append(SegmentHeader(ptype, pflags, off, vaddr, filesz, memsz))
    if not shoff or shentsize < 64:
        return out
    if shnum == 0 or shstrndx == SHN_XINDEX:  # counts too big for the header: in section 0
        s0 = os.pread(fd, 64, shoff)
        if len(s0) < 64:
            return None
        if shnum == 0:
            shnum = struct.unpack_from("<Q", s0, 32)[0]
        if shstrndx == SHN_XINDEX:
            shstrndx = struct.unpack_from("<I", s0, 40)[0]
    raw = os.pread(fd, shentsize * shnum, shoff)
    if len(raw) < shentsize * shnum:
        return None
    rows = [struct.unpack_from("<IIQQQQII", raw, i * shentsize) for i in range(shnum)]
    names = b""
    if 0 < shstrndx < shnum:
        r = rows[shstrndx]
        names = os.pread(fd, r[5], r[4])
    for name_off, stype, flags, addr, offset, size, link, _info in rows:
        end = names.find(b"\0", name_off)
        name = names[name_off:end if end >= 0 else len(names)].decode("utf-8", "replace") \
            if name_off < len(names) else ""
        sec = SectionHeader(name, stype, flags, addr, offset, size, link)
        out.sections.append(sec)
        if stype == SHT_NOTE and not out.build_id and size < 1 << 20:
            out.build_id = _build_id(os.pread(fd, size, offset))
        elif name == ".gnu_debuglink" and stype != SHT_NOBITS and size < 4096:
            data = os.pread(fd, size, offset)
            out.debuglink = data.split(b"\0", 1)[0].decode("utf-8", "replace") or None
    return out


def _build_id(notes: bytes) -> str:
    """The GNU build-id among the notes of one section (SystemTap's probe notes, owner
    ``stapsdt``, share its type number 3: the owner decides)."""
    o = 0
    while o + 12 <= len(notes):
        namesz, descsz, ntype = struct.unpack_from("<III", notes, o)
        name = notes[o + 12:o + 12 + namesz]
        desc_at = o + 12 + ((namesz + 3) & ~3)
        if ntype == NT_GNU_BUILD_ID and name.rstrip(b"\0") == b"GNU":
            return notes[desc_at:desc_at + descsz].hex()
        o = desc_at + ((descsz + 3) & ~3)
    return ""
