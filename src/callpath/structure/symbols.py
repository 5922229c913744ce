"""Procedures of a load module from its symbol tables, PLT stubs and ``.eh_frame`` FDEs.

Each procedure is an entry address, an end (first address past it), a link name and a display
name. Sources, strongest first: function symbols (``.symtab``, then ``.dynsym``, also read from a
separate debug file, where Debian keeps the ``.symtab`` of stripped libraries), PLT stubs named
``callee@plt`` from their ``R_X86_64_JUMP_SLOT`` relocation (``targ<addr>@plt`` when there is
none, as hpcstruct names them), and FDE ranges for code no symbol covers (named
``targ<addr>``), so that even a fully stripped binary has procedures and loops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from callpath.errors import FormatError
from callpath.structure.demangle import demangle
from callpath.structure.elf import ElfModule

_BIND_RANK = {"STB_GLOBAL": 0, "STB_WEAK": 1, "STB_LOCAL": 2}


@dataclass
class Procedure:
    entry: int
    end: int
    link_name: str
    name: str
    origin: str  # "symbol", "plt", "fde", "dwarf"


@dataclass
class _Cand:
    entry: int
    size: int
    name: str
    rank: tuple[int, int, int, int]
    origin: str


_SYM64 = None


def _sym64() -> Any:
    global _SYM64
    if _SYM64 is None:
        import numpy as np
        _SYM64 = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"),
                           ("shndx", "<u2"), ("value", "<u8"), ("size", "<u8")])
    return _SYM64


def function_symbols(elf: Any, path: str) -> list[_Cand]:
    """Defined function symbols of ``.symtab`` and ``.dynsym`` (ifuncs included).

    64-bit little-endian tables are read as one numpy array and filtered vectorised (pyelftools
    builds a parsed object per symbol: 3 s for libpython's 27k symbols); other ELF classes go
    through pyelftools.
    """
    if getattr(elf, "elfclass", 64) != 64 or not getattr(elf, "little_endian", True):
        return _function_symbols_slow(elf, path)
    import numpy as np

    out: list[_Cand] = []
    try:
        for tab_rank, secname in enumerate((".symtab", ".dynsym")):
            sec = elf.get_section_by_name(secname)
            if sec is None or sec["sh_type"] == "SHT_NOBITS" or not hasattr(sec, "iter_symbols"):
                continue
            raw = bytes(sec.data())
            strtab = bytes(elf.get_section(sec["sh_link"]).data())
            dt = _sym64()
            syms = np.frombuffer(raw, dt, count=len(raw) // dt.itemsize)
            typ = syms["info"] & 0xF
            keep = (((typ == 2) | (typ == 10)) & (syms["shndx"] != 0)
                    & (syms["shndx"] != 0xFFF1) & (syms["value"] != 0) & (syms["name"] != 0))
            sel = syms[keep]
            for noff, info, value, size in zip(sel["name"].tolist(), sel["info"].tolist(),
                                               sel["value"].tolist(), sel["size"].tolist(),
                                               strict=True):
                end = strtab.find(b"\0", noff)
                if noff >= len(strtab):
                    raise ValueError(f"symbol name offset {noff} outside the string table")
                name = strtab[noff:end if end >= 0 else len(strtab)].decode("utf-8", "replace")
                if secname == ".dynsym":
                    name = name.split("@", 1)[0]
                bind = info >> 4
                rank = (tab_rank, 0 if size else 1, _BIND_RANK_NUM.get(bind, 3),
                        int(name.startswith("_")))
                out.append(_Cand(value, size, name, rank, "symbol"))
    except Exception as e:
        raise FormatError(path, f"corrupt symbol table: {e}") from None
    return out


_BIND_RANK_NUM = {1: 0, 2: 1, 0: 2}  # STB_GLOBAL, STB_WEAK, STB_LOCAL


def _function_symbols_slow(elf: Any, path: str) -> list[_Cand]:
    out: list[_Cand] = []
    try:
        for tab_rank, secname in enumerate((".symtab", ".dynsym")):
            sec = elf.get_section_by_name(secname)
            if sec is None or not hasattr(sec, "iter_symbols"):
                continue
            for sym in sec.iter_symbols():
                st = sym["st_info"]
                if st["type"] not in ("STT_FUNC", "STT_GNU_IFUNC"):
                    continue
                if sym["st_shndx"] in ("SHN_UNDEF", "SHN_ABS") or not sym.name:
                    continue
                value = int(sym["st_value"])
                if value == 0:
                    continue
                name = sym.name.split("@", 1)[0] if secname == ".dynsym" else sym.name
                size = int(sym["st_size"])
                rank = (tab_rank, 0 if size else 1, _BIND_RANK.get(st["bind"], 3),
                        int(name.startswith("_")))
                out.append(_Cand(value, size, name, rank, "symbol"))
    except Exception as e:
        raise FormatError(path, f"corrupt symbol table: {e}") from None
    return out


def plt_stubs(mod: ElfModule) -> list[_Cand]:
    """PLT entries as procedures named after the function their GOT slot is relocated to."""
    import iced_x86

    elf = mod.elf
    slot_names: dict[int, str] = {}
    try:
        fast = _rela_plt_names(mod)
        if fast is not None:
            slot_names = fast
        for secname in () if fast is not None else (".rela.plt", ".rel.plt"):
            rel = elf.get_section_by_name(secname)
            if rel is None or not hasattr(rel, "iter_relocations"):
                continue
            symtab = elf.get_section(rel["sh_link"])
            for r in rel.iter_relocations():
                idx = r["r_info_sym"]
                if idx and symtab is not None and hasattr(symtab, "get_symbol"):
                    slot_names[int(r["r_offset"])] = symtab.get_symbol(idx).name.split("@", 1)[0]
    except Exception as e:
        raise FormatError(mod.path, f"corrupt PLT relocations: {e}") from None
    out: list[_Cand] = []
    for sec in mod.text_sections:
        if sec.name not in (".plt", ".plt.sec", ".plt.got"):
            continue
        step = 8 if sec.name == ".plt.got" and sec.size % 16 else 16
        first = 1 if sec.name == ".plt" else 0
        data = sec.data[0:sec.size]
        known = _plt_slots(data, sec.addr, step)
        for off in range(first * step, sec.size - step + 1, step):
            slot: int | None = known.get(off)
            if slot is None:
                dec = iced_x86.Decoder(64, data[off:off + step], ip=sec.addr + off)
                for ins in dec:
                    if ins.is_jmp_near_indirect and ins.is_ip_rel_memory_operand:
                        slot = int(ins.ip_rel_memory_address)
                        break
            if slot is None and sec.name == ".plt":  # not a stub (lazy-binding trampoline)
                continue
            addr = sec.addr + off
            name = slot_names.get(slot, f"targ{addr:x}") if slot is not None else f"targ{addr:x}"
            out.append(_Cand(addr, step, f"{name}@plt", (0, 0, 0, 0), "plt"))
    return out


def _plt_slots(data: bytes, addr: int, step: int) -> dict[int, int]:
    """GOT slot of each stub (by offset) that starts with one of the usual jumps through it,
    recognised by its bytes with numpy: ``jmp *d32(%rip)``, or after ``endbr64`` that or
    ``bnd jmp *d32(%rip)`` (libtorch_cpu.so has 43k stubs: decoding each was 0.3 s); the
    others are decoded instruction by instruction."""
    n = len(data) // step
    if n == 0 or step < 6:
        return {}
    b = np.frombuffer(data, dtype=np.uint8, count=n * step).reshape(n, step).astype(np.int64)
    off = np.arange(n, dtype=np.int64) * step
    out: dict[int, int] = {}
    endbr = ((b[:, 0] == 0xF3) & (b[:, 1] == 0x0F) & (b[:, 2] == 0x1E) & (b[:, 3] == 0xFA)
             if step >= 4 else np.zeros(n, bool))
    for at, mask in ((0, np.ones(n, bool)), (4, endbr), (5, endbr)):
        # (position of the jump's FF 25, precondition); at 5: after the bnd prefix F2 at 4
        if at + 6 > step:
            continue
        m = mask & (b[:, at] == 0xFF) & (b[:, at + 1] == 0x25)
        if at == 5:
            m &= b[:, 4] == 0xF2
        d = b[:, at + 2] | (b[:, at + 3] << 8) | (b[:, at + 4] << 16) | (b[:, at + 5] << 24)
        d = np.where(d >= 1 << 31, d - (1 << 32), d)
        slot = addr + off + at + 6 + d
        for o, sl in zip(off[m].tolist(), slot[m].tolist(), strict=True):
            out.setdefault(o, sl)
    return out


def _rela_plt_names(mod: ElfModule) -> dict[int, str] | None:
    """GOT slot -> symbol name of a 64-bit little-endian ``.rela.plt``, read as numpy arrays
    (pyelftools parses a construct per relocation and per symbol: 19 s for libtorch_cpu.so's
    43k PLT relocations), its sections found by the headers read directly where there are
    some; None for other layouts, which take the pyelftools path."""
    elf = mod.elf
    if getattr(elf, "elfclass", 64) != 64 or not getattr(elf, "little_endian", True):
        return None
    h = mod.headers
    if h is not None:
        if h.section(".rel.plt") is not None:
            return None
        c = h.section(".rela.plt")
        if c is None:
            return {}
        if c.type != 4 or c.flags & 0x800 or not 0 <= c.link < len(h.sections):  # SHT_RELA
            return None
        sym = h.sections[c.link]
        if sym.type not in (2, 11) or not 0 <= sym.link < len(h.sections):  # SYMTAB, DYNSYM
            return None
        got = [mod.header_bytes(x) for x in (c, sym, h.sections[sym.link])]
        if any(g is None for g in got):
            return None
        raw, sraw, strtab = (g or b"" for g in got)
    else:
        if elf.get_section_by_name(".rel.plt") is not None:
            return None
        rel = elf.get_section_by_name(".rela.plt")
        if rel is None:
            return {}
        if rel["sh_type"] != "SHT_RELA" or rel["sh_entsize"] not in (0, 24):
            return None
        symtab = elf.get_section(rel["sh_link"])
        if symtab is None or symtab["sh_type"] not in ("SHT_DYNSYM", "SHT_SYMTAB"):
            return None
        raw = bytes(rel.data())
        sraw = bytes(symtab.data())
        strtab = bytes(elf.get_section(symtab["sh_link"]).data())
    rela = np.frombuffer(raw, np.dtype([("offset", "<u8"), ("info", "<u8"), ("addend", "<i8")]),
                         count=len(raw) // 24)
    syms = np.frombuffer(sraw, _sym64(), count=len(sraw) // _sym64().itemsize)
    idx = (rela["info"] >> np.uint64(32)).astype(np.int64)
    keep = (idx > 0) & (idx < len(syms))
    out: dict[int, str] = {}
    for slot, noff in zip(rela["offset"][keep].tolist(), syms["name"][idx[keep]].tolist(),
                          strict=True):
        end = strtab.find(b"\0", noff)
        out[slot] = strtab[noff:end if end >= 0 else len(strtab)].decode(
            "utf-8", "replace").split("@", 1)[0]
    return out


def fde_ranges(mod: ElfModule) -> list[tuple[int, int]]:
    """``[start, end)`` of every FDE in ``.eh_frame``: code ranges even of stripped binaries."""
    try:
        dw = mod.elf.get_dwarf_info(relocate_dwarf_sections=False)
        if not dw.has_EH_CFI():
            return []
        out = []
        for e in dw.EH_CFI_entries():
            h = getattr(e, "header", None)  # ZERO: a terminator inside .eh_frame
            if h is not None and "initial_location" in h:
                out.append((int(h["initial_location"]),
                            int(h["initial_location"]) + int(h["address_range"])))
        return out
    except Exception as e:
        raise FormatError(mod.path, f"corrupt .eh_frame: {e}") from None


#: A file range: (path, offset, size).
Where = tuple[str, int, int]

#: ``ProcedureTable.origin`` codes.
ORIGINS = ("symbol", "plt", "fde", "dwarf", "section")


class ProcedureTable(Sequence[Procedure]):
    """The procedures of a module as arrays (sorted by entry): entry, end, origin, and each
    link name as a byte range of one of a few blobs (the ELF string tables themselves).

    libtorch_cpu.so has 385k procedures; a Python object and a decoded string per procedure
    were seconds that a run building a few hundred of them does not need. Names are decoded
    when a procedure is made into a :class:`Procedure` (``table[i]``, its name left
    undemangled) or asked for (:meth:`link_name`)."""

    def __init__(self, entry: npt.NDArray[np.uint64], end: npt.NDArray[np.uint64],
                 origin: npt.NDArray[np.uint8], blobs: list[bytes],
                 src: npt.NDArray[np.int32], nlo: npt.NDArray[np.int64],
                 nhi: npt.NDArray[np.int64], wheres: list[Where | None] | None = None) -> None:
        self.entry, self.end, self.origin = entry, end, origin
        self.blobs, self.src, self.nlo, self.nhi = blobs, src, nlo, nhi
        #: per blob, the file range it is a copy of (a string table), if it is one
        self.wheres: list[Where | None] = wheres or [None] * len(blobs)

    def __len__(self) -> int:
        return len(self.entry)

    @overload
    def __getitem__(self, i: int) -> Procedure: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Procedure]: ...

    def __getitem__(self, i: int | slice) -> Procedure | Sequence[Procedure]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        name = self.link_name(i)
        return Procedure(int(self.entry[i]), int(self.end[i]), name, name,
                         ORIGINS[int(self.origin[i])])

    def link_name(self, i: int) -> str:
        return self.blobs[int(self.src[i])][int(self.nlo[i]):int(self.nhi[i])].decode(
            "utf-8", "replace")

    def procedures(self, demangle_names: bool) -> list[Procedure]:
        """Every procedure as an object (whole-binary structure builds them all)."""
        out = []
        for a, e, o, s, lo, hi in zip(self.entry.tolist(), self.end.tolist(),
                                      self.origin.tolist(), self.src.tolist(),
                                      self.nlo.tolist(), self.nhi.tolist(), strict=True):
            name = self.blobs[s][lo:hi].decode("utf-8", "replace")
            out.append(Procedure(a, e, name, demangle(name) if demangle_names else name,
                                 ORIGINS[o]))
        return out

    def names_blob(self) -> bytes:
        """Every link name, NUL-separated, in entry order (as :meth:`from_blob` reads)."""
        blobs = self.blobs
        return b"\0".join([blobs[s][lo:hi] for s, lo, hi in zip(
            self.src.tolist(), self.nlo.tolist(), self.nhi.tolist(), strict=True)])

    @classmethod
    def from_blob(cls, entry: npt.NDArray[np.uint64], end: npt.NDArray[np.uint64],
                  origin: npt.NDArray[np.uint8], blob: bytes) -> ProcedureTable:
        """The table whose names are the NUL-separated ``blob`` (:meth:`names_blob`)."""
        zeros = np.flatnonzero(np.frombuffer(blob, dtype=np.uint8) == 0).astype(np.int64)
        if len(zeros) + 1 != len(entry):
            raise ValueError("procedure names and entries differ in number")
        nlo = np.concatenate([np.zeros(1, np.int64), zeros + 1])
        nhi = np.concatenate([zeros, np.array([len(blob)], np.int64)])
        return cls(entry, end, origin, [blob], np.zeros(len(entry), np.int32), nlo, nhi)


def procedures(mod: ElfModule, extra_symbol_elves: list[Any] | None = None,
               dwarf_entries: list[tuple[int, int, str, str]] | None = None, *,
               demangle_names: bool = True) -> list[Procedure]:
    """All procedures of ``mod``, sorted by entry, each ending where the next one starts at the
    latest. ``dwarf_entries`` are ``(low_pc, high_pc, name, link name)`` of DWARF subprograms,
    used for code that no symbol names. ``demangle_names`` False leaves ``name`` equal to the
    link name (the caller demangles the few it shows)."""
    return procedure_table(mod, extra_symbol_elves, dwarf_entries).procedures(demangle_names)


def procedure_table(mod: ElfModule, extra_symbol_elves: list[Any] | None = None,
                    dwarf_entries: list[tuple[int, int, str, str]] | None = None, *,
                    base: SymbolCandidates | None = None) -> ProcedureTable:
    """:func:`procedures` as a :class:`ProcedureTable`: the best symbol per entry, DWARF
    subprograms no symbol names, FDEs (only without symbols) and the ``.init``/``.fini``
    sections; ends cut at the next entry. ``base``: :func:`symbol_candidates` of the same
    files, when already read."""
    if base is None:
        base = symbol_candidates(mod, extra_symbol_elves)
    return _finish(mod, base, dwarf_entries)


def symbol_candidates(mod: ElfModule, extra_symbol_elves: list[Any] | None = None
                      ) -> SymbolCandidates:
    """The best symbol or PLT stub per entry (``origin`` 0 for symbols, 1 for stubs)."""
    base = _best_symbols_fast(mod, extra_symbol_elves or [])
    if base is None:
        base = _best_symbols_slow(mod, extra_symbol_elves or [])
    return base


@dataclass
class SymbolCandidates:
    """Candidates as arrays, one per entry, sorted by entry."""

    entry: npt.NDArray[np.uint64]
    size: npt.NDArray[np.uint64]
    origin: npt.NDArray[np.uint8]
    src: npt.NDArray[np.int32]
    nlo: npt.NDArray[np.int64]
    nhi: npt.NDArray[np.int64]
    blobs: list[bytes]
    wheres: list[Where | None]


def _from_cands(cands: list[_Cand], blobs: list[bytes], wheres: list[Where | None]
                ) -> SymbolCandidates:
    """Candidates (distinct entries) as arrays, their names joined into one more blob."""
    cands = sorted(cands, key=lambda c: c.entry)
    raw = [c.name.encode("utf-8", "surrogatepass") for c in cands]
    lens = np.array([len(r) for r in raw], dtype=np.int64)
    nlo = np.zeros(len(raw), np.int64)
    if len(raw):
        nlo[1:] = np.cumsum(lens + 1)[:-1]
    return SymbolCandidates(np.array([c.entry for c in cands], dtype=np.uint64),
                 np.array([c.size for c in cands], dtype=np.uint64),
                 np.array([ORIGINS.index(c.origin) for c in cands], dtype=np.uint8),
                 np.full(len(raw), len(blobs), np.int32), nlo, nlo + lens,
                 [*blobs, b"\0".join(raw)], [*wheres, None])


def _best_symbols_slow(mod: ElfModule, extra: list[Any]) -> SymbolCandidates:
    secs = mod.text_sections
    cands = function_symbols(mod.elf, mod.path)
    for e in extra:
        cands += function_symbols(e, mod.path)
    cands += plt_stubs(mod)

    def in_text(a: int) -> bool:
        return any(s.addr <= a < s.addr + s.size for s in secs)

    best: dict[int, _Cand] = {}
    for c in cands:
        if not in_text(c.entry):
            continue
        old = best.get(c.entry)
        if old is None or (c.rank, len(c.name), c.name) < (old.rank, len(old.name), old.name):
            best[c.entry] = c
    return _from_cands(list(best.values()), [], [])


def _finish(mod: ElfModule, base: SymbolCandidates,
            dwarf_entries: list[tuple[int, int, str, str]] | None) -> ProcedureTable:
    secs = mod.text_sections

    def in_text(a: int) -> bool:
        return any(s.addr <= a < s.addr + s.size for s in secs)

    def in_base(a: int) -> bool:
        k = int(np.searchsorted(base.entry, np.uint64(a)))
        return k < len(base.entry) and int(base.entry[k]) == a

    added: dict[int, _Cand] = {}
    for lo, hi, name, link in dwarf_entries or []:
        if lo not in added and not in_base(lo) and in_text(lo):
            added[lo] = _Cand(lo, hi - lo, link or name, (5, 0, 0, 0), "dwarf")
    if not (base.origin == 0).any():
        for lo, hi in fde_ranges(mod):
            if lo not in added and not in_base(lo) and in_text(lo):
                added[lo] = _Cand(lo, hi - lo, f"targ{lo:x}", (6, 0, 0, 0), "fde")
    # The section starts of .init/.fini are procedures even without symbols.
    for s in secs:
        if s.name in (".init", ".fini") and s.addr not in added and not in_base(s.addr):
            added[s.addr] = _Cand(s.addr, s.size, s.name.lstrip("._"), (7, 0, 0, 0), "section")
    if added:
        more = _from_cands(list(added.values()), base.blobs, base.wheres)
        entries = np.concatenate([base.entry, more.entry])
        order = np.argsort(entries, kind="stable")
        entries = entries[order]
        size = np.concatenate([base.size, more.size])[order]
        origin = np.concatenate([base.origin, more.origin])[order]
        src = np.concatenate([base.src, more.src])[order]
        nlo = np.concatenate([base.nlo, more.nlo])[order]
        nhi = np.concatenate([base.nhi, more.nhi])[order]
        blobs, wheres = more.blobs, more.wheres
    else:
        entries, size, origin = base.entry, base.size, base.origin
        src, nlo, nhi, blobs, wheres = base.src, base.nlo, base.nhi, base.blobs, base.wheres
    sec_lo = np.array([s.addr for s in secs], dtype=np.uint64)
    sec_hi = np.array([s.addr + s.size for s in secs], dtype=np.uint64)
    # every entry is in a text section (candidates outside were dropped): the section's end,
    # or the next entry if it comes first, bounds it
    limit = sec_hi[np.searchsorted(sec_lo, entries, side="right") - 1] if len(entries) else \
        entries
    nxt = np.append(entries[1:], np.uint64(np.iinfo(np.uint64).max))
    limit = np.minimum(limit, nxt)
    end = np.where(size > 0, np.minimum(entries + size, limit), limit)
    end = np.maximum(end, entries + np.uint64(1)).astype(np.uint64)
    return ProcedureTable(entries.astype(np.uint64), end, origin.astype(np.uint8), blobs,
                          src.astype(np.int32), nlo.astype(np.int64), nhi.astype(np.int64),
                          wheres)


def _symbol_tables(mod: ElfModule, elf: Any
                   ) -> list[tuple[int, bytes, bytes, Where | None]] | None:
    """``(rank, symbols, string table, where that is in a file)`` of ``.symtab`` (rank 0) and
    ``.dynsym`` (rank 1), from the section headers read directly when ``elf`` is the
    module's own (pyelftools makes an object of every section to find one by name, parsing
    the GNU hash table too); None for other than 64-bit little-endian files."""
    if getattr(elf, "elfclass", 64) != 64 or not getattr(elf, "little_endian", True):
        return None
    out: list[tuple[int, bytes, bytes, Where | None]] = []
    h = mod.headers if elf is mod.elf else None
    for tab_rank, secname in enumerate((".symtab", ".dynsym")):
        if h is not None:
            c = h.section(secname)
            if c is None or c.type == 8 or c.flags & 0x800 or not 0 <= c.link < len(h.sections):
                if c is None or c.type == 8:
                    continue
                h = None  # compressed or odd: pyelftools' way
            elif c.type not in (2, 11):  # not SHT_SYMTAB / SHT_DYNSYM
                continue
            else:
                sc = h.sections[c.link]
                raw_, strtab_ = mod.header_bytes(c), mod.header_bytes(sc)
                if raw_ is not None and strtab_ is not None:
                    out.append((tab_rank, raw_, strtab_, (mod.path, sc.offset, sc.size)))
                    continue
                h = None
        sec = elf.get_section_by_name(secname)
        if sec is None or sec["sh_type"] == "SHT_NOBITS" or not hasattr(sec, "iter_symbols"):
            continue
        st = elf.get_section(sec["sh_link"])
        path = getattr(elf.stream, "name", None)
        where = None
        if isinstance(path, str) and not int(st["sh_flags"]) & 0x800:  # not SHF_COMPRESSED
            where = (path, int(st["sh_offset"]), int(st["sh_size"]))
        out.append((tab_rank, bytes(sec.data()), bytes(st.data()), where))
    return out


def _best_symbols_fast(mod: ElfModule, extra: list[Any]) -> SymbolCandidates | None:
    """The best candidate per entry, as :func:`_best_symbols_slow` chooses it (least
    ``(rank, len(name), name)``, the first seen among equals), with the symbol tables read and
    ranked as numpy arrays: a Python object per symbol was seconds for libtorch_cpu.so's 441k
    function symbols. Names stay byte ranges of the string tables. None (take the general
    path) for other than 64-bit little-endian files or string tables with non-ASCII bytes
    (where a name's length in characters is not its length in bytes)."""
    blobs: list[bytes] = []
    wheres: list[Where | None] = []
    offs: list[npt.NDArray[np.int64]] = []
    cols: dict[str, list[npt.NDArray[Any]]] = {k: [] for k in (
        "entry", "size", "r0", "r1", "r2", "r3", "nlen", "src", "idx")}
    for elf in [mod.elf, *extra]:
        try:
            tabs = _symbol_tables(mod, elf)
            if tabs is None:
                return None
            for tab_rank, raw, strtab, where in tabs:
                st = np.frombuffer(strtab, dtype=np.uint8)
                if len(st) and int(st.max()) >= 128:  # (a comparison: 0.17 s on 76 MB)
                    return None
                dt = _sym64()
                syms = np.frombuffer(raw, dt, count=len(raw) // dt.itemsize)
                typ = syms["info"] & 0xF
                keep = (((typ == 2) | (typ == 10)) & (syms["shndx"] != 0)
                        & (syms["shndx"] != 0xFFF1) & (syms["value"] != 0)
                        & (syms["name"] != 0))
                sel = syms[keep]
                noff = sel["name"].astype(np.int64)
                if len(noff) and int(noff.max()) >= len(strtab):
                    raise ValueError(f"symbol name offset {int(noff.max())} outside the "
                                     "string table")
                zeros = np.append(np.flatnonzero(st == 0), len(strtab))
                nend = zeros[np.searchsorted(zeros, noff)]
                if tab_rank == 1:  # .dynsym: versioned names, up to the '@'
                    ats = np.append(np.flatnonzero(st == ord("@")), len(strtab))
                    nend = np.minimum(nend, ats[np.searchsorted(ats, noff)])
                bind = (sel["info"] >> 4).astype(np.int64)
                cols["entry"].append(sel["value"].astype(np.uint64))
                cols["size"].append(sel["size"].astype(np.uint64))
                cols["r0"].append(np.full(len(sel), tab_rank, np.int64))
                cols["r1"].append((sel["size"] == 0).astype(np.int64))
                cols["r2"].append(np.select([bind == 1, bind == 2, bind == 0], [0, 1, 2], 3))
                first = st[np.minimum(noff, len(st) - 1)] if len(st) else np.zeros(0, np.uint8)
                cols["r3"].append(((first == ord("_")) & (nend > noff)).astype(np.int64))
                cols["nlen"].append(nend - noff)
                cols["src"].append(np.full(len(sel), len(blobs), np.int64))
                cols["idx"].append(np.arange(len(sel), dtype=np.int64))
                blobs.append(strtab)
                wheres.append(where)
                offs.append(np.stack([noff, nend]))
        except (ValueError, IndexError, KeyError) as e:
            raise FormatError(mod.path, f"corrupt symbol table: {e}") from None
        except FormatError:
            raise
        except Exception as e:
            raise FormatError(mod.path, f"corrupt symbol table: {e}") from None
    plt = plt_stubs(mod)
    plt_src = len(blobs)
    if plt:
        raw_names = [c.name.encode() for c in plt]
        lens = np.array([len(r) for r in raw_names], dtype=np.int64)
        lo = np.zeros(len(plt), np.int64)
        lo[1:] = np.cumsum(lens + 1)[:-1]
        blobs.append(b"\0".join(raw_names))
        wheres.append(None)
        offs.append(np.stack([lo, lo + lens]))
        cols["entry"].append(np.array([c.entry for c in plt], dtype=np.uint64))
        cols["size"].append(np.array([c.size for c in plt], dtype=np.uint64))
        for k in ("r0", "r1", "r2", "r3"):
            cols[k].append(np.zeros(len(plt), np.int64))
        cols["nlen"].append(lens)
        cols["src"].append(np.full(len(plt), plt_src, np.int64))
        cols["idx"].append(np.arange(len(plt), dtype=np.int64))
    if not cols["entry"]:
        return _from_cands([], [], [])
    c = {k: np.concatenate(v) for k, v in cols.items()}
    secs = mod.text_sections
    sec_lo = np.array([s.addr for s in secs], dtype=np.uint64)
    sec_hi = np.array([s.addr + s.size for s in secs], dtype=np.uint64)
    j = np.searchsorted(sec_lo, c["entry"], side="right") - 1
    ok = (j >= 0) & (c["entry"] < sec_hi[np.maximum(j, 0)]) if len(secs) else \
        np.zeros(len(c["entry"]), bool)
    c = {k: v[ok] for k, v in c.items()}
    order = np.lexsort((np.arange(len(c["entry"])), c["nlen"], c["r3"], c["r2"], c["r1"],
                        c["r0"], c["entry"]))
    c = {k: v[order] for k, v in c.items()}
    key = np.stack([c["r0"], c["r1"], c["r2"], c["r3"], c["nlen"]])
    n = len(c["entry"])
    head = np.ones(n, dtype=bool)
    head[1:] = c["entry"][1:] != c["entry"][:-1]
    # a tie: the next candidate of the same entry has the same rank and name length, so the
    # names decide (rare: resolved in Python, the first of the least names winning)
    tie = np.zeros(n, dtype=bool)
    tie[:-1] = ~head[1:] & (key[:, 1:] == key[:, :-1]).all(axis=0)
    nlo = np.zeros(n, np.int64)
    nhi = np.zeros(n, np.int64)
    for t, off in enumerate(offs):
        sel = np.flatnonzero(c["src"] == t)
        nlo[sel] = off[0, c["idx"][sel]]
        nhi[sel] = off[1, c["idx"][sel]]
    win = np.flatnonzero(head)
    heads = np.flatnonzero(head & tie)
    if len(heads):  # a group runs from its head to the first candidate not tied to the next
        untied = np.flatnonzero(~tie)
        last = untied[np.searchsorted(untied, heads)]
        rows = np.concatenate([np.arange(h, m + 1) for h, m in zip(heads.tolist(),
                                                                    last.tolist(), strict=True)])
        names = [blobs[s_][a:b] for s_, a, b in zip(c["src"][rows].tolist(),
                                                   nlo[rows].tolist(), nhi[rows].tolist(),
                                                   strict=True)]
        pos = np.searchsorted(win, heads).tolist()
        at_row = 0
        for h, m, at in zip(heads.tolist(), last.tolist(), pos, strict=True):
            group = names[at_row:at_row + m - h + 1]
            at_row += m - h + 1
            if any(g != group[0] for g in group):
                best = min(range(len(group)), key=lambda x: group[x].decode("utf-8", "replace"))
                win[at] = h + best
    origin = np.where(c["src"][win] == plt_src, 1, 0).astype(np.uint8)
    return SymbolCandidates(c["entry"][win], c["size"][win], origin, c["src"][win].astype(np.int32),
                 nlo[win], nhi[win], blobs, wheres)
