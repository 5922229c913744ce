"""Call-frame information compiled to flat rows the vectorised unwinder can apply.

A *row* says, for one pc, how to find the canonical frame address (CFA = register + offset)
and where the return address and the callee-saved registers rbx, rbp, r12–r15 were saved
(CFA + offset), or that they keep their value, or are undefined. Rows are deduplicated in a
``RowTable`` (numpy arrays) and memoised per (module, pc), so the DWARF interpreter of
``eh_frame`` runs once per function, not once per sample.

Two kinds of frame are not described by plain rows and get a kind of their own: signal
trampolines (FDEs with the ``S`` augmentation: registers come from the kernel's ``ucontext``)
and PLT stubs (their CFI is a DWARF expression of the pc; the two shapes ld emits are known).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from callpath.measure.eh_frame import EXPRESSION, OFFSET, SAME_VALUE, UNDEFINED, CfiError, Line
from callpath.measure.elfinfo import ElfInfo
from callpath.structure.dwarf_info import sleb

if TYPE_CHECKING:
    from callpath.structure.unwind_recipes import Recipes

# DWARF x86-64 register numbers
RBX, RBP, RSP, R12, R13, R14, R15, RA = 3, 6, 7, 12, 13, 14, 15, 16
TRACKED = (RBX, RBP, R12, R13, R14, R15, RA)  # column order of RowTable.rule/off
SAVED = TRACKED[:-1]
RULE_SAME, RULE_OFFSET, RULE_UNDEF, RULE_UNKNOWN = 0, 1, 2, 3
#: saved at rbp + offset, rbp being the frame's own (``DW_CFA_expression: DW_OP_breg6 N``):
#: how gcc describes the saves of a function that realigns its stack (AVX-512 code)
RULE_AT_RBP = 4
#: KIND_CFA_DEREF: CFA = *(register + offset) (``DW_CFA_def_cfa_expression: DW_OP_bregN
#: M; DW_OP_deref``), the caller's stack pointer read from where a realigning prologue kept it
KIND_NONE, KIND_CFA, KIND_SIGNAL, KIND_CFA_DEREF = 0, 1, 2, 3
DW_OP_deref, DW_OP_breg0 = 0x06, 0x70
# where the rule that found a frame came from (``Frames.source``, the run's summary)
SRC_SAMPLE, SRC_CFI, SRC_RECIPE, SRC_RECIPE_FIX, SRC_SIGNAL, SRC_PLT, SRC_JIT = range(7)
SOURCES = {SRC_SAMPLE: "sample registers", SRC_CFI: "CFI", SRC_RECIPE: "recipes",
           SRC_RECIPE_FIX: "recipes where CFI failed", SRC_SIGNAL: "signal frames",
           SRC_PLT: "PLT stubs", SRC_JIT: "return addresses proved after code without a file"}
#: how the unwinder chooses: CFI first (default); recipes first (to compare them with CFI on
#: the same samples); CFI only (as before recipes existed)
MODES = ("cfi", "recipes", "cfi-only")
#: a module whose FDEs cover this share of its code gets recipes per procedure, on demand
MOSTLY_CFI = 0.5
# struct ucontext on x86-64: uc_flags, uc_link, uc_stack (24), then mcontext gregs[23]:
# R8 R9 R10 R11 R12 R13 R14 R15 RDI RSI RBP RBX RDX RAX RCX RSP RIP ...
UC_GREGS = 40
GREG = {RBX: 11, RBP: 10, R12: 4, R13: 5, R14: 6, R15: 7, RSP: 15, RA: 16}


class RowTable:
    """Deduplicated compiled rows; row 0 means 'no unwind information'."""

    def __init__(self) -> None:
        self._index: dict[tuple[int, ...], int] = {}
        self._rows: list[tuple[int, ...]] = []
        self.add(KIND_NONE, -1, 0, (RULE_UNKNOWN,) * len(TRACKED), (0,) * len(TRACKED))
        self._arrays: tuple[npt.NDArray[Any], ...] | None = None

    def add(self, kind: int, cfa_reg: int, cfa_off: int, rules: tuple[int, ...],
            offs: tuple[int, ...]) -> int:
        key = (kind, cfa_reg, cfa_off, *rules, *offs)
        i = self._index.get(key)
        if i is None:
            i = len(self._rows)
            self._index[key] = i
            self._rows.append(key)
            self._arrays = None
        return i

    def add_key(self, key: tuple[int, ...]) -> int:
        """The id of a row given as :meth:`key` returns it (from a :class:`RowCache`)."""
        i = self._index.get(key)  # (the key is ``add``'s: most rows of a run are known)
        if i is not None:
            return i
        k = len(TRACKED)
        return self.add(key[0], key[1], key[2], key[3:3 + k], key[3 + k:3 + 2 * k])

    def key(self, row: int) -> tuple[int, ...]:
        """A row's contents: (kind, cfa_reg, cfa_off, rules..., offsets...)."""
        return self._rows[row]

    def arrays(self) -> tuple[npt.NDArray[Any], ...]:
        """(kind, cfa_reg, cfa_off, rule[n,7], off[n,7]) as numpy arrays."""
        if self._arrays is None:
            t = np.array(self._rows, dtype=np.int64)
            k = len(TRACKED)
            self._arrays = (t[:, 0], t[:, 1], t[:, 2], t[:, 3:3 + k], t[:, 3 + k:3 + 2 * k])
        return self._arrays


#: Bumped whenever the row this module finds for a pc may change (the CFI compiler, the
#: recipes, the PLT rules): rows cached by another version are not used.
ROWS_VERSION = 1
_ROWS_FORMAT = "callpath unwind rows"
_NCOL = 3 + 2 * len(TRACKED)


class RowCache:
    """What earlier post-mortems found per (module, pc), kept on disk per module identity.

    Compiling a pc's row reads the module's CFI (its section table, the FDE,
    the DWARF row program) or analyses its procedure's instructions (recipes): about a
    millisecond per function, seconds for the thousands of functions a PyTorch run's stacks
    pass through, and the same again at every run of the same program. The final answer for a
    pc (its row and where it came from) depends only on the module's bytes and this module's
    code (``ROWS_VERSION``, the unwinding ``mode``), so it is cached per module file
    identity (build-id, else path, size and modification time) in ``DIR/<name>-<id>.rows``
    (the recipe cache's directory, :func:`callpath.measure.recipes.cache_dir`), and a later
    run opens no ELF section for the pcs it finds there. Entries are rewritten atomically
    with the union of what they held and what this run added."""

    def __init__(self, directory: Path | None, mode: str) -> None:
        self.directory = directory
        self.mode = mode
        # per module path: (file, source rows {pc: (key, src)}, recipe rows {pc: key}, new?)
        self._mods: dict[str, tuple[Path, dict[int, tuple[tuple[int, ...], int]],
                                    dict[int, tuple[int, ...]], list[bool]]] = {}
        #: per module path: CFI rows by address range (every row of each FDE compiled), so
        #: that a pc no run has seen in a function some run has seen costs no CFI decoding
        #: (each run of a PyTorch loop samples new pcs in the same MKL kernels)
        self._ivals: dict[str, _Intervals] = {}
        #: per module path: the entry's (inode, size, mtime) when read; ``save`` merges what
        #: the file holds only when another process replaced it since
        self._seen: dict[str, tuple[int, int, int] | None] = {}

    def _expect(self) -> dict[str, object]:
        return {"format": _ROWS_FORMAT, "version": ROWS_VERSION, "mode": self.mode}

    def _file(self, elf: ElfInfo) -> Path:
        from callpath.measure.recipes import cache_name
        assert self.directory is not None
        return self.directory / cache_name(elf.path, elf.build_id).replace(".npz", ".rows")

    def _read(self, file: Path, ivals: _Intervals | None = None
              ) -> tuple[dict[int, tuple[tuple[int, ...], int]], dict[int, tuple[int, ...]]]:
        from callpath.structure import store
        data = store.load_arrays(file, self._expect())
        if data is None:
            return {}, {}
        a = data[1]
        if ivals is not None and "ilo" in a and "ihi" in a and "irows" in a \
                and a["irows"].size == len(a["ilo"]) * _NCOL == len(a["ihi"]) * _NCOL:
            los, his = a["ilo"].tolist(), a["ihi"].tolist()
            irows = a["irows"].astype(np.int64).reshape(-1, _NCOL)
            if not ivals.lo and bool(np.all(np.diff(a["ilo"].astype(np.int64)) > 0)):
                # as ``save`` wrote them, sorted: taken whole (60k ranges in a PyTorch run's
                # libtorch_cpu.so, an insertion each cost 0.1 s), their rows made tuples only
                # when found (all of them cost 0.03 s more per warm merge)
                ivals.lo, ivals.hi = los, his
                ivals.base = irows
                ivals.key = list(range(len(los)))
            else:
                for lo, hi, key in zip(los, his, map(tuple, irows.tolist()), strict=True):
                    ivals.add(lo, hi, key)
        try:
            if a["rows"].size != len(a["pc"]) * _NCOL or \
                    a["rrows"].size != len(a["rpc"]) * _NCOL or len(a["src"]) != len(a["pc"]):
                return {}, {}
            src = {pc: (tuple(r), s) for pc, r, s in
                   zip(a["pc"].tolist(), a["rows"].reshape(-1, _NCOL).tolist(),
                       a["src"].tolist(), strict=True)}
            rec = {pc: tuple(r) for pc, r in
                   zip(a["rpc"].tolist(), a["rrows"].reshape(-1, _NCOL).tolist(), strict=True)}
        except (KeyError, ValueError):
            return {}, {}
        return src, rec

    def _module(self, elf: ElfInfo) -> tuple[Path, dict[int, tuple[tuple[int, ...], int]],
                                             dict[int, tuple[int, ...]], list[bool]] | None:
        got = self._mods.get(elf.path)
        if got is not None or self.directory is None:
            return got
        file = self._file(elf)
        ivals = self._ivals[elf.path] = _Intervals()
        self._seen[elf.path] = _identity(file)
        src, rec = self._read(file, ivals)
        got = self._mods[elf.path] = (file, src, rec, [False])
        return got

    def interval(self, elf: ElfInfo, vaddr: int) -> tuple[int, ...] | None:
        """The CFI row of a pc from the rows kept by address range, if any."""
        if self._module(elf) is None:
            return None
        return self._ivals[elf.path].find(vaddr)

    def add_interval(self, elf: ElfInfo, lo: int, hi: int, key: tuple[int, ...]) -> None:
        m = self._module(elf)
        if m is not None:
            self._ivals[elf.path].add(lo, hi, key)
            m[3][0] = True

    def source(self, elf: ElfInfo, vaddr: int) -> tuple[tuple[int, ...], int] | None:
        m = self._module(elf)
        return m[1].get(vaddr) if m is not None else None

    def recipe(self, elf: ElfInfo, vaddr: int) -> tuple[int, ...] | None:
        m = self._module(elf)
        return m[2].get(vaddr) if m is not None else None

    def add_source(self, elf: ElfInfo, vaddr: int, key: tuple[int, ...], src: int) -> None:
        m = self._module(elf)
        if m is not None:
            m[1][vaddr] = (key, src)
            m[3][0] = True

    def add_recipe(self, elf: ElfInfo, vaddr: int, key: tuple[int, ...]) -> None:
        m = self._module(elf)
        if m is not None:
            m[2][vaddr] = key
            m[3][0] = True

    def save(self) -> None:
        """Write the entries of the modules this run added to, with what the file holds now
        (another process, a forked unwinding worker, may have added to it since it was read;
        a cache that cannot be written only costs the compilation next time)."""
        from callpath.structure import store
        for path, (file, src, rec, new) in self._mods.items():
            if not new[0]:
                continue
            ivals = self._ivals[path]
            if _identity(file) != self._seen.get(path):
                disk_src, disk_rec = self._read(file, ivals)
                for k, v in disk_src.items():
                    src.setdefault(k, v)
                for k, r in disk_rec.items():
                    rec.setdefault(k, r)
            pcs = sorted(src)
            rpcs = sorted(rec)
            store.save_arrays(file, self._expect(), {
                "pc": np.array(pcs, dtype=np.uint64),
                "rows": np.array([src[p][0] for p in pcs], dtype=np.int64).reshape(-1),
                "src": np.array([src[p][1] for p in pcs], dtype=np.int8),
                "rpc": np.array(rpcs, dtype=np.uint64),
                "rrows": np.array([rec[p] for p in rpcs], dtype=np.int64).reshape(-1),
                "ilo": np.array(ivals.lo, dtype=np.uint64),
                "ihi": np.array(ivals.hi, dtype=np.uint64),
                "irows": ivals.rows().reshape(-1)})
            new[0] = False
            self._seen[path] = _identity(file)


def _identity(file: Path) -> tuple[int, int, int] | None:
    """A file's (inode, size, modification time), None where it does not exist: entries are
    replaced by a rename, so an unchanged identity means no other process wrote one."""
    try:
        st = file.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class _Intervals:
    """Disjoint address ranges [lo, hi) of one module, each with a row key, sorted by lo."""

    def __init__(self) -> None:
        self.lo: list[int] = []
        self.hi: list[int] = []
        #: a row key, or the index of its row in ``base`` (the rows read from the cache)
        self.key: list[tuple[int, ...] | int] = []
        self.base: npt.NDArray[np.int64] = np.zeros((0, _NCOL), dtype=np.int64)

    def _key(self, i: int) -> tuple[int, ...]:
        k = self.key[i]
        if isinstance(k, int):
            k = self.key[i] = tuple(self.base[k].tolist())
        return k

    def find(self, pc: int) -> tuple[int, ...] | None:
        i = bisect.bisect_right(self.lo, pc) - 1
        return self._key(i) if i >= 0 and pc < self.hi[i] else None

    def rows(self) -> npt.NDArray[np.int64]:
        """The row keys as an (n, 17) array, in range order (what ``save`` writes)."""
        out = np.zeros((len(self.key), _NCOL), dtype=np.int64)
        at = [i for i, k in enumerate(self.key) if isinstance(k, int)]
        if at:
            out[at] = self.base[[self.key[i] for i in at]]
        own = [i for i, k in enumerate(self.key) if not isinstance(k, int)]
        if own:
            out[own] = np.array([self.key[i] for i in own], dtype=np.int64)
        return out

    def add(self, lo: int, hi: int, key: tuple[int, ...]) -> None:
        i = bisect.bisect_left(self.lo, lo)
        if i < len(self.lo) and self.lo[i] == lo:
            return
        self.lo.insert(i, lo)
        self.hi.insert(i, hi)
        self.key.insert(i, key)


def row_cache(mode: str) -> RowCache | None:
    """The per-user row cache (None where the recipe cache is turned off)."""
    from callpath.measure.recipes import cache_dir
    d = cache_dir()
    return RowCache(d, mode) if d is not None and os.environ.get(
        "CALLPATH_ROW_CACHE", "on") != "off" else None


class Compiler:
    """pc → row id, memoised per (module file, link-time address).

    With ``recipes`` (a module's unwind recipes, computed from its instructions) a pc without
    usable CFI gets the recipe's row; ``mode`` (one of ``MODES``) may put recipes first.
    With ``cache``, rows found by earlier runs are taken from it and new ones added to it
    (:class:`RowCache`; the caller saves it).
    """

    def __init__(self, table: RowTable,
                 recipes: Callable[[ElfInfo], Recipes | None] | None = None,
                 mode: str = "cfi", cache: RowCache | None = None) -> None:
        self.table = table
        self.cache = cache
        self._memo: dict[tuple[str, int], int] = {}
        self._src: dict[tuple[str, int], tuple[int, int]] = {}
        self._rmemo: dict[tuple[str, int], int] = {}
        self._recipe_rows: dict[tuple[int, ...], int] = {}
        self._proc_memo: dict[tuple[str, int], list[tuple[int, tuple[int, ...]]]] = {}
        self._coverage: dict[str, bool] = {}
        self.recipes = recipes if mode != "cfi-only" else None
        self.mode = mode
        self.signal_row = table.add(KIND_SIGNAL, RSP, 0, (RULE_UNKNOWN,) * len(TRACKED),
                                    (0,) * len(TRACKED))
        #: frames found per source (SRC_*), summed by ``unwind`` over every sample
        self.frame_sources = [0] * len(SOURCES)

    def row(self, elf: ElfInfo, vaddr: int) -> int:
        """The CFI row of a pc (0: none)."""
        key = (elf.path, vaddr)
        r = self._memo.get(key)
        if r is None:
            try:
                r = self._compile(elf, vaddr)
            except Exception:  # malformed CFI in some module: no info for this pc
                r = 0
            self._memo[key] = r
        return r

    def recipe_row(self, elf: ElfInfo, vaddr: int) -> int:
        """The row of the module's unwind recipe at a pc (0: no recipe). In a module that CFI
        describes almost entirely (a system library), the few pcs it leaves out are analysed
        procedure by procedure; other modules are analysed whole (and cached)."""
        if self.recipes is None:
            return 0
        key = (elf.path, vaddr)
        r = self._rmemo.get(key)
        if r is None:
            if self.mode != "recipes" and self._mostly_cfi(elf):
                return self.procedure_recipe_row(elf, vaddr)
            r = 0
            rec = self.recipes(elf)
            if rec is not None:
                import numpy as np
                i = int(rec.lookup(np.array([vaddr], dtype=np.uint64))[0])
                if i >= 0:
                    r = self._recipe_table_row(tuple(int(x) for x in rec.rows[i]))
            self._rmemo[key] = r
        return r

    def _mostly_cfi(self, elf: ElfInfo) -> bool:
        got = self._coverage.get(elf.path)
        if got is None:
            from callpath.structure.unwind_recipes import cfi_coverage
            try:
                got = cfi_coverage(elf.path) >= MOSTLY_CFI
            except Exception:  # not an ELF file the analysis can open: whole-module path
                got = False
            self._coverage[elf.path] = got
        return got

    def procedure_recipe_row(self, elf: ElfInfo, vaddr: int) -> int:
        """The recipe row at a pc from its procedure alone (bounds: the FDE's range, else the
        function symbol's), so that one odd pc does not cost a whole library's analysis."""
        if self.recipes is None:
            return 0
        key = (elf.path, vaddr)
        r = self._rmemo.get(key)
        if r is not None:
            return r
        if self.cache is not None:
            hit = self.cache.recipe(elf, vaddr)
            if hit is not None:
                r = self._rmemo[key] = self.table.add_key(hit)
                return r
            r = self._procedure_recipe_row(elf, vaddr, key)
            self.cache.add_recipe(elf, vaddr, self.table.key(r))
            return r
        return self._procedure_recipe_row(elf, vaddr, key)

    def _procedure_recipe_row(self, elf: ElfInfo, vaddr: int, key: tuple[str, int]) -> int:
        fde = elf.fde_for(vaddr)
        if fde is not None:
            lo, hi = fde.lo, fde.hi
        else:
            t = elf.symbol_table()
            i = int(t.starts.searchsorted(vaddr, side="right")) - 1
            entry, after = elf.entry_point(), elf.next_fde_start(elf.entry_point())
            if i >= 0 and vaddr < int(t.ends[i]) and int(t.ends[i]) - int(t.starts[i]) > 1:
                lo, hi = int(t.starts[i]), int(t.ends[i])
            elif entry <= vaddr < after:  # entry code without symbol nor CFI (ld.so's _start)
                lo, hi = entry, after
            else:
                self._rmemo[key] = 0
                return 0
        rows = self._proc_memo.get((elf.path, lo))
        if rows is None:
            from callpath.structure.unwind_recipes import procedure_rows
            code = elf.read_code(lo, hi)
            rows = procedure_rows(code, lo, lo == elf.entry_point()) if code else []
            self._proc_memo[(elf.path, lo)] = rows
        r = 0
        i = bisect.bisect_right([a for a, _ in rows], vaddr) - 1
        if i >= 0 and rows[i][1][0] >= 1:
            r = self._recipe_table_row(rows[i][1])
        self._rmemo[key] = r
        return r

    def _recipe_table_row(self, rr: tuple[int, ...]) -> int:
        r = self._recipe_rows.get(rr)
        if r is None:
            kind, reg, off, *saves = rr[:-1]  # the last column only serves comparisons
            if kind == 3:  # a signal trampoline
                r = self.signal_row
            elif kind == 2:  # the program's entry point: the outermost frame
                rules = (RULE_SAME,) * len(SAVED) + (RULE_UNDEF,)
                r = self.table.add(KIND_CFA, RSP, 8, rules, (0,) * len(TRACKED))
            else:
                rules = (*tuple(RULE_OFFSET if v else RULE_SAME for v in saves), RULE_OFFSET)
                r = self.table.add(KIND_CFA, reg, off, rules, (*saves, -8))
            self._recipe_rows[rr] = r
        return r

    def row_source(self, elf: ElfInfo, vaddr: int) -> tuple[int, int]:
        """(row, SRC_*) of a pc: CFI where it exists and recipes elsewhere (or the other way
        round in mode ``recipes``)."""
        key = (elf.path, vaddr)
        got = self._src.get(key)
        if got is None and self.cache is not None:
            hit = self.cache.source(elf, vaddr)
            if hit is not None:
                got = self._src[key] = (self.table.add_key(hit[0]), hit[1])
                return got
            if self.mode != "recipes":
                row_key = self.cache.interval(elf, vaddr)
                if row_key is not None:
                    got = self._src[key] = (self.table.add_key(row_key), SRC_CFI)
                    return got
            got = self._row_source(elf, vaddr, key)
            if got[1] == SRC_CFI and got[0] != 0 and self.mode != "recipes":
                for lo, hi, r in self.fde_intervals(elf, vaddr):
                    self.cache.add_interval(elf, lo, hi, self.table.key(r))
            else:
                self.cache.add_source(elf, vaddr, self.table.key(got[0]), got[1])
            return got
        return got if got is not None else self._row_source(elf, vaddr, key)

    def _row_source(self, elf: ElfInfo, vaddr: int, key: tuple[str, int]) -> tuple[int, int]:
        got = None
        if self.mode == "recipes" and elf.plt_section(vaddr) is None:
            rr = self.recipe_row(elf, vaddr)
            if rr:
                got = (rr, SRC_SIGNAL if rr == self.signal_row else SRC_RECIPE)
                self._src[key] = got
        if got is None:
            cfi_row = self.row(elf, vaddr)  # 0: no usable CFI (the only KIND_NONE row)
            src = (SRC_SIGNAL if cfi_row == self.signal_row else
                   SRC_PLT if elf.plt_section(vaddr) is not None else SRC_CFI)
            if (cfi_row == 0 or self.mode == "recipes") and src == SRC_CFI:
                rr = self.recipe_row(elf, vaddr)
                got = ((rr, SRC_SIGNAL if rr == self.signal_row else SRC_RECIPE) if rr
                       else (cfi_row, SRC_CFI))
            else:
                got = (cfi_row, src)
            self._src[key] = got
        return got

    def _compile(self, elf: ElfInfo, vaddr: int) -> int:
        plt = elf.plt_section(vaddr)
        if (plt is not None and plt != ".plt") or (plt == ".plt" and elf.fde_for(vaddr) is None):
            return self._plt_row(elf, vaddr, plt)
        fde = elf.fde_for(vaddr)
        if fde is None:
            return 0
        if fde.signal:
            return self.signal_row
        if plt == ".plt":
            return self._plt_row(elf, vaddr, plt)
        lines = fde.lines()  # raises on malformed CFI: no row for this pc (``row``)
        i = bisect.bisect_right([ln.pc for ln in lines], vaddr) - 1
        if i < 0:
            return 0
        return self._table_row(lines[i])

    def fde_intervals(self, elf: ElfInfo, vaddr: int) -> list[tuple[int, int, int]]:
        """(lo, hi, row) of every row of the FDE around a pc whose row was compiled from CFI
        (not a signal frame's nor a PLT stub's; rows the unwinder cannot use left out): what
        :class:`RowCache` keeps so that a later run finds the other pcs of the function
        without decoding its FDE again."""
        fde = elf.fde_for(vaddr)
        if fde is None or fde.signal:
            return []
        try:
            lines = fde.lines()
        except CfiError:
            return []
        out = []
        for k, line in enumerate(lines):
            hi = lines[k + 1].pc if k + 1 < len(lines) else fde.hi
            if hi <= line.pc:
                continue
            try:
                r = self._table_row(line)
            except Exception:  # as in row(): malformed CFI is no information
                r = 0
            if r:
                out.append((line.pc, hi, r))
        return out

    def _table_row(self, row: Line) -> int:
        """The row id of one decoded CFI row (0: not usable)."""
        kind = KIND_CFA
        if row.cfa_expr is not None:
            got = _breg(row.cfa_expr, deref=True)
            if got is None:
                return 0
            kind, cfa_reg, cfa_off = KIND_CFA_DEREF, *got
        elif row.cfa_reg is None:
            return 0
        else:
            cfa_reg, cfa_off = row.cfa_reg, row.cfa_off
        if cfa_reg not in (RSP, *SAVED):
            return 0  # a register the unwinder does not recover
        rules: list[int] = []
        offs: list[int] = []
        for reg in TRACKED:
            rr = row.rules.get(reg)
            if rr is None:
                rules.append(RULE_SAME)
                offs.append(0)
            elif rr[0] == OFFSET:
                rules.append(RULE_OFFSET)
                offs.append(int(rr[1]))
            elif rr[0] == UNDEFINED:
                rules.append(RULE_UNDEF)
                offs.append(0)
            elif rr[0] == SAME_VALUE:
                rules.append(RULE_SAME)
                offs.append(0)
            elif rr[0] == EXPRESSION and reg != RA and (b := _breg(rr[1])) is not None \
                    and b[0] == RBP:
                rules.append(RULE_AT_RBP)
                offs.append(b[1])
            else:
                rules.append(RULE_UNKNOWN)
                offs.append(0)
        return self.table.add(kind, cfa_reg, cfa_off, tuple(rules), tuple(offs))

    def _plt_row(self, elf: ElfInfo, vaddr: int, name: str | None) -> int:
        """PLT stubs: CFA = rsp + 8 except after the push of a lazy-binding stub."""
        off = 8
        if name == ".plt":
            lo = next(s for s, _e, n in elf.plt if n == ".plt")
            rel = vaddr - lo
            # PLT0: push GOT[1] (6 bytes), jmp *GOT[2]; PLTn: jmp *GOT(n), push n, jmp PLT0
            plt0 = 16 if rel >= 6 else 8
            off = plt0 if rel < 16 else (16 if (vaddr & 15) >= 11 else 8)
        rules = (RULE_SAME,) * len(SAVED) + (RULE_OFFSET,)
        return self.table.add(KIND_CFA, RSP, off, rules, (0,) * len(SAVED) + (-8,))


def _breg(expr: bytes, deref: bool = False) -> tuple[int, int] | None:
    """(register, offset) of a DWARF expression ``DW_OP_bregN offset`` (followed by
    ``DW_OP_deref`` when ``deref``); None for any other expression."""
    ops = list(expr)
    if not ops or not DW_OP_breg0 <= ops[0] < DW_OP_breg0 + 32:
        return None
    try:
        value, i = sleb(bytes(ops), 1)
    except IndexError:  # the offset is cut short
        return None
    reg = ops[0] - DW_OP_breg0
    rest = ops[i:]
    return (reg, value) if rest == ([DW_OP_deref] if deref else []) else None
