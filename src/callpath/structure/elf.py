"""Reading an ELF load module: sections, build-id, and where its debug information lives.

pyelftools parses the ELF container (headers, section table, compressed sections); everything
hot (line programs, instruction bytes) is then read from plain ``bytes`` by our own code.
Every way a file can fail to be an analysable ELF ends in a :class:`FormatError` naming it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from callpath.errors import FormatError
from callpath.structure.elfheaders import SHT_PROGBITS, ElfHeaders, read_headers

#: Machines whose instructions we can decode (``e_machine`` names as pyelftools spells them).
SUPPORTED_MACHINES = {"EM_X86_64"}

#: Where distributions install separate debug files, by build-id and by debuglink name.
DEBUG_ROOTS = ("/usr/lib/debug",)


class MappedBytes:
    """A section's bytes in the memory-mapped file, sliced like ``bytes``: a slice reads only
    the pages it covers. On-demand structure decodes a few hundred procedures of
    libtorch_cpu.so; reading its 285 MB of ``.text`` for them cost seconds."""

    __slots__ = ("_lo", "_map", "_n")

    def __init__(self, data: mmap.mmap, lo: int, n: int) -> None:
        self._map, self._lo, self._n = data, lo, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, s: slice) -> bytes:
        start, stop, step = s.indices(self._n)
        if step != 1:
            raise ValueError("MappedBytes: only contiguous slices")
        return self._map[self._lo + start:self._lo + max(start, stop)]

    def release(self) -> None:
        """Give the pages read so far back (they stay in the page cache and are read again
        if sliced again): decoding all of libtorch_cpu.so's ``.text`` otherwise keeps its
        285 MB resident to the end of the analysis."""
        advice = getattr(mmap, "MADV_DONTNEED", None)
        if advice is None or self._n == 0:
            return
        start = self._lo - self._lo % mmap.PAGESIZE
        with contextlib.suppress(OSError, ValueError):
            self._map.madvise(advice, start, self._lo + self._n - start)


#: A section's bytes: read whole, or mapped.
SectionBytes = bytes | MappedBytes


@dataclass
class Section:
    """One allocated section: its name, load address, file bytes (lazily) and flags."""

    name: str
    addr: int
    size: int
    executable: bool
    data: SectionBytes = b""


@dataclass
class ElfModule:
    """An opened ELF file and the facts the analysis needs, read once."""

    path: str
    elf: Any  # elftools.elf.elffile.ELFFile (untyped library)
    stream: Any
    machine: str
    is_shared: bool
    build_id: str | None
    debuglink: str | None
    text_sections: list[Section] = field(default_factory=list)
    #: the headers as read directly (64-bit little-endian files): section lookups without
    #: pyelftools' section objects (it parses every GNU hash table to make them)
    headers: ElfHeaders | None = None

    def close(self) -> None:
        self.stream.close()

    def header_bytes(self, c: Any) -> bytes | None:
        """The file bytes of the section with header ``c`` as read directly (None where it
        is compressed or has no bytes in the file)."""
        if c.flags & 0x800 or c.type == 8:  # SHF_COMPRESSED, SHT_NOBITS
            return None
        data = os.pread(self.stream.fileno(), c.size, c.offset)
        if len(data) != c.size:
            raise FormatError(self.path, f"section {c.name} cannot be read: {len(data)} of "
                              f"{c.size} bytes")
        return data

    def section_bytes(self, name: str) -> bytes | None:
        """Decompressed contents of a section, or None when absent.

        ``SHF_COMPRESSED`` sections (``gcc -gz``) are decompressed by pyelftools; the older
        GNU form (``-gz=zlib-gnu``: ``.zdebug_*`` sections starting with ``ZLIB`` and the
        big-endian size) is handled here, so callers always ask for ``.debug_*``.
        """
        h = self.headers
        if h is not None:
            c = h.section(name)
            if c is not None and not c.flags & 0x800:  # not SHF_COMPRESSED: the file's bytes
                return self.header_bytes(c)
            if c is None and h.section(".z" + name[1:]) is None:
                return None
        sec = self.elf.get_section_by_name(name)
        if sec is None and name.startswith(".debug_"):
            zsec = self.elf.get_section_by_name(".z" + name[1:])
            if zsec is not None and zsec["sh_type"] != "SHT_NOBITS":
                return self._gnu_zlib(".z" + name[1:], zsec)
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            return None
        try:
            return bytes(sec.data())
        except Exception as e:  # pyelftools raises many types on corrupt data
            raise FormatError(self.path, f"section {name} cannot be read: {e}") from None

    def _gnu_zlib(self, name: str, sec: Any) -> bytes:
        import zlib
        try:
            raw = bytes(sec.data())
        except Exception as e:
            raise FormatError(self.path, f"section {name} cannot be read: {e}") from None
        if raw[:4] != b"ZLIB" or len(raw) < 12:
            return raw  # not compressed after all (the GNU form allows that)
        size = int.from_bytes(raw[4:12], "big")
        try:
            out = zlib.decompress(raw[12:])
        except zlib.error as e:
            raise FormatError(self.path, f"section {name}: corrupt zlib data ({e})") from None
        if len(out) != size:
            raise FormatError(self.path, f"section {name}: decompressed to {len(out)} bytes, "
                              f"its header says {size}")
        return out

    def has_dwarf(self) -> bool:
        if self.headers is not None:
            return self.headers.has_dwarf()
        for name in (".debug_info", ".zdebug_info"):
            sec = self.elf.get_section_by_name(name)
            if sec is not None and sec["sh_type"] != "SHT_NOBITS" and sec["sh_size"] > 0:
                return True
        return False


def open_elf(path: str | os.PathLike[str], *, require_code: bool = True) -> ElfModule:
    """Open ``path`` as an ELF load module, checking magic, class and machine.

    ``require_code`` is False for separate debug files, whose code sections are NOBITS.
    """
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    p = str(path)
    try:
        stream = open(p, "rb")  # noqa: SIM115 - kept open for pyelftools' lazy reads
    except OSError as e:
        raise FormatError(p, f"cannot open: {e.strerror or e}") from None
    try:
        try:
            magic = stream.read(4)
        except OSError as e:  # a device or /proc file that opens but cannot be read
            raise FormatError(p, f"cannot read: {e.strerror or e}") from None
        if magic != b"\x7fELF":
            raise FormatError(p, "not an ELF file (expected the magic bytes 7f 45 4c 46)", 0)
        stream.seek(0)
        try:
            elf = ELFFile(stream)
            machine = str(elf["e_machine"])
            etype = str(elf["e_type"])
            nsec = elf.num_sections()
        except (ELFError, Exception) as e:  # truncated headers surface as struct errors
            raise FormatError(p, f"truncated or corrupt ELF header: {e}") from None
        if require_code and machine not in SUPPORTED_MACHINES:
            raise FormatError(p, f"unsupported architecture {machine} (expected x86-64)")
        if nsec == 0:
            raise FormatError(p, "the ELF file has no section table")
        mod = ElfModule(path=p, elf=elf, stream=stream, machine=machine,
                        is_shared=etype == "ET_DYN", build_id=None, debuglink=None)
        h = read_headers(p)
        if h is not None and len(h.sections) == nsec:
            mod.headers = h
            mod.build_id = h.build_id or None
            mod.debuglink = h.debuglink
            if require_code:
                _map_text_sections(mod, h)
            return mod
        _read_notes(mod)
        if require_code:
            _read_text_sections(mod)
        return mod
    except BaseException:
        stream.close()
        raise


def _read_notes(mod: ElfModule) -> None:
    try:
        for sec in mod.elf.iter_sections():
            if sec["sh_type"] == "SHT_NOTE":
                for note in sec.iter_notes():
                    # type 3 is also SystemTap's probe notes (owner "stapsdt")
                    if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                        mod.build_id = str(note["n_desc"])
            elif sec.name == ".gnu_debuglink":
                raw = bytes(sec.data())
                mod.debuglink = raw.split(b"\0", 1)[0].decode("utf-8", "replace") or None
    except FormatError:
        raise
    except Exception as e:
        raise FormatError(mod.path, f"corrupt section table or notes: {e}") from None


def _map_text_sections(mod: ElfModule, h: ElfHeaders) -> None:
    """The executable sections as slices of the mapped file (checked against its size)."""
    size = os.fstat(mod.stream.fileno()).st_size
    data: mmap.mmap | None = None
    for c in h.sections:
        if c.type != SHT_PROGBITS or not c.flags & 0x4:  # SHF_EXECINSTR
            continue
        if c.offset + c.size > size:
            raise FormatError(mod.path, f"section {c.name} is truncated "
                              f"({max(0, size - c.offset)} of {c.size} bytes)")
        if data is None:
            data = mmap.mmap(mod.stream.fileno(), 0, access=mmap.ACCESS_READ)
        mod.text_sections.append(Section(c.name, c.addr, c.size, True,
                                         MappedBytes(data, c.offset, c.size)))
    mod.text_sections.sort(key=lambda s: s.addr)


def _read_text_sections(mod: ElfModule) -> None:
    try:
        for sec in mod.elf.iter_sections():
            flags = int(sec["sh_flags"])
            if sec["sh_type"] != "SHT_PROGBITS" or not flags & 0x4:  # SHF_EXECINSTR
                continue
            data = bytes(sec.data())
            if len(data) != sec["sh_size"]:
                raise FormatError(mod.path, f"section {sec.name} is truncated "
                                  f"({len(data)} of {sec['sh_size']} bytes)")
            mod.text_sections.append(Section(sec.name, int(sec["sh_addr"]), int(sec["sh_size"]),
                                             True, data))
    except FormatError:
        raise
    except Exception as e:
        raise FormatError(mod.path, f"corrupt executable section: {e}") from None
    mod.text_sections.sort(key=lambda s: s.addr)


def find_debug_file(mod: ElfModule | ElfHeaders) -> str | None:
    """The separate debug file of ``mod``: by build-id first, then by ``.gnu_debuglink``.

    Looks where gdb looks: ``/usr/lib/debug/.build-id/xx/rest.debug``, then the debuglink name
    beside the binary, in its ``.debug/`` folder, and under ``/usr/lib/debug/<dir>/``.
    """
    roots = [r for r in os.environ.get("CALLPATH_DEBUG_ROOT", "").split(os.pathsep) if r]
    roots += list(DEBUG_ROOTS)
    cands: list[Path] = []
    if mod.build_id and len(mod.build_id) > 2:
        for r in roots:
            cands.append(Path(r) / ".build-id" / mod.build_id[:2] / (mod.build_id[2:] + ".debug"))
    if mod.debuglink:
        d = Path(mod.path).resolve().parent
        cands += [d / mod.debuglink, d / ".debug" / mod.debuglink]
        for r in roots:
            cands.append(Path(r) / str(d).lstrip("/") / mod.debuglink)
    for c in cands:
        if c.is_file() and str(c.resolve()) != str(Path(mod.path).resolve()):
            return str(c)
    return None


def section_containing(mod: ElfModule, addr: int) -> Section | None:
    for s in mod.text_sections:
        if s.addr <= addr < s.addr + s.size:
            return s
    return None
