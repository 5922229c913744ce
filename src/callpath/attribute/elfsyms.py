"""hpcprof's last resort for a frame no structure file covers: the ELF symbol containing it.

hpcprof (``src/hpcprof/finalizers/directclassification.cpp``, after the kernel symbols and the
structure files) opens the frame's load module where it lies now (a relative path such as
``vdso/<hash>.vdso`` inside the measurement directory), reads its DWARF when the file or its
separate debug file has some (and the file is under ``--dwarf-max-size``, 100 MiB by default),
and otherwise its symbols: the ``.symtab``, or the ``.dynsym`` when there is no ``.symtab``;
every symbol of non-zero size, whatever its type, covering ``[value, value + size - 1)`` (the
end is inclusive in hpcprof's interval but its comparison treats it as past the end) and always
its first byte; C++ names demangled. A frame in a symbol becomes a function context reached by
a call, with nothing below it.

callpath reproduces the symbol case only: a module whose DWARF hpcprof would read returns no
symbols here, and its frames stay instruction contexts (docs/prof.md lists this).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import numpy.typing as npt

from callpath.structure.demangle import demangle

__all__ = ["DirectSymbols", "demangle"]  # demangle: re-exported for its callers

DWARF_MAX_SIZE = 100 * 1024 * 1024  # hpcprof's default --dwarf-max-size
_SYM64 = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                   ("value", "<u8"), ("size", "<u8")])
_cache: dict[str, DirectSymbols | None] = {}


class DirectSymbols:
    """One module's symbols in table order: ``lo``/``hi`` bounds and lazily read names."""

    def __init__(self, lo: npt.NDArray[np.uint64], hi: npt.NDArray[np.uint64],
                 name_offsets: npt.NDArray[np.uint32], strtab: bytes) -> None:
        self.lo, self.hi, self.name_offsets, self.strtab = lo, hi, name_offsets, strtab

    @classmethod
    def of_file(cls, path: Path) -> DirectSymbols | None:
        """The symbols hpcprof would use for the ELF file at ``path`` (memoised); None when the
        file is absent, not a 64-bit little-endian ELF file, or has DWARF hpcprof would read."""
        key = str(path)
        if key not in _cache:
            try:
                _cache[key] = cls._read(path)
            except Exception:
                # a corrupt file (pyelftools raises many kinds): no symbols; hpcprof too logs
                # "Error parsing ELF symbols" and goes on
                _cache[key] = None
        return _cache[key]

    @classmethod
    def _read(cls, path: Path) -> DirectSymbols | None:
        from callpath.structure.elf import find_debug_file, open_elf

        if not path.is_file():
            return None
        mod = open_elf(path, require_code=False)
        try:
            elf = mod.elf
            if elf.elfclass != 64 or not elf.little_endian:
                return None
            size = os.path.getsize(path)
            if mod.has_dwarf():
                if size < DWARF_MAX_SIZE:
                    return None
            else:
                alt = find_debug_file(mod)
                if alt is not None:
                    dbg = open_elf(alt, require_code=False)
                    try:
                        if dbg.has_dwarf() and size + os.path.getsize(alt) < DWARF_MAX_SIZE:
                            return None
                    finally:
                        dbg.close()
            table = None
            for sec in elf.iter_sections():
                if sec["sh_type"] == "SHT_SYMTAB":
                    table = sec
                    break
                if sec["sh_type"] == "SHT_DYNSYM":
                    table = sec
            if table is None:
                return None
            raw = bytes(table.data())
            strtab = bytes(elf.get_section(table["sh_link"]).data())
        finally:
            mod.close()
        syms = np.frombuffer(raw, _SYM64, count=len(raw) // _SYM64.itemsize)
        syms = syms[syms["size"] != 0]
        lo = syms["value"].astype(np.uint64)
        return cls(lo, lo + (syms["size"].astype(np.uint64) - np.uint64(1)),
                   syms["name"].astype(np.uint32), strtab)

    def _name(self, i: int) -> str:
        off = int(self.name_offsets[i])
        end = self.strtab.find(b"\0", off)
        raw = self.strtab[off:end if end >= 0 else len(self.strtab)] if off < len(self.strtab) \
            else b""
        return demangle(raw.decode("utf-8", "replace"))

    def find(self, ip: int) -> tuple[int, str] | None:
        """(symbol value, name) of the first symbol in table order covering ``ip``."""
        x = np.uint64(ip)
        hit = np.flatnonzero((self.lo == x) | ((self.lo <= x) & (x < self.hi)))
        if not len(hit):
            return None
        i = int(hit[0])
        return int(self.lo[i]), self._name(i)
