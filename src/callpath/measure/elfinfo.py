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
                        if note["n_type"] == "NT_GNU_BUILD_ID":
                            self.build_id = str(note["n_desc"])
            self._elf = elf
        except (OSError, ELFError, ValueError, KeyError) as e:
            self.ok = False
            self.error = str(e)

    def link_address(self, file_offset: int) -> int | None:
        """The link-time address of a file offset (from the loadable segment holding it)."""
        for s in self.segments:
            if s.offset <= file_offset < s.offset + max(s.filesz, 1):
                return s.vaddr + file_offset - s.offset
        return None

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
        from elftools.common.exceptions import DWARFError, ELFError
        from elftools.dwarf.callframe import FDE
        entries: list[Any] = []
        sources = [self] if self.ok else []
        dbg = self.debug_file()
        if dbg:
            sources.append(ElfInfo.get(dbg))
        for src in sources:
            if not src.ok:
                continue
            try:
                dw = src._elf.get_dwarf_info(relocate_dwarf_sections=False)
                if dw.has_EH_CFI():
                    entries.extend(e for e in dw.EH_CFI_entries() if isinstance(e, FDE))
                if dw.has_CFI():
                    entries.extend(e for e in dw.CFI_entries() if isinstance(e, FDE))
            except (ELFError, DWARFError, ValueError, KeyError, AssertionError, TypeError):
                continue
            except Exception:  # pyelftools raises many kinds on odd inputs
                continue
        seen: dict[int, Any] = {}
        for e in entries:
            lo = int(e.header["initial_location"])
            if lo not in seen:  # .eh_frame first: prefer it over .debug_frame
                seen[lo] = e
        order = sorted(seen)
        self._fde_starts = order
        self._fdes = [seen[k] for k in order]
        self._fde_ends = [k + int(seen[k].header["address_range"]) for k in order]

    def fde_for(self, vaddr: int) -> Any | None:
        if self._fde_starts is None:
            self._load_cfi()
        assert self._fde_starts is not None
        i = bisect.bisect_right(self._fde_starts, vaddr) - 1
        if i >= 0 and vaddr < self._fde_ends[i]:
            return self._fdes[i]
        return None

    # -- symbols (for the quick flat summary)

    def symbols(self) -> tuple[list[int], list[int], list[str]]:
        """Sorted function symbols: (starts, ends, names), from .symtab, .dynsym and the debug
        file's .symtab."""
        if self._symbols is not None:
            return self._symbols
        from elftools.elf.sections import SymbolTableSection
        rows: dict[int, tuple[int, str]] = {}
        elves = [self._elf] if self.ok else []
        dbg = self.debug_file()
        if dbg and ElfInfo.get(dbg).ok:
            elves.append(ElfInfo.get(dbg)._elf)
        for elf in elves:
            for sec in elf.iter_sections():
                if not isinstance(sec, SymbolTableSection):
                    continue
                for sym in sec.iter_symbols():
                    if sym["st_info"]["type"] != "STT_FUNC" or not sym["st_value"]:
                        continue
                    rows.setdefault(int(sym["st_value"]), (int(sym["st_size"]), sym.name))
        starts = sorted(rows)
        ends = [s + max(rows[s][0], 1) for s in starts]
        names = [rows[s][1] for s in starts]
        self._symbols = (starts, ends, names)
        return self._symbols

    def symbolize(self, vaddr: int) -> str | None:
        starts, ends, names = self.symbols()
        i = bisect.bisect_right(starts, vaddr) - 1
        if i >= 0 and vaddr < ends[i]:
            return names[i]
        name = self.plt_section(vaddr)
        return f"<{name}>" if name else None
