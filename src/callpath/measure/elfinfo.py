"""Facts about one load module that measurement needs: build-id, loadable segments (to turn a
mapping into link-time addresses), PLT sections, call-frame information and symbols.

Everything is computed lazily and cached per file (``ElfInfo.get``): a run touches the same
libc in every process, and the unwinder asks for the same few functions again and again.
Separate debug files are looked up by build-id under ``/usr/lib/debug/.build-id/`` for
``.debug_frame`` and full symbol tables when the module itself is stripped.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

DEBUG_ROOTS = ["/usr/lib/debug"]


@dataclass
class Segment:
    vaddr: int
    offset: int
    filesz: int
    memsz: int
    flags: int


@dataclass
class ElfInfo:
    path: str
    build_id: str = ""
    segments: list[Segment] = field(default_factory=list)
    plt: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, name)
    ok: bool = True
    error: str = ""
    _fde_starts: list[int] | None = None
    _fde_ends: list[int] = field(default_factory=list)
    _fdes: list[Any] = field(default_factory=list)
    _symbols: tuple[list[int], list[int], list[str]] | None = None
    _progbits: list[tuple[int, int, int]] | None = None  # (address, size, file offset)

    _cache: ClassVar[dict[str, ElfInfo]] = {}

    @classmethod
    def get(cls, path: str) -> ElfInfo:
        info = cls._cache.get(path)
        if info is None:
            info = cls(path)
            info._load()
            cls._cache[path] = info
        return info

    def _open(self) -> Any:
        from elftools.elf.elffile import ELFFile
        return ELFFile(open(self.path, "rb"))

    def _load(self) -> None:
        from elftools.common.exceptions import ELFError
        try:
            elf = self._open()
            for seg in elf.iter_segments():
                if seg["p_type"] == "PT_LOAD":
                    self.segments.append(Segment(seg["p_vaddr"], seg["p_offset"],
                                                 seg["p_filesz"], seg["p_memsz"],
                                                 seg["p_flags"]))
            for sec in elf.iter_sections():
                if sec.name.startswith(".plt"):
                    self.plt.append((sec["sh_addr"], sec["sh_addr"] + sec["sh_size"], sec.name))
                if sec["sh_type"] == "SHT_NOTE":
                    for note in sec.iter_notes():
                        # SystemTap's probe notes (owner "stapsdt", libstdc++, libc) have
                        # type 3 too, which pyelftools also calls NT_GNU_BUILD_ID
                        if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                            self.build_id = str(note["n_desc"])
            self._elf = elf
        except (OSError, ELFError, ValueError, KeyError) as e:
            self.ok = False
            self.error = str(e)

    def link_address(self, file_offset: int, executable: bool = False) -> int | None:
        """The link-time address of a file offset (from the loadable segment holding it).

        A mapping's offset is page-aligned, so it may lie before its segment's own offset and
        inside the previous segment's bytes: OpenBLAS (lld) has a read-only segment ending at
        0x2887dc and its code segment at offset 0x288800, vaddr 0x289800, so the code
        mapping's offset 0x288000 is in both, with link addresses 0x1000 apart. For an
        executable mapping (``executable``) the executable segment is the one mapped.
        """
        first = None
        for s in self.segments:
            if s.offset & ~0xFFF <= file_offset < s.offset + max(s.filesz, 1):
                la = s.vaddr + file_offset - s.offset
                if not executable or s.flags & 1:  # PF_X
                    return la
                if first is None:
                    first = la
        return first

    def entry_point(self) -> int:
        return int(self._elf.header["e_entry"]) if self.ok else -1

    def next_fde_start(self, vaddr: int) -> int:
        """The first FDE start above ``vaddr`` (-1 if none): where code without CFI ends."""
        if self._fde_starts is None:
            self._load_cfi()
        assert self._fde_starts is not None
        i = bisect.bisect_right(self._fde_starts, vaddr)
        return self._fde_starts[i] if i < len(self._fde_starts) else -1

    def read_code(self, lo: int, hi: int) -> bytes:
        """The bytes of ``[lo, hi)`` from the section holding ``lo``, cut at its end (b"" if
        no section holds it). Read with ``pread``: only those bytes (a procedure's recipe or a
        return address's call, not the whole ``.text`` each time), and no shared file
        position that forked unwinding workers could move under each other."""
        if not self.ok:
            return b""
        if self._progbits is None:
            # the section headers once: pyelftools builds each section object anew (a GNU
            # hash section parses its whole table), seconds per call for libtorch_cpu.so
            self._progbits = [(int(sec["sh_addr"]), int(sec["sh_size"]),
                               int(sec["sh_offset"])) for sec in self._elf.iter_sections()
                              if sec["sh_type"] == "SHT_PROGBITS"]
        for a, n, off in self._progbits:
            if a <= lo < a + n:
                size = min(hi, a + n) - lo
                try:
                    return os.pread(self._elf.stream.fileno(), size, off + lo - a)
                except OSError:
                    return b""
        return b""

    def plt_section(self, vaddr: int) -> str | None:
        for lo, hi, name in self.plt:
            if lo <= vaddr < hi:
                return name
        return None

    def debug_file(self) -> str | None:
        """The separate debug file named by the build-id, if installed."""
        if len(self.build_id) < 3:
            return None
        for root in DEBUG_ROOTS:
            p = os.path.join(root, ".build-id", self.build_id[:2], self.build_id[2:] + ".debug")
            if os.path.exists(p):
                return p
        return None

    # -- call-frame information

    def _load_cfi(self) -> None:
        """Index the FDEs. Fast path: the sorted table of ``.eh_frame_hdr`` (what the runtime
        unwinder uses), parsing an FDE only when a pc falls in it; otherwise every entry of
        ``.eh_frame`` and ``.debug_frame`` is parsed once (pyelftools, ~0.4 s for libc)."""
        self._fde_starts = []
        self._hdr_offsets: list[int] | None = None
        if self.ok and self._load_eh_frame_hdr():
            return
        self._load_all_cfi([self])

    def _load_eh_frame_hdr(self) -> bool:
        import numpy as np
        from elftools.dwarf.callframe import CallFrameInfo
        elf = self._elf
        hdr = elf.get_section_by_name(".eh_frame_hdr")
        eh = elf.get_section_by_name(".eh_frame")
        if hdr is None or eh is None:
            return False
        data = hdr.data()
        if len(data) < 12 or data[0] != 1 or data[3] != 0x3B or data[2] != 0x03:
            return False  # only the usual encodings: udata4 count, datarel sdata4 table
        count = int.from_bytes(data[8:12], "little")
        if len(data) < 12 + 8 * count:
            return False
        table = np.frombuffer(data, dtype="<i4", count=2 * count, offset=12).reshape(-1, 2)
        base = int(hdr["sh_addr"])
        starts = (table[:, 0].astype(np.int64) + base)
        offsets = (table[:, 1].astype(np.int64) + base - int(eh["sh_addr"]))
        order = np.argsort(starts, kind="stable")
        self._fde_starts = starts[order].tolist()
        self._hdr_offsets = offsets[order].tolist()
        dw = elf.get_dwarf_info(relocate_dwarf_sections=False)
        assert dw.eh_frame_sec is not None
        self._cfi_parser = CallFrameInfo(stream=dw.eh_frame_sec.stream,
                                         size=dw.eh_frame_sec.size,
                                         address=dw.eh_frame_sec.address,
                                         base_structs=dw.structs, for_eh_frame=True)
        self._fde_cache: dict[int, Any] = {}
        return True

    def _load_all_cfi(self, sources: list[ElfInfo]) -> None:
        from elftools.dwarf.callframe import FDE
        entries: list[Any] = []
        for src in sources:
            if not src.ok:
                continue
            try:
                dw = src._elf.get_dwarf_info(relocate_dwarf_sections=False)
                if dw.has_EH_CFI():
                    entries.extend(e for e in dw.EH_CFI_entries() if isinstance(e, FDE))
                if dw.has_CFI():
                    entries.extend(e for e in dw.CFI_entries() if isinstance(e, FDE))
            except Exception:  # pyelftools raises many kinds on odd inputs: no CFI then
                continue
        seen: dict[int, Any] = {}
        for e in entries:
            lo = int(e.header["initial_location"])
            if lo not in seen:  # .eh_frame first: prefer it over .debug_frame
                seen[lo] = e
        order = sorted(seen)
        self._fde_starts = order
        self._hdr_offsets = None
        self._fdes = [seen[k] for k in order]
        self._fde_ends = [k + int(seen[k].header["address_range"]) for k in order]

    def fde_for(self, vaddr: int) -> Any | None:
        """The FDE covering ``vaddr``: from this file, else (when the file has no .eh_frame
        index) from the .debug_frame of its separate debug file."""
        if self._fde_starts is None:
            self._load_cfi()
        assert self._fde_starts is not None
        i = bisect.bisect_right(self._fde_starts, vaddr) - 1
        if i >= 0:
            if self._hdr_offsets is None:
                if vaddr < self._fde_ends[i]:
                    return self._fdes[i]
            else:
                off = self._hdr_offsets[i]
                fde: Any = self._fde_cache.get(off)
                if fde is None:
                    try:
                        fde = self._cfi_parser._parse_entry_at(off)
                    except Exception:
                        fde = False
                    self._fde_cache[off] = fde
                if fde and vaddr < self._fde_starts[i] + int(fde.header["address_range"]):
                    return fde
        if self._hdr_offsets is not None:
            # the file has a complete .eh_frame index: a pc it does not cover has no CFI
            # (hand-written assembly such as ld.so's _start); parsing a debug file's whole
            # .debug_frame for it would cost ~0.3 s and find nothing
            return None
        dbg = self.debug_file()
        if dbg and dbg != self.path:
            d = ElfInfo.get(dbg)
            if d._fde_starts is None:
                d._fde_starts = []
                d._load_all_cfi([d])
            return d.fde_for(vaddr)
        return None

    # -- symbols (for the quick flat summary)

    def symbols(self) -> tuple[list[int], list[int], list[str]]:
        """Sorted function symbols: (starts, ends, names), from .symtab and .dynsym of the
        file and of its debug file. Read with numpy (pyelftools' per-symbol objects cost
        seconds on a libc debug file)."""
        if self._symbols is not None:
            return self._symbols
        import numpy as np
        sym_dtype = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"),
                              ("shndx", "<u2"), ("value", "<u8"), ("size", "<u8")])
        rows: dict[int, tuple[int, int, bytes]] = {}
        elves = [self._elf] if self.ok else []
        dbg = self.debug_file()
        if dbg and dbg != self.path and ElfInfo.get(dbg).ok:
            elves.append(ElfInfo.get(dbg)._elf)
        for elf in elves:
            if elf.elfclass != 64 or not elf.little_endian:
                continue
            for secname in (".symtab", ".dynsym"):
                sec = elf.get_section_by_name(secname)
                if sec is None or sec["sh_type"] == "SHT_NOBITS":
                    continue
                strtab = elf.get_section(sec["sh_link"]).data()
                data = sec.data()
                syms = np.frombuffer(data, dtype=sym_dtype, count=len(data) // 24)
                sel = ((syms["info"] & 0xF) == 2) & (syms["value"] != 0)
                for name_off, value, size in zip(syms["name"][sel].tolist(),
                                                 syms["value"][sel].tolist(),
                                                 syms["size"][sel].tolist(), strict=True):
                    if value not in rows or (rows[value][1] == 0 and size):
                        rows[value] = (name_off, size, strtab)
        starts = sorted(rows)
        ends = [s + max(rows[s][1], 1) for s in starts]
        names = []
        for s in starts:
            off, _size, tab = rows[s]
            end = tab.find(b"\0", off)
            names.append(tab[off:end if end >= 0 else len(tab)].decode("utf-8", "replace"))
        self._symbols = (starts, ends, names)
        return self._symbols

    def symbolize(self, vaddr: int) -> str | None:
        starts, ends, names = self.symbols()
        i = bisect.bisect_right(starts, vaddr) - 1
        if i >= 0 and vaddr < ends[i]:
            return names[i]
        name = self.plt_section(vaddr)
        return f"<{name}>" if name else None
