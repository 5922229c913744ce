"""Procedures of a load module from its symbol tables, PLT stubs and ``.eh_frame`` FDEs.

Each procedure is an entry address, an end (first address past it), a link name and a display
name. Sources, strongest first: function symbols (``.symtab``, then ``.dynsym``, also read from a
separate debug file, where Debian keeps the ``.symtab`` of stripped libraries), PLT stubs named
``callee@plt`` from their ``R_X86_64_JUMP_SLOT`` relocation (``targ<addr>@plt`` when there is
none, as hpcstruct names them), and FDE ranges for code no symbol covers (named
``targ<addr>``), so that even a fully stripped binary has procedures and loops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
        fast = _rela_plt_names(elf)
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
        for off in range(first * step, sec.size - step + 1, step):
            dec = iced_x86.Decoder(64, sec.data[off:off + step], ip=sec.addr + off)
            slot = None
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


def _rela_plt_names(elf: Any) -> dict[int, str] | None:
    """GOT slot -> symbol name of a 64-bit little-endian ``.rela.plt``, read as numpy arrays
    (pyelftools parses a construct per relocation and per symbol: 19 s for libtorch_cpu.so's
    43k PLT relocations); None for other layouts, which take the pyelftools path."""
    import numpy as np

    if getattr(elf, "elfclass", 64) != 64 or not getattr(elf, "little_endian", True):
        return None
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
    rela = np.frombuffer(raw, np.dtype([("offset", "<u8"), ("info", "<u8"), ("addend", "<i8")]),
                         count=len(raw) // 24)
    sraw = bytes(symtab.data())
    syms = np.frombuffer(sraw, _sym64(), count=len(sraw) // _sym64().itemsize)
    strtab = bytes(elf.get_section(symtab["sh_link"]).data())
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


def procedures(mod: ElfModule, extra_symbol_elves: list[Any] | None = None,
               dwarf_entries: list[tuple[int, int, str, str]] | None = None, *,
               demangle_names: bool = True) -> list[Procedure]:
    """All procedures of ``mod``, sorted by entry, each ending where the next one starts at the
    latest. ``dwarf_entries`` are ``(low_pc, high_pc, name, link name)`` of DWARF subprograms,
    used for code that no symbol names. ``demangle_names`` False leaves ``name`` equal to the
    link name (the caller demangles the few it shows)."""
    secs = mod.text_sections
    fast = _best_symbols_fast(mod, extra_symbol_elves or [])
    if fast is not None:
        return _finish(mod, fast, dwarf_entries, demangle_names)
    cands = function_symbols(mod.elf, mod.path)
    for e in extra_symbol_elves or []:
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
    return _finish(mod, best, dwarf_entries, demangle_names)


def _finish(mod: ElfModule, best: dict[int, _Cand],
            dwarf_entries: list[tuple[int, int, str, str]] | None,
            demangle_names: bool) -> list[Procedure]:
    """Procedures from the best symbol per entry, DWARF subprograms no symbol names, FDEs
    (only without symbols) and the ``.init``/``.fini`` sections; ends cut at the next entry."""
    secs = mod.text_sections

    def in_text(a: int) -> bool:
        return any(s.addr <= a < s.addr + s.size for s in secs)

    for lo, hi, name, link in dwarf_entries or []:
        if lo not in best and in_text(lo):
            best[lo] = _Cand(lo, hi - lo, link or name, (5, 0, 0, 0), "dwarf")
    if not any(c.origin == "symbol" for c in best.values()):
        for lo, hi in fde_ranges(mod):
            if lo not in best and in_text(lo):
                best[lo] = _Cand(lo, hi - lo, f"targ{lo:x}", (6, 0, 0, 0), "fde")
    # The section starts of .init/.fini are procedures even without symbols.
    for s in secs:
        if s.name in (".init", ".fini") and s.addr not in best:
            best[s.addr] = _Cand(s.addr, s.size, s.name.lstrip("._"), (7, 0, 0, 0), "section")
    import numpy as np

    entries = np.array(sorted(best), dtype=np.uint64)
    sec_lo = np.array([s.addr for s in secs], dtype=np.uint64)
    sec_hi = np.array([s.addr + s.size for s in secs], dtype=np.uint64)
    # every entry is in a text section (candidates outside were dropped): the section's end,
    # or the next entry if it comes first, bounds it
    limit = sec_hi[np.searchsorted(sec_lo, entries, side="right") - 1] if len(entries) else \
        entries
    nxt = np.append(entries[1:], np.uint64(np.iinfo(np.uint64).max))
    limit = np.minimum(limit, nxt)
    cands = [best[a] for a in entries.tolist()]
    size = np.array([c.size for c in cands], dtype=np.uint64)
    end = np.where(size > 0, np.minimum(entries + size, limit), limit)
    end = np.maximum(end, entries + np.uint64(1))
    # shown demangled, as hpcstruct's n= (its ln= keeps the linkage name)
    return [Procedure(a, e, c.name, demangle(c.name) if demangle_names else c.name, c.origin)
            for a, e, c in zip(entries.tolist(), end.tolist(), cands, strict=True)]


def _best_symbols_fast(mod: ElfModule, extra: list[Any]) -> dict[int, _Cand] | None:
    """The best candidate per entry, as :func:`procedures` chooses it (least ``(rank,
    len(name), name)``, the first seen among equals), with the symbol tables read and ranked
    as numpy arrays: a Python object per symbol was seconds for libtorch_cpu.so's 441k
    function symbols. Only the winners' names are decoded. None (take the general path) for
    other than 64-bit little-endian files or string tables with non-ASCII bytes (where a
    name's length in characters is not its length in bytes)."""
    import numpy as np

    tables: list[tuple[bytes, npt.NDArray[Any], bool]] = []  # strtab, name offsets, dynsym
    cols: dict[str, list[npt.NDArray[Any]]] = {k: [] for k in (
        "entry", "size", "r0", "r1", "r2", "r3", "nlen", "src", "idx")}
    for elf in [mod.elf, *extra]:
        if getattr(elf, "elfclass", 64) != 64 or not getattr(elf, "little_endian", True):
            return None
        try:
            for tab_rank, secname in enumerate((".symtab", ".dynsym")):
                sec = elf.get_section_by_name(secname)
                if (sec is None or sec["sh_type"] == "SHT_NOBITS"
                        or not hasattr(sec, "iter_symbols")):
                    continue
                raw = bytes(sec.data())
                strtab = bytes(elf.get_section(sec["sh_link"]).data())
                st = np.frombuffer(strtab, dtype=np.uint8)
                if (st >= 128).any():
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
                if secname == ".dynsym":  # versioned names: up to the '@'
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
                cols["src"].append(np.full(len(sel), len(tables), np.int64))
                cols["idx"].append(np.arange(len(sel), dtype=np.int64))
                tables.append((strtab, np.stack([noff, nend]), secname == ".dynsym"))
        except (ValueError, IndexError, KeyError) as e:
            raise FormatError(mod.path, f"corrupt symbol table: {e}") from None
        except Exception as e:
            raise FormatError(mod.path, f"corrupt symbol table: {e}") from None
    plt = plt_stubs(mod)
    plt_src = len(tables)
    if plt:
        cols["entry"].append(np.array([c.entry for c in plt], dtype=np.uint64))
        cols["size"].append(np.array([c.size for c in plt], dtype=np.uint64))
        for k in ("r0", "r1", "r2", "r3"):
            cols[k].append(np.zeros(len(plt), np.int64))
        cols["nlen"].append(np.array([len(c.name) for c in plt], dtype=np.int64))
        cols["src"].append(np.full(len(plt), plt_src, np.int64))
        cols["idx"].append(np.arange(len(plt), dtype=np.int64))
    if not cols["entry"]:
        return {}
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
    # names decide (rare: resolved in Python)
    tie = np.zeros(n, dtype=bool)
    tie[:-1] = ~head[1:] & (key[:, 1:] == key[:, :-1]).all(axis=0)

    def name_of(k: int) -> str:
        src, idx = int(c["src"][k]), int(c["idx"][k])
        if src == plt_src:
            return plt[idx].name
        strtab, off, _dyn = tables[src]
        return strtab[int(off[0, idx]):int(off[1, idx])].decode("utf-8", "replace")

    def cand(k: int) -> _Cand:
        src = int(c["src"][k])
        rank = (int(c["r0"][k]), int(c["r1"][k]), int(c["r2"][k]), int(c["r3"][k]))
        return _Cand(int(c["entry"][k]), int(c["size"][k]), name_of(k), rank,
                     "plt" if src == plt_src else "symbol")

    best: dict[int, _Cand] = {}
    # the winners without a tie, as plain lists (a numpy scalar per field and symbol was most
    # of the time: 12 s of 20 for libtorch_cpu.so's 385k procedures under cProfile)
    plain = np.flatnonzero(head & ~tie)
    src = c["src"][plain]
    from_plt = src == plt_src
    pnames = [plt[i].name for i in c["idx"][plain][from_plt].tolist()]
    names: list[str] = [""] * len(plain)
    for i, nm in zip(np.flatnonzero(from_plt).tolist(), pnames, strict=True):
        names[i] = nm
    for t, (strtab, off, _dyn) in enumerate(tables):
        sel = np.flatnonzero(src == t)
        ix = c["idx"][plain[sel]]
        for i, a, b in zip(sel.tolist(), off[0, ix].tolist(), off[1, ix].tolist(),
                           strict=True):
            names[i] = strtab[a:b].decode("utf-8", "replace")
    for ent, sz, r0, r1, r2, r3, nm, p in zip(
            c["entry"][plain].tolist(), c["size"][plain].tolist(), c["r0"][plain].tolist(),
            c["r1"][plain].tolist(), c["r2"][plain].tolist(), c["r3"][plain].tolist(), names,
            from_plt.tolist(), strict=True):
        best[ent] = _Cand(ent, sz, nm, (r0, r1, r2, r3), "plt" if p else "symbol")
    for h in np.flatnonzero(head & tie).tolist():
        m = h + 1
        while m + 1 < n and tie[m]:
            m += 1
        group = [cand(x) for x in range(h, m + 1)]
        best[group[0].entry] = min(group, key=lambda x: x.name)  # the first among equals
    return best
