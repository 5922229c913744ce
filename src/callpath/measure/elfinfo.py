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

from callpath.measure.eh_frame import CfiError, Fde, from_pyelftools, parse_fde

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
    _fdes: list[Fde] = field(default_factory=list)
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

    @property
    def _elf(self) -> Any:
        """pyelftools' view of the file, opened only where the direct headers do not serve
        (another ELF class or byte order, CFI without an ``.eh_frame_hdr`` index)."""
        elf = self.__dict__.get("_elf_obj")
        if elf is None:
            from elftools.elf.elffile import ELFFile
            elf = self.__dict__["_elf_obj"] = ELFFile(open(self.path, "rb"))  # noqa: SIM115
        return elf

    def _load(self) -> None:
        from callpath.structure.elfheaders import PT_LOAD, read_headers
        h = read_headers(self.path)
        if h is None:
            self._load_pyelftools()
            return
        self._h = h
        self._fd = os.open(self.path, os.O_RDONLY)
        self.segments = [Segment(g.vaddr, g.offset, g.filesz, g.memsz, g.flags)
                         for g in h.segments if g.type == PT_LOAD]
        self.plt = [(c.addr, c.addr + c.size, c.name) for c in h.sections
                    if c.name.startswith(".plt")]
        self.build_id = h.build_id

    def _load_pyelftools(self) -> None:
        from elftools.common.exceptions import ELFError
        try:
            elf = self._elf
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
        except (OSError, ELFError, ValueError, KeyError) as e:
            self.ok = False
            self.error = str(e)

    def _section_data(self, name: str) -> tuple[int, bytes] | None:
        """(address, bytes) of a section with file bytes, or None."""
        h = self.__dict__.get("_h")
        if h is not None:
            sec = h.section(name)
            if sec is None or sec.type == 8:  # SHT_NOBITS
                return None
            return sec.addr, os.pread(self._fd, sec.size, sec.offset)
        s = self._elf.get_section_by_name(name)
        if s is None or s["sh_type"] == "SHT_NOBITS":
            return None
        return int(s["sh_addr"]), bytes(s.data())

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
        if not self.ok:
            return -1
        h = self.__dict__.get("_h")
        return int(h.entry) if h is not None else int(self._elf.header["e_entry"])

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
        h = self.__dict__.get("_h")
        if h is not None:
            for c in h.sections:
                if c.addr <= lo < c.addr + c.size and c.type == 1:  # SHT_PROGBITS
                    try:
                        return os.pread(self._fd, min(hi, c.addr + c.size) - lo,
                                        c.offset + lo - c.addr)
                    except OSError:
                        return b""
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
        got_hdr = self._section_data(".eh_frame_hdr")
        got_eh = self._section_data(".eh_frame")
        if got_hdr is None or got_eh is None:
            return False
        (base, data), (eh_addr, eh) = got_hdr, got_eh
        if len(data) < 12 or data[0] != 1 or data[3] != 0x3B or data[2] != 0x03:
            return False  # only the usual encodings: udata4 count, datarel sdata4 table
        count = int.from_bytes(data[8:12], "little")
        if len(data) < 12 + 8 * count:
            return False
        if "_h" not in self.__dict__ and (self._elf.elfclass != 64
                                          or not self._elf.little_endian):
            return False
        table = np.frombuffer(data, dtype="<i4", count=2 * count, offset=12).reshape(-1, 2)
        starts = (table[:, 0].astype(np.int64) + base)
        offsets = (table[:, 1].astype(np.int64) + base - eh_addr)
        order = np.argsort(starts, kind="stable")
        self._fde_starts = starts[order].tolist()
        self._hdr_offsets = offsets[order].tolist()
        # each FDE is parsed when a pc falls in it (``eh_frame.parse_fde``), its CIE once
        self._eh = (eh_addr, eh)
        self._cies: dict[int, Any] = {}
        self._fde_cache: dict[int, Fde | bool] = {}
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
        self._fdes = [from_pyelftools(seen[k]) for k in order]
        self._fde_ends = [k + int(seen[k].header["address_range"]) for k in order]

    def fde_for(self, vaddr: int) -> Fde | None:
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
                fde = self._fde_cache.get(off)
                if fde is None:
                    try:
                        fde = parse_fde(self._eh[1], self._eh[0], off, self._cies)
                    except CfiError:
                        fde = False
                    self._fde_cache[off] = fde
                if isinstance(fde, Fde) and vaddr < fde.hi:
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
        file and of its debug file (the first of each address, one with a size preferred)."""
        if self._symbols is None:
            t = self.symbol_table()
            self._symbols = (t.starts.tolist(), t.ends.tolist(),
                             [t.name(i) for i in range(len(t.starts))])
        return self._symbols

    def symbol_table(self) -> SymbolArrays:
        """The function symbols as arrays, names decoded only when asked for. Read with
        numpy: libtorch_cpu.so has 380k of them, and a Python step per symbol is seconds."""
        got: SymbolArrays | None = self.__dict__.get("_symbol_arrays")
        if got is not None:
            return got
        import numpy as np
        sym_dtype = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"),
                              ("shndx", "<u2"), ("value", "<u8"), ("size", "<u8")])
        files = [self] if self.ok else []
        dbg = self.debug_file()
        if dbg and dbg != self.path and ElfInfo.get(dbg).ok:
            files.append(ElfInfo.get(dbg))
        values, sizes, names, tabs = [], [], [], []
        order: list[bytes] = []
        for f in files:
            for secname in (".symtab", ".dynsym"):
                got_tab = f._symtab(secname)
                if got_tab is None:
                    continue
                data, strtab = got_tab
                syms = np.frombuffer(data, dtype=sym_dtype, count=len(data) // 24)
                sel = ((syms["info"] & 0xF) == 2) & (syms["value"] != 0)
                values.append(syms["value"][sel].astype(np.int64))
                sizes.append(syms["size"][sel].astype(np.int64))
                names.append(syms["name"][sel].astype(np.int64))
                tabs.append(np.full(int(sel.sum()), len(order), dtype=np.int64))
                order.append(strtab)
        if values:
            v, sz, nm, tb = (np.concatenate(x) for x in (values, sizes, names, tabs))
            # per address: the first symbol (file, .symtab, .dynsym order) with a size, else
            # the first
            seq = np.arange(len(v))
            o = np.lexsort((seq, sz == 0, v))
            v, sz, nm, tb = v[o], sz[o], nm[o], tb[o]
            first = np.ones(len(v), dtype=bool)
            first[1:] = v[1:] != v[:-1]
            v, sz, nm, tb = v[first], sz[first], nm[first], tb[first]
        else:
            v = sz = nm = tb = np.zeros(0, dtype=np.int64)
        got = SymbolArrays(v, v + np.maximum(sz, 1), nm, tb, order)
        self.__dict__["_symbol_arrays"] = got
        return got

    def _symtab(self, secname: str) -> tuple[bytes, bytes] | None:
        """A symbol table section's bytes and its string table's (64-bit little-endian)."""
        h = self.__dict__.get("_h")
        if h is not None:
            sec = h.section(secname)
            if sec is None or sec.type == 8 or not 0 <= sec.link < len(h.sections):
                return None
            st = h.sections[sec.link]
            return (os.pread(self._fd, sec.size, sec.offset),
                    os.pread(self._fd, st.size, st.offset))
        elf = self._elf
        if elf.elfclass != 64 or not elf.little_endian:
            return None
        s = elf.get_section_by_name(secname)
        if s is None or s["sh_type"] == "SHT_NOBITS":
            return None
        return bytes(s.data()), bytes(elf.get_section(s["sh_link"]).data())

    def symbolize(self, vaddr: int) -> str | None:
        t = self.symbol_table()
        i = int(t.starts.searchsorted(vaddr, side="right")) - 1
        if i >= 0 and vaddr < int(t.ends[i]):
            return t.name(i)
        name = self.plt_section(vaddr)
        return f"<{name}>" if name else None


@dataclass
class SymbolArrays:
    """Function symbols sorted by address; a name is decoded from its string table when
    asked for."""

    starts: Any  # int64 arrays
    ends: Any
    name_off: Any
    table: Any
    strtabs: list[bytes]

    def named(self, names: frozenset[str], dotted: bool = False) -> Any:
        """Which symbols have one of ``names`` (a boolean array), without decoding any
        other name: the string tables are searched for the names themselves. ``dotted``
        also takes a name followed by a compiler's suffix (``take_gil.lto_priv.0``)."""
        import numpy as np
        out = np.zeros(len(self.starts), dtype=bool)
        for t, tab in enumerate(self.strtabs):
            offs = []
            for n in names:
                # a name may be the tail of a longer one (linkers merge string suffixes):
                # every place the name ends a string is a candidate offset
                for end in (b"\0", b".") if dotted else (b"\0",):
                    pat = n.encode() + end
                    at = tab.find(pat)
                    while at >= 0:
                        offs.append(at)
                        at = tab.find(pat, at + 1)
            if offs:
                out |= (self.table == t) & np.isin(self.name_off, offs)
        return out

    def name(self, i: int) -> str:
        tab = self.strtabs[int(self.table[i])]
        off = int(self.name_off[i])
        end = tab.find(b"\0", off)
        return tab[off:end if end >= 0 else len(tab)].decode("utf-8", "replace")
