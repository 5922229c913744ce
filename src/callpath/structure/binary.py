"""Structure of an ELF load module: procedures, inlined code, loops and lines combined.

Per procedure, the address range is cut into elementary segments at every line-table row,
inlined-range bound and basic-block bound. Each segment gets its line, its innermost inlined
scope and its innermost loop (both by painting ranges outer-to-inner with numpy), and from the
pair a scope path: the inlined frames and loops interleaved so that a loop sits inside the
inlined frames that contain its header, and inlined code inside the loops that contain it.
Segments with equal path and line become one statement with a range set; equal path prefixes
become one scope. Each call instruction is a segment and a CALL scope of its own (hpcstruct's
``C``), with its line and its direct target address (0 for indirect calls), so that a return
address maps to the call site and the static call graph can be read off the structure.
Loops carry the line of their back-edge branch: gcc rotates loops, so the header's own line is
often the loop's exit test or the first body statement instead.

Procedures without inlined code (every procedure of a library without DWARF) take a shorter
road to the same scopes: their segments are collected and assembled a batch at a time as
numpy columns (:mod:`callpath.structure.batch_scopes`).
"""

from __future__ import annotations

import os
import zlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.structure.batch_scopes import Batch, plain_proc
from callpath.structure.cfg import (
    CALL,
    COND,
    ICALL,
    INDIRECT,
    JUMP,
    Code,
    Graph,
    build_cfg,
    decode,
)
from callpath.structure.demangle import demangle
from callpath.structure.dwarf_info import DebugInfo, DwarfReader, Inlined
from callpath.structure.dwarf_lines import LineCache, LineTable, decode_line_tables
from callpath.structure.dwarf_units import UnitCache
from callpath.structure.elf import ElfModule, find_debug_file, open_elf
from callpath.structure.havlak import Loop, find_loops
from callpath.structure.jump_tables import resolve_tables
from callpath.structure.model import Kind, Structure, StructureBuilder, concat_structures
from callpath.structure.noreturn import is_no_return
from callpath.structure.parallel import fork_map
from callpath.structure.symbols import (
    Procedure,
    ProcedureTable,
    procedure_table,
    symbol_candidates,
)


@dataclass
class Debug:
    lines: LineTable
    info: DebugInfo
    source: str  # the file the DWARF came from
    #: the code each unit covers, sorted by ``lo`` (:meth:`DwarfReader.unit_ranges`); units of
    #: unknown extent as ``[0, 2**64)``
    cu_lo: npt.NDArray[np.uint64]
    cu_hi: npt.NDArray[np.uint64]
    cu_key: npt.NDArray[np.int64]


def _empty_lines() -> LineTable:
    return LineTable(np.zeros(0, np.uint64), np.zeros(0, np.int32), np.zeros(0, np.int32), [],
                     {})


def read_debug(mod: ElfModule, near: tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]
               | None = None, line_cache: LineCache | None = None,
               unit_cache: UnitCache | None = None) -> Debug | None:
    """DWARF lines and inlining of ``mod``, from itself or its separate debug file: of every
    unit, or, with ``near`` (sorted disjoint ``[lo, hi)`` address ranges), only of the units
    whose code meets them (and those of unknown extent), and in those only the subprograms
    whose code does: libpython's and libc's DWARF whole was seconds for a few hundred
    procedures. ``line_cache`` gives the units' line programs decoded by earlier runs and
    receives those decoded here; ``unit_cache`` the same for the units' subprograms and
    inlined code (:mod:`~callpath.structure.dwarf_units`)."""
    src: ElfModule | None = mod if mod.has_dwarf() else None
    opened: list[ElfModule] = []
    try:
        if src is None:
            dbg = find_debug_file(mod)
            if dbg is None:
                return None
            src = open_elf(dbg, require_code=False)
            opened.append(src)
            if not src.has_dwarf():
                return None
        alt = _alt_file(src)
        if alt is not None:
            opened.append(alt)
        get = src.section_bytes

        def open_dwo(name: str, comp_dir: str) -> tuple[str, Callable[[str], bytes | None]] | None:
            for cand in _dwo_candidates(name, comp_dir, mod.path):
                if os.path.isfile(cand):
                    dwo = open_elf(cand, require_code=False)
                    opened.append(dwo)
                    return dwo.path, dwo.section_bytes
            return None

        reader = DwarfReader(src.path, get, alt.section_bytes if alt is not None else None,
                             open_dwo)
        unknown, spans = reader.unit_ranges()
        top = np.uint64(np.iinfo(np.uint64).max)
        cu_lo = np.array([a for a, _, _ in spans] + [0] * len(unknown), dtype=np.uint64)
        cu_hi = np.array([b for _, b, _ in spans] + [top] * len(unknown), dtype=np.uint64)
        cu_key = np.array([k for _, _, k in spans] + unknown, dtype=np.int64)
        order = np.argsort(cu_lo, kind="stable")
        cu_lo, cu_hi, cu_key = cu_lo[order], cu_hi[order], cu_key[order]
        only: set[int] | None = None
        if near is not None:
            sel = _overlaps(cu_lo, cu_hi, *near)
            only = set(cu_key[sel].tolist()) | set(unknown)
            reader.near = (near[0].tolist(), near[1].tolist())
        units = reader.units(only, unit_cache)
        lines = decode_line_tables(get(".debug_line") or b"", units, path=src.path,
                                   debug_str=get(".debug_str"),
                                   debug_line_str=get(".debug_line_str"), cache=line_cache)
        info = reader.read(lines.file_of, only, unit_cache)
        return Debug(lines, info, src.path, cu_lo, cu_hi, cu_key)
    finally:
        for m in opened:
            if m is not mod:
                m.close()


def _dwo_candidates(name: str, comp_dir: str, binary: str) -> list[str]:
    """Where a split unit's ``.dwo`` may be: as named (relative to the compilation directory),
    then beside the binary (a build tree that was moved with its objects)."""
    out = [name if os.path.isabs(name) else os.path.join(comp_dir or ".", name)]
    out.append(os.path.join(os.path.dirname(os.path.abspath(binary)), os.path.basename(name)))
    return out


def _alt_file(src: ElfModule) -> ElfModule | None:
    raw = src.section_bytes(".gnu_debugaltlink")
    if not raw:
        return None
    name = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    p = name if name.startswith("/") else os.path.join(os.path.dirname(src.path), name)
    if not os.path.isfile(p):
        return None
    return open_elf(p, require_code=False)


#: ``progress(done, total)``: procedures built so far (an estimate when split over processes).
Progress = Callable[[int, int], None]


def analyze_binary(path: str | os.PathLike[str], *, jobs: int = 1,
                   progress: Progress | None = None) -> Structure:
    """Recover the structure of the ELF file at ``path`` (see the module docstring).

    With ``jobs`` > 1 and a large module, the procedures are built in that many processes
    (forked after the DWARF is read, so they share it copy-on-write); the result is identical.
    ``progress`` is called as procedures are built (libtorch_cpu.so has 385k of them).
    """
    mod = open_elf(path)
    try:
        return _analyze(mod, jobs, progress)
    finally:
        mod.close()


#: Below this many procedures a module is built in one process (forking costs more).
PARALLEL_MIN_PROCS = 1000

#: What one procedure costs to build beyond its code, in bytes of code that cost as much:
#: the processes get runs of equal code size plus this per procedure. By code size alone,
#: libtorch_cpu.so's first half held 307k procedures and its second 78k (most small
#: procedures are early in its address order). Fitted to two measured halves of it (CPU time
#: against procedures and bytes): ~22 us per procedure and ~0.09 us per byte of code.
PROC_COST = 250

#: Procedures without inlined code assembled together (structure/batch_scopes.py).
BATCH = 512


class _NoReturn:
    """The entries of the procedures a call to which never returns (their link names are in
    :data:`~callpath.structure.noreturn.NO_RETURN` or marked ``DW_AT_noreturn`` in the
    module's DWARF), answered per call target as the CFGs ask: deciding it for every one of
    libtorch_cpu.so's 385k procedures decoded all their names."""

    def __init__(self, table: ProcedureTable, names: set[str]) -> None:
        self.table, self.names = table, names
        self.memo: dict[int, bool] = {}

    def __contains__(self, target: object) -> bool:
        if not isinstance(target, int):
            return False
        got = self.memo.get(target)
        if got is None:
            e = self.table.entry
            k = int(e.searchsorted(np.uint64(target))) if 0 <= target < 1 << 64 else len(e)
            got = k < len(e) and int(e[k]) == target and is_no_return(
                self.table.link_name(k), self.names)
            self.memo[target] = got
        return got


class PreparedModule:
    """What every procedure's structure depends on, read once per module: its procedures
    (symbols, PLT, DWARF subprograms, FDEs), line table, inlined records, no-return callees.

    A procedure's scopes depend only on these and on its own code, never on which other
    procedures are built with it: :meth:`build` of any selection gives, for each selected
    procedure, exactly the scopes the whole module's build gives it. That is what lets
    ``callpath prof`` recover only the procedures a measurement touched (``structure/
    ondemand.py``) and agree with ``callpath struct`` of the whole binary.

    ``demangle_all`` False leaves procedure names undemangled until a procedure is built
    (libtorch_cpu.so has 380k C++ symbols: demangling them all is seconds that a build of a
    few thousand procedures does not need).

    ``near`` (addresses): where the module has symbols and DWARF, read only the DWARF whose
    code lies between the symbols around those addresses (:attr:`partial`): the procedures
    holding them get exactly the scopes a whole read gives (their entries, ends, names,
    lines, inlining and their units' no-return callees all come from there); others may not.
    """

    partial: bool
    table: ProcedureTable
    procs: Sequence[Procedure]
    entry: npt.NDArray[np.uint64]
    end: npt.NDArray[np.uint64]
    cu_lo: npt.NDArray[np.uint64]
    cu_hi: npt.NDArray[np.uint64]
    cu_key: npt.NDArray[np.int64]
    unit_noreturn: dict[int, set[str]]
    sub_names: dict[int, str]

    def __init__(self, mod: ElfModule, *, demangle_all: bool = True,
                 state: dict[str, npt.NDArray[Any]] | None = None,
                 near: npt.NDArray[np.uint64] | None = None,
                 line_cache: LineCache | None = None,
                 unit_cache: UnitCache | None = None) -> None:
        self.mod = mod
        #: read only the DWARF units that hold code near ``near`` (:meth:`covers`)
        self.partial = False
        if state is not None:
            self._restore(state)
            return
        dbg_mod = None
        if not mod.has_dwarf():
            path = find_debug_file(mod)
            if path is not None:
                dbg_mod = open_elf(path, require_code=False)
                if not dbg_mod.has_dwarf():
                    dbg_mod.close()
                    dbg_mod = None
        try:
            extra_elves = [dbg_mod.elf] if dbg_mod is not None else []
            base = symbol_candidates(mod, extra_elves)
            around = None
            if near is not None and (base.origin == 0).any() and (
                    dbg_mod is not None or mod.has_dwarf()):
                # With symbols, the procedure holding an address lies between the symbols
                # around it; DWARF can only add entries there, from the units covering it.
                around = _around(base.entry, np.unique(np.asarray(near, dtype=np.uint64)))
                self.partial = True
                self.span_lo, self.span_hi = around
            dbg = read_debug(mod, around, line_cache, unit_cache)
            dwarf_entries = []
            if dbg is not None:
                for s in dbg.info.subprograms:
                    lo_ = min(a for a, _ in s.ranges)
                    hi_ = max(b for _, b in s.ranges)
                    dwarf_entries.append((lo_, hi_, s.name, s.link_name or s.name))
            table = procedure_table(mod, extra_elves, dwarf_entries, base=base)
        finally:
            if dbg_mod is not None:
                dbg_mod.close()
        self.table = table
        self.procs = table.procedures(True) if demangle_all else table
        self.demangled = demangle_all
        self.lines = dbg.lines if dbg is not None else _empty_lines()
        self.entry = table.entry
        self.end = table.end
        if dbg is not None:
            self.cu_lo, self.cu_hi, self.cu_key = dbg.cu_lo, dbg.cu_hi, dbg.cu_key
            self.unit_noreturn = dbg.info.unit_noreturn
        else:
            self.cu_lo = self.cu_hi = np.zeros(0, np.uint64)
            self.cu_key = np.zeros(0, np.int64)
            self.unit_noreturn = {}
        self._noret: dict[tuple[int, ...], _NoReturn] = {}
        self.base = os.path.basename(mod.path)
        # Inlined records per procedure (by the procedure containing each record's first range).
        self.inlined = dbg.info.inlined if dbg is not None else []
        self._index_inlined()
        self.sub_names = {}
        if dbg is not None:
            for s in dbg.info.subprograms:
                for lo_, _hi in s.ranges:
                    self.sub_names.setdefault(lo_, s.name)
        self.reader = _SectionReader(mod)

    def covers(self, addrs: npt.NDArray[np.uint64]) -> npt.NDArray[np.bool_]:
        """Whether the procedure holding each address is known exactly here: always when the
        whole DWARF was read, else where the address lies between the symbols around one of
        the addresses it was prepared for."""
        if not self.partial:
            return np.ones(len(addrs), dtype=bool)
        k = np.searchsorted(self.span_lo, addrs, side="right").astype(np.int64) - 1
        ok = k >= 0
        return ok & (addrs < self.span_hi[np.maximum(k, 0)])

    def noreturn_for(self, entry: int) -> _NoReturn:
        """The no-return callees as seen from the procedure at ``entry``: those named in
        :data:`~callpath.structure.noreturn.NO_RETURN` and those its own units (the units
        whose code covers its entry) mark ``DW_AT_noreturn``. The caller's units, not all of
        the module's: what the compiler of the call knew, and what a build of only the
        procedures near the sampled addresses can read."""
        e = np.uint64(entry)
        hit = (self.cu_lo <= e) & (self.cu_hi > e)
        keys = tuple(sorted(set(self.cu_key[hit].tolist()))) if len(self.cu_lo) else ()
        got = self._noret.get(keys)
        if got is None:
            names: set[str] = set()
            for k in keys:
                names |= self.unit_noreturn.get(k, set())
            got = self._noret[keys] = _NoReturn(self.table, names)
        return got

    # -- the module-wide facts as flat arrays (structure/ondemand.py caches them) -----------

    def state(self) -> dict[str, npt.NDArray[Any]]:
        """Everything :meth:`build` needs but the ELF file itself, as arrays: a later run that
        touches new procedures of the module builds them without reading its symbol tables
        and DWARF again (libtorch_cpu.so's 441k symbols, libpython's DWARF: seconds each).
        Names are stored zlib-compressed (libtorch_cpu.so's mangled names: 38 MB raw)."""
        procs = self.procs
        shown = [p.name for p in procs] if self.demangled else []
        inl = self.inlined
        rptr = np.zeros(len(inl) + 1, dtype=np.int64)
        rptr[1:] = np.cumsum([len(r.ranges) for r in inl])
        flat = [x for r in inl for x in r.ranges]
        sub_lo = sorted(self.sub_names)

        def blob(strings: list[str]) -> npt.NDArray[np.uint8]:
            return raw_blob("\0".join(strings).encode("utf-8", "surrogatepass"))

        def raw_blob(raw: bytes) -> npt.NDArray[np.uint8]:
            return np.frombuffer(zlib.compress(raw, 1), dtype=np.uint8)

        return {
            "entry": self.entry, "end": self.end, "origin": self.table.origin,
            **self._table_state(), "shown": blob(shown),
            "counts": np.array([len(procs), len(shown), len(inl), len(sub_lo),
                                len(self.lines.files), int(self.demangled)], dtype=np.int64),
            "cu_lo": self.cu_lo, "cu_hi": self.cu_hi, "cu_key": self.cu_key,
            "noret_names": blob(sorted(f"{k}\t{nm}" for k, names in self.unit_noreturn.items()
                                       for nm in names)),
            "l_addr": self.lines.address, "l_file": self.lines.file,
            "l_line": self.lines.line, "l_files": blob(self.lines.files),
            "i_parent": np.array([r.parent for r in inl], dtype=np.int64),
            "i_cfile": np.array([r.call_file for r in inl], dtype=np.int64),
            "i_cline": np.array([r.call_line for r in inl], dtype=np.int64),
            "i_names": blob([r.name for r in inl]), "i_rptr": rptr,
            "i_lo": np.array([a for a, _ in flat], dtype=np.uint64),
            "i_hi": np.array([b for _, b in flat], dtype=np.uint64),
            "s_lo": np.array(sub_lo, dtype=np.uint64),
            "s_names": blob([self.sub_names[a] for a in sub_lo]),
        }

    def _table_state(self) -> dict[str, npt.NDArray[Any]]:
        """The procedure names as byte ranges of their blobs, and the blobs: a string table
        by where it is in the file (libtorch_cpu.so's 59 MB of names were 0.4 s to join and
        compress), the others compressed."""
        tb = self.table
        inline = [zlib.compress(b, 1) if w is None else b"" for b, w in
                  zip(tb.blobs, tb.wheres, strict=True)]
        wide = np.int64 if len(tb.nhi) and int(tb.nhi.max()) >= 1 << 32 else np.uint32
        where = "\0".join("" if w is None else f"{w[1]}\t{w[2]}\t{w[0]}" for w in tb.wheres)
        return {
            "t_src": tb.src.astype(np.uint16), "t_lo": tb.nlo.astype(wide),
            "t_hi": tb.nhi.astype(wide),
            "b_where": np.frombuffer(where.encode("utf-8", "surrogateescape"), np.uint8),
            "b_len": np.array([len(x) for x in inline], np.int64),
            "b_inline": np.frombuffer(b"".join(inline), np.uint8),
        }

    def _restore_table(self, st: dict[str, npt.NDArray[Any]], origin: npt.NDArray[np.uint8]
                       ) -> ProcedureTable:
        wheres = st["b_where"].tobytes().decode("utf-8", "surrogateescape").split("\0")
        lens = st["b_len"].tolist()
        if len(lens) != len(wheres):
            raise ValueError("inconsistent name blobs")
        raw = st["b_inline"].tobytes()
        blobs: list[bytes] = []
        places: list[tuple[str, int, int] | None] = []
        at = 0
        for w, n in zip(wheres, lens, strict=True):
            if w:
                off, size, path = w.split("\t", 2)
                try:
                    with open(path, "rb") as f:
                        data = os.pread(f.fileno(), int(size), int(off))
                except OSError as e:
                    raise ValueError(f"{path}: {e}") from None
                if len(data) != int(size):
                    raise ValueError(f"{path}: shorter than its string table")
                blobs.append(data)
                places.append((path, int(off), int(size)))
            else:
                blobs.append(zlib.decompress(raw[at:at + n]))
                places.append(None)
            at += n
        src = st["t_src"].astype(np.int32)
        lo, hi = st["t_lo"].astype(np.int64), st["t_hi"].astype(np.int64)
        if not len(src) == len(lo) == len(hi) == len(self.entry):
            raise ValueError("inconsistent procedure table")
        if len(src):
            blob_len = np.array([len(b) for b in blobs], np.int64)
            if int(src.max()) >= len(blobs) or (hi > blob_len[src]).any() or (lo > hi).any():
                raise ValueError("procedure names outside their blobs")
        return ProcedureTable(self.entry, self.end, origin, blobs, src, lo, hi, places)

    def _restore(self, st: dict[str, npt.NDArray[Any]]) -> None:
        def unblob(a: npt.NDArray[Any], n: int) -> list[str]:
            if n == 0:
                return []
            return zlib.decompress(a.tobytes()).decode("utf-8", "surrogatepass").split("\0")

        n_procs, n_shown, n_inl, n_sub, n_files, demangled = (int(x) for x in st["counts"])
        self.entry = np.asarray(st["entry"], dtype=np.uint64)
        self.end = np.asarray(st["end"], dtype=np.uint64)
        origin = np.asarray(st["origin"], dtype=np.uint8)
        if not len(self.entry) == len(self.end) == len(origin) == n_procs:
            raise ValueError("inconsistent procedure table")
        self.table = self._restore_table(st, origin)
        self.demangled = bool(demangled)
        self.procs = self.table
        if demangled:
            shown = unblob(st["shown"], n_shown)
            if len(shown) != n_procs:
                raise ValueError("inconsistent procedure table")
            self.procs = [Procedure(p.entry, p.end, p.link_name, nm, p.origin)
                          for p, nm in zip(self.table.procedures(False), shown, strict=True)]
        self.cu_lo = np.asarray(st["cu_lo"], dtype=np.uint64)
        self.cu_hi = np.asarray(st["cu_hi"], dtype=np.uint64)
        self.cu_key = np.asarray(st["cu_key"], dtype=np.int64)
        self.unit_noreturn = {}
        for item in zlib.decompress(st["noret_names"].tobytes()).decode(
                "utf-8", "surrogatepass").split("\0"):
            if item:
                k, nm = item.split("\t", 1)
                self.unit_noreturn.setdefault(int(k), set()).add(nm)
        self._noret = {}
        self.lines = LineTable(np.asarray(st["l_addr"], dtype=np.uint64),
                               np.asarray(st["l_file"], dtype=np.int32),
                               np.asarray(st["l_line"], dtype=np.int32),
                               unblob(st["l_files"], n_files), {})
        names = unblob(st["i_names"], n_inl)
        rptr = st["i_rptr"].tolist()
        lo, hi = st["i_lo"].tolist(), st["i_hi"].tolist()
        self.inlined = [
            Inlined(-1, par, list(zip(lo[rptr[k]:rptr[k + 1]], hi[rptr[k]:rptr[k + 1]],
                                      strict=True)), (0, 0), cf, cl, nm)
            for k, (par, cf, cl, nm) in enumerate(zip(
                st["i_parent"].tolist(), st["i_cfile"].tolist(), st["i_cline"].tolist(),
                names, strict=True))]
        self.sub_names = dict(zip(st["s_lo"].tolist(), unblob(st["s_names"], n_sub),
                                  strict=True))
        self.base = os.path.basename(self.mod.path)
        self._index_inlined()
        self.reader = _SectionReader(self.mod)

    def _index_inlined(self) -> None:
        """Inlined records per procedure: the one containing each record's first range."""
        self.inl_by_proc: dict[int, list[int]] = defaultdict(list)
        if not self.inlined:
            return
        first = np.array([min(a for a, _ in rec.ranges) for rec in self.inlined], np.uint64)
        pi = np.searchsorted(self.entry, first, side="right").astype(np.int64) - 1
        ok = pi >= 0
        ok &= first < self.end[np.maximum(pi, 0)]
        for k, p in zip(np.flatnonzero(ok).tolist(), pi[ok].tolist(), strict=True):
            self.inl_by_proc[p].append(k)

    def groups(self, selection: npt.NDArray[np.int64] | None = None
               ) -> tuple[list[str], dict[str, list[int]]]:
        """The procedures (all, or ``selection``: indices into :attr:`procs`) grouped by the
        source file of their entry line, in the order the FILE scopes are written."""
        idx = np.arange(len(self.procs)) if selection is None else np.unique(selection)
        pfile, _pline = _lines_at(self.lines, self.entry[idx])
        groups: dict[str, list[int]] = defaultdict(list)
        files = self.lines.files
        own = f"[{self.base}]"
        for i, f in zip(idx.tolist(), pfile.tolist(), strict=True):
            groups[files[f] if f >= 0 else own].append(i)
        order = sorted(groups, key=lambda f: (f.startswith("["), groups[f][0]))
        return order, groups

    def build(self, fnames: list[str], groups: dict[str, list[int]]) -> Structure:
        """The structure of the procedures of ``groups[f]`` for ``f`` in ``fnames``."""
        return self.build_runs([(f, groups[f]) for f in fnames])

    def build_runs(self, runs: list[tuple[str, list[int]]], progress: Progress | None = None,
                   scale: int = 1, total: int = 0) -> Structure:
        """The structure of runs of procedures, each run under a FILE scope of its name;
        ``progress(done * scale, total)`` every 256 procedures."""
        mod, procs, lines = self.mod, self.procs, self.lines
        b = StructureBuilder(mod.path, mod.build_id)
        b.has_calls = True  # every call instruction becomes a C scope
        done = 0
        batch = Batch(b, lines)
        for fname, ids in runs:
            fscope = batch.fscope = b.add(Kind.FILE, 0, name=fname)
            pfile = None if fname.startswith("[") else fname
            _pf, pline = _lines_at(lines, self.entry[np.array(ids, dtype=np.int64)])
            for i, pl in zip(ids, pline.tolist(), strict=True):
                p = procs[i]
                name = p.name if self.demangled else demangle(p.name)
                display = self.sub_names.get(p.entry, name) if p.origin != "plt" else name
                flow = _flow(p, self.reader, self.noreturn_for(p.entry))
                inl = self.inl_by_proc.get(i)
                plain = None if inl else plain_proc(display, p.link_name, pfile, int(pl),
                                                    p.entry, p.end, *flow, lines)
                if plain is not None:  # no inlined code: assembled with others, as arrays
                    batch.add(plain)
                    if len(batch) >= BATCH:
                        batch.flush()
                else:
                    batch.flush()
                    _build_proc(b, fscope, p, display, int(pl), fname, lines, self.inlined,
                                inl or [], flow)
                done += 1
                if progress is not None and done % 256 == 0:
                    progress(min(done * scale, total), total)
                if done % 8192 == 0:
                    self.reader.release_text()
            batch.flush()
        if progress is not None:
            progress(min(done * scale, total), total)
        return b.build()

    def build_parallel(self, order: list[str], groups: dict[str, list[int]],
                       jobs: int, min_procs: int = PARALLEL_MIN_PROCS,
                       progress: Progress | None = None) -> Structure:
        """:meth:`build` in ``jobs`` forked processes, each a run of consecutive procedures of
        about equal cost (code size plus :data:`PROC_COST` each), cut inside a FILE group
        where needed (a library without DWARF is one group); the concatenation, with a FILE
        cut in two joined again, is exactly the one-process result."""
        return join_parts(self.build_parts(order, groups, jobs, min_procs, progress))

    def build_parts(self, order: list[str], groups: dict[str, list[int]],
                    jobs: int, min_procs: int = PARALLEL_MIN_PROCS,
                    progress: Progress | None = None) -> list[Structure]:
        """:meth:`build_parallel`'s parts, before :func:`join_parts` (a caller done with this
        module's tables drops them first: libtorch_cpu.so's are ~240 MB)."""
        n = sum(len(groups[f]) for f in order)
        if jobs <= 1 or n < min_procs or not hasattr(os, "fork"):
            return [self.build_runs([(f, groups[f]) for f in order], progress, 1, n)]
        size = (self.end - self.entry).astype(np.int64) + PROC_COST
        flat = [(f, i) for f in order for i in groups[f]]
        w = np.cumsum(size[np.array([i for _, i in flat], dtype=np.int64)])
        cuts = np.searchsorted(w, w[-1] * np.arange(1, jobs) / jobs, side="right").tolist()
        chunks: list[list[tuple[str, list[int]]]] = []
        for lo, hi in zip([0, *cuts], [*cuts, len(flat)], strict=True):
            runs: list[tuple[str, list[int]]] = []
            for f, i in flat[lo:hi]:
                if runs and runs[-1][0] == f:
                    runs[-1][1].append(i)
                else:
                    runs.append((f, [i]))
            if runs:
                chunks.append(runs)
        self.reader.preload()  # children must not share the file offset of pyelftools' stream
        last = len(chunks) - 1

        def run(k: int) -> Structure:
            # only this process (the last chunk) reports: chunks are of equal cost, so
            # its share done stands for the whole
            return self.build_runs(chunks[k], progress if k == last else None, len(chunks), n)

        return fork_map(run, list(range(len(chunks))))


def join_parts(parts: list[Structure]) -> Structure:
    """The module's structure from :meth:`PreparedModule.build_parts`' parts (consumed)."""
    if len(parts) == 1:
        return parts[0]
    return concat_structures(parts, join_files=True, consume=True)


def _analyze(mod: ElfModule, jobs: int = 1, progress: Progress | None = None) -> Structure:
    # names demangled as procedures are built, in the processes that build them: all 385k of
    # libtorch_cpu.so's demangled up front were ~190 MB of objects in the parent (and, with
    # every page the children touched copied, in each child) and 2 s done serially
    prep = PreparedModule(mod, demangle_all=False)
    order, groups = prep.groups()
    parts = prep.build_parts(order, groups, jobs, progress=progress)
    del prep, order, groups
    return join_parts(parts)


class _SectionReader:
    """Bytes at load addresses, from any allocated section (jump tables live in .rodata)."""

    def __init__(self, mod: ElfModule) -> None:
        self.secs: list[tuple[int, int, object]] = []
        self.mod = mod
        h = mod.headers
        if h is not None:  # read with pread at the section's offset: no shared file position
            for c in h.sections:
                if c.type == 1 and c.flags & 0x2 and c.addr:  # SHT_PROGBITS, SHF_ALLOC
                    self.secs.append((c.addr, c.size, c.offset))
        else:
            for sec in mod.elf.iter_sections():
                if sec["sh_type"] == "SHT_PROGBITS" and int(sec["sh_flags"]) & 0x2 and \
                        sec["sh_addr"]:
                    self.secs.append((int(sec["sh_addr"]), int(sec["sh_size"]), sec))
        self.cache: dict[int, bytes] = {}
        self.blocks: dict[tuple[int, int], bytes] = {}
        self.text = {s.addr: s for s in mod.text_sections}

    def release_text(self) -> None:
        """Drop the mapped code pages decoded so far from this process's memory."""
        for sec in self.mod.text_sections:
            release = getattr(sec.data, "release", None)
            if release is not None:
                release()

    def preload(self) -> None:
        """Read every section now (before forking: the file offset would be shared)."""
        if self.mod.headers is not None:
            return
        for lo, _size, sec in self.secs:
            if lo not in self.cache:
                self.cache[lo] = bytes(sec.data())  # type: ignore[attr-defined]

    #: bytes read from the file at a time (and kept): a jump table is read entry by entry,
    #: and reading libtorch_cpu.so's whole ``.rodata`` for a few tables was 0.3 s
    BLOCK = 1 << 16

    def read(self, addr: int, n: int) -> bytes | None:
        for lo, size, sec in self.secs:
            if lo <= addr < lo + size:
                off = addr - lo
                stop = min(off + n, size)
                if not isinstance(sec, int):  # pyelftools' section: read whole, once
                    data = self.cache.get(lo)
                    if data is None:
                        data = self.cache[lo] = bytes(sec.data())  # type: ignore[attr-defined]
                    return data[off:stop]
                out = []
                blk = self.BLOCK
                for b in range(off // blk, (max(stop, off + 1) - 1) // blk + 1):
                    key = (lo, b)
                    data = self.blocks.get(key)
                    if data is None:
                        want = min(blk, size - b * blk)
                        try:
                            data = os.pread(self.mod.stream.fileno(), want, sec + b * blk)
                        except OSError:
                            return None
                        self.blocks[key] = data
                    out.append(data)
                first = (off // blk) * blk
                return b"".join(out)[off - first:stop - first]
        return None


def _around(entries: npt.NDArray[np.uint64], addrs: npt.NDArray[np.uint64]
            ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """Per address (sorted), ``[previous entry, next entry)`` (``[0, ...)`` before the first,
    ``[..., 2**64 - 1)`` after the last), overlapping spans merged: sorted, disjoint."""
    top = np.uint64(np.iinfo(np.uint64).max)
    k = np.searchsorted(entries, addrs, side="right").astype(np.int64) - 1
    lo = np.where(k >= 0, entries[np.maximum(k, 0)] if len(entries) else 0, 0).astype(np.uint64)
    nxt = k + 1
    hi = np.where(nxt < len(entries), entries[np.minimum(nxt, max(len(entries) - 1, 0))]
                  if len(entries) else top, top).astype(np.uint64)
    if len(lo) == 0:
        return lo, hi
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    run_hi = np.maximum.accumulate(hi)
    start = np.ones(len(lo), dtype=bool)
    start[1:] = lo[1:] > run_hi[:-1]
    ends = np.append(np.flatnonzero(start)[1:], len(lo)) - 1
    return lo[start], run_hi[ends]


def _overlaps(a_lo: npt.NDArray[np.uint64], a_hi: npt.NDArray[np.uint64],
              b_lo: npt.NDArray[np.uint64], b_hi: npt.NDArray[np.uint64]
              ) -> npt.NDArray[np.bool_]:
    """Per range ``a``, whether it meets one of the sorted disjoint ranges ``b``."""
    if len(b_lo) == 0:
        return np.zeros(len(a_lo), dtype=bool)
    j = np.searchsorted(b_lo, a_hi, side="left").astype(np.int64) - 1
    ok = j >= 0
    return ok & (b_hi[np.maximum(j, 0)] > a_lo) & (a_hi > a_lo)


def _lines_at(lines: LineTable, addrs: npt.NDArray[np.uint64]) -> tuple[
        npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    if len(lines.address) == 0:
        return (np.full(len(addrs), -1, np.int32), np.zeros(len(addrs), np.int32))
    return lines.lookup(addrs)


def _has_back_branch(code: Code) -> bool:
    """Whether some jump, conditional branch or jump-table entry goes to an address at or
    before the instruction that branches."""
    ips, kinds, targets = code.ip, code.kind, code.target
    for i in code.flow:
        k = kinds[i]
        if k in (JUMP, COND):
            if targets[i] <= ips[i]:
                return True
        elif k == INDIRECT:
            ip = ips[i]
            if any(t <= ip for t in code.tables.get(i, ())):
                return True
    return False


def _flow(p: Procedure, reader: _SectionReader, noret: _NoReturn
          ) -> tuple[Code, Graph, list[Loop], list[int]]:
    """The procedure's instructions, control flow graph and loops (and innermost loop of each
    block)."""
    lo, hi = p.entry, p.end
    sec = next(s for s in reader.mod.text_sections if s.addr <= lo < s.addr + s.size)
    code = decode(sec.data, sec.addr, lo, hi)
    if INDIRECT in code.kind:
        code.tables = resolve_tables(sec.data, sec.addr, lo, hi, code.ip, code.kind,
                                     reader.read, INDIRECT)
    graph = build_cfg(code, lo, hi, noret.__contains__, memo=noret.memo)
    # A cycle needs an edge to an address at or before its branch (fall-through only goes
    # forward): without one there is no loop and Havlak's analysis is skipped (most of
    # libtorch_cpu.so's 380k procedures; its result would be empty).
    loops, innermost = (find_loops(graph.succ) if graph.start and _has_back_branch(code)
                        else ([], []))
    return code, graph, loops, innermost


def _build_proc(b: StructureBuilder, fscope: int, p: Procedure, display: str, pline: int,
                fname: str, lines: LineTable, inlined: list[Inlined], inl_ids: list[int],
                flow: tuple[Code, Graph, list[Loop], list[int]]) -> None:
    lo, hi = p.entry, p.end
    code, graph, loops, innermost = flow

    # Elementary segments.
    bounds: list[int] = [lo, hi]
    la = lines.address
    if len(la):
        # numpy scalars: a Python int against a uint64 array converts the whole array
        # (0.35 ms per call on libpython's 560k rows, most of the analysis time).
        i0 = int(la.searchsorted(np.uint64(lo), side="left"))
        i1 = int(la.searchsorted(np.uint64(hi), side="left"))
        bounds.extend(int(x) for x in la[i0:i1])
    # Inlined records of this procedure, clipped, outer before inner.
    local = {k: n for n, k in enumerate(inl_ids)}
    depth: list[int] = []
    for k in inl_ids:
        d, q = 0, inlined[k].parent
        while q >= 0 and q in local:
            d += 1
            q = inlined[q].parent
        depth.append(d)
    inl_order = sorted(range(len(inl_ids)), key=lambda n: depth[n])
    clipped: list[list[tuple[int, int]]] = []
    for k in inl_ids:
        rs = [(max(a, lo), min(c, hi)) for a, c in inlined[k].ranges]
        rs = [(a, c) for a, c in rs if c > a]
        clipped.append(rs)
        for a, c in rs:
            bounds.extend((a, c))
    bounds.extend(graph.start)
    bounds.extend(graph.end)
    # Call instructions are scopes of their own (hpcstruct's C): one segment each.
    call_at: dict[int, tuple[int, int]] = {}
    ckinds = code.kind
    for ci in code.flow:
        if ckinds[ci] in (CALL, ICALL):
            a_, c_ = code.ip[ci], code.end[ci]
            call_at[a_] = (c_, code.target[ci])
            bounds.append(a_)
            bounds.append(c_)
    # sorted, unique, inside [lo, hi]: np.unique's hashing cost more than this sort
    bnd = np.array(bounds, dtype=np.uint64)
    bnd.sort()
    bnd = bnd[bnd.searchsorted(np.uint64(lo)):bnd.searchsorted(np.uint64(hi), side="right")]
    if len(bnd) > 1:
        bnd = bnd[np.concatenate(([True], bnd[1:] != bnd[:-1]))]
    seg_lo = bnd[:-1]
    seg_hi = bnd[1:]
    nseg = len(seg_lo)
    seg_file, seg_line = _lines_at(lines, seg_lo)
    seg_inl = np.full(nseg, -1, np.int32)
    for n in inl_order:
        for a, c in clipped[n]:
            s0 = int(bnd.searchsorted(np.uint64(a)))
            s1 = int(bnd.searchsorted(np.uint64(c)))
            seg_inl[s0:s1] = n
    seg_loop = np.full(nseg, -1, np.int32)
    if loops:
        bs = bnd.searchsorted(np.array(graph.start, np.uint64)).tolist()
        be = bnd.searchsorted(np.array(graph.end, np.uint64)).tolist()
        for blk in range(len(graph.start)):
            lp = innermost[blk]
            if lp >= 0:
                seg_loop[bs[blk]:be[blk]] = lp

    # Local inline parent (within this procedure) and chains.
    inl_parent = [local.get(inlined[k].parent, -1) for k in inl_ids]

    def inl_chain(n: int) -> list[int]:
        out = []
        while n >= 0:
            out.append(n)
            n = inl_parent[n]
        return out[::-1]

    loop_parent = [lp.parent for lp in loops]

    def loop_chain(n: int) -> list[int]:
        out = []
        while n >= 0:
            out.append(n)
            n = loop_parent[n]
        return out[::-1]

    # A loop sits inside the inlined frames that contain all of its code (a rotated loop's
    # header may be the first instruction of inlined code while its latch is not).
    loop_ctx: list[list[int] | None] = [None] * len(loops)
    if loops:
        # the distinct (inlined, loop) pairs in lexicographic order, as one sorted key each
        # (np.unique over columns was a tenth of the build time)
        key = np.unique((seg_inl.astype(np.int64) + 1) << 32 | (seg_loop.astype(np.int64) + 1))
        for inl, lp in zip(((key >> 32) - 1).tolist(), ((key & 0xFFFFFFFF) - 1).tolist(),
                           strict=True):
            if lp < 0:
                continue
            ic = inl_chain(inl)
            for lpi in loop_chain(lp):
                cur = loop_ctx[lpi]
                if cur is None:
                    loop_ctx[lpi] = list(ic)
                else:
                    d = 0
                    while d < len(cur) and d < len(ic) and cur[d] == ic[d]:
                        d += 1
                    del cur[d:]
    header_inl = [c or [] for c in loop_ctx]

    path_cache: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {}

    def path_of(inl: int, loop: int) -> tuple[tuple[int, int], ...]:
        key = (inl, loop)
        got = path_cache.get(key)
        if got is not None:
            return got
        ic = inl_chain(inl)
        items: list[tuple[int, int, int, int]] = [(2 * (j + 1), 0, 0, x) for j, x in
                                                  enumerate(ic)]
        prev = 0
        for order_i, lpi in enumerate(loop_chain(loop)):
            hc = header_inl[lpi]
            d = 0
            while d < len(ic) and d < len(hc) and ic[d] == hc[d]:
                d += 1
            d = max(d, prev)
            prev = d
            items.append((2 * d + 1, order_i, 1, lpi))
        items.sort()
        path = tuple((kind, x) for _, _, kind, x in items)
        path_cache[key] = path
        return path

    # Loop lines: the branch at the end of the latest back-edge source block.
    # (one lookup of every latch and header: a lookup per loop was ~10% of the build)
    loop_line: list[tuple[int, int]] = []
    if loops:
        latch_at = []
        for lpo in loops:
            srcs = list(lpo.back_sources) or [lpo.header]
            latch = max(srcs, key=lambda x: graph.start[x])
            latch_at.append(code.ip[graph.last[latch]])
        head_at = [graph.start[lpo.header] for lpo in loops]
        lf, ll = _lines_at(lines, np.array(latch_at + head_at, np.uint64))
        n_l = len(loops)
        for f1, l1, f2, l2 in zip(lf[:n_l].tolist(), ll[:n_l].tolist(), lf[n_l:].tolist(),
                                  ll[n_l:].tolist(), strict=True):
            loop_line.append((f1, l1) if l1 > 0 else (f2, l2))

    # Build the local scope trie: node -> (kind, ref), children, statements.
    proc_ranges = [(lo, lo + 1)]
    pscope = b.add(Kind.PROC, fscope, name=display, link=p.link_name,
                   file=None if fname.startswith("[") else fname, line=pline,
                   ranges=proc_ranges)
    node_key: dict[tuple[tuple[int, int], ...], int] = {(): 0}
    node_info: list[tuple[int, int]] = [(-1, -1)]
    node_children: list[list[int]] = [[]]
    node_stmts: list[dict[tuple[int, int], list[tuple[int, int]]]] = [defaultdict(list)]
    node_first: list[int] = [lo]
    node_calls: list[list[tuple[int, int, int, int, int]]] = [[]]
    # the segment columns as lists: a numpy scalar per access and column cost ~1.5 us per
    # segment (libtorch_cpu.so: millions of them)
    for a, c, f_s, l_s, inl_s, loop_s in zip(seg_lo.tolist(), seg_hi.tolist(),
                                              seg_file.tolist(), seg_line.tolist(),
                                              seg_inl.tolist(), seg_loop.tolist(), strict=True):
        path = path_of(inl_s, loop_s)
        node = node_key.get(path)
        if node is None:
            parent = 0
            for depth_i in range(1, len(path) + 1):
                pre = path[:depth_i]
                nd = node_key.get(pre)
                if nd is None:
                    nd = len(node_info)
                    node_key[pre] = nd
                    node_info.append(pre[-1])
                    node_children.append([])
                    node_stmts.append(defaultdict(list))
                    node_first.append(a)
                    node_calls.append([])
                    node_children[parent].append(nd)
                parent = nd
            node = parent
        call = call_at.get(a)
        if call is not None and call[0] == c:
            node_calls[node].append((a, c, f_s, l_s, call[1]))
            continue
        rs = node_stmts[node][(f_s, l_s)]
        if rs and rs[-1][1] == a:
            rs[-1] = (rs[-1][0], c)
        else:
            rs.append((a, c))

    # The line of each inlined scope's first address, all in one lookup.
    alien_nodes = [ch for ch in range(1, len(node_info)) if node_info[ch][0] != 1]
    alien_line: dict[int, tuple[int, int]] = {}
    if alien_nodes:
        firsts = [min(a for a, _ in clipped[node_info[ch][1]]) if clipped[node_info[ch][1]]
                  else node_first[ch] for ch in alien_nodes]
        af, al = _lines_at(lines, np.array(firsts, np.uint64))
        alien_line = dict(zip(alien_nodes, zip(af.tolist(), al.tolist(), strict=True),
                              strict=True))

    def emit(node: int, scope: int) -> None:
        for (f, ln), rs in sorted(node_stmts[node].items(), key=lambda kv: kv[1][0][0]):
            st = b.add(Kind.STMT, scope, file=lines.files[f] if f >= 0 else None, line=ln,
                       ranges=rs)
            for a, c in rs:
                b.map_range(a, c, st)
        for a, c, f, ln, t in node_calls[node]:
            cs = b.add(Kind.CALL, scope, file=lines.files[f] if f >= 0 else None, line=ln,
                       target=t, ranges=[(a, c)])
            b.map_range(a, c, cs)
        for ch in sorted(node_children[node], key=lambda x: node_first[x]):
            kind, ref = node_info[ch]
            if kind == 1:  # loop
                f, ln = loop_line[ref]
                h = graph.start[loops[ref].header]
                sc = b.add(Kind.LOOP, scope, file=lines.files[f] if f >= 0 else None,
                           line=ln, ranges=[(h, h + 1)])
            else:
                rec = inlined[inl_ids[ref]]
                ff, fl = alien_line[ch]
                sc = b.add(Kind.ALIEN, scope, name=rec.name,
                           file=lines.files[ff] if ff >= 0 else None, line=fl,
                           call_file=lines.files[rec.call_file] if rec.call_file >= 0 else None,
                           call_line=rec.call_line, ranges=clipped[ref])
            emit(ch, sc)

    emit(0, pscope)
