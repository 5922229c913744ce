"""Unwind recipes of the modules a run used: computed once per module file (by build-id) and
cached on disk like structure files, so that only the first run that meets a libc pays for
its analysis (:mod:`callpath.structure.unwind_recipes`).

The cache lives in ``$XDG_CACHE_HOME/callpath/recipes/`` (``~/.cache`` by default), one
``<name>-<build id>.npz`` per module (modules without a build-id are keyed by path, size and
modification time). ``CALLPATH_RECIPE_CACHE`` names another directory, or ``off`` for none.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from callpath.measure.elfinfo import ElfInfo
from callpath.structure.unwind_recipes import Recipes, compute


def cache_dir() -> Path | None:
    env = os.environ.get("CALLPATH_RECIPE_CACHE")
    if env == "off":
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "callpath" / "recipes"


def cache_name(path: str, build_id: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._+-]", "", os.path.basename(path)) or "module"
    if not build_id:
        try:
            st = os.stat(path)
            ident = f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            ident = path
        build_id = hashlib.sha1(ident.encode()).hexdigest()[:16]
    return f"{name}-{build_id}.npz"


@dataclass
class Computed:
    """One analysis done by this run (for the summary's timing line)."""

    path: str
    seconds: float
    text_bytes: int
    cached: bool


@dataclass
class RecipeStore:
    """Recipes by module path for one post-mortem: memory first, then the disk cache, then
    the analysis. A module that cannot be analysed (not ELF, no code) has none."""

    directory: Path | None = field(default_factory=cache_dir)
    log: list[Computed] = field(default_factory=list)
    _memo: dict[str, Recipes | None] = field(default_factory=dict)

    def get(self, elf: ElfInfo) -> Recipes | None:
        if elf.path in self._memo:
            return self._memo[elf.path]
        rec: Recipes | None = None
        file = self.directory / cache_name(elf.path, elf.build_id) if self.directory else None
        t0 = time.perf_counter()
        if file is not None and file.exists():
            rec = Recipes.load(file)
            if rec is not None:
                self.log.append(Computed(elf.path, time.perf_counter() - t0, rec.text_bytes,
                                         True))
        if rec is None:
            try:
                rec = compute(elf.path)
            except Exception as e:  # odd files: no recipes, and the run goes on
                print(f"callpath: no unwind recipes for {elf.path}: {e}", file=sys.stderr)
                rec = None
            if rec is not None:
                self.log.append(Computed(elf.path, rec.seconds, rec.text_bytes, False))
                if file is not None:
                    try:
                        file.parent.mkdir(parents=True, exist_ok=True)
                        rec.save(file)
                    except OSError:
                        pass  # a read-only cache only costs the analysis next time
        self._memo[elf.path] = rec
        return rec


@dataclass
class Agreement:
    """How recipes compare with a module's CFI, in bytes of code covered by both."""

    path: str
    both: int = 0        # bytes where CFI has a plain rule and a recipe exists
    agree: int = 0       # ... where they find the return address and the caller's rbp alike
    agree_all: int = 0   # ... and every saved register alike
    cfi_only: int = 0    # bytes with a CFI rule but no recipe
    fdes: int = 0

    @property
    def share(self) -> float:
        return self.agree / self.both if self.both else 0.0


def compare_with_cfi(path: str, rec: Recipes, every: int = 1) -> Agreement:
    """Walk every ``every``-th FDE of ``.eh_frame`` and compare its rows with the recipes,
    range by range. "Alike" means the same CFA (register and offset: the return address is
    at CFA - 8 in both) and the same slot for rbp (the caller's frame pointer); a CFI save
    slot below the stack pointer (after the epilogue's pop, where gcc's CFI keeps the rule)
    counts as restored, as the unwinder treats it; a CFI rule that is a DWARF expression is
    left out (no recipe can be compared with it)."""
    import numpy as np
    from elftools.dwarf.callframe import FDE
    from elftools.elf.elffile import ELFFile

    from callpath.structure.unwind_recipes import CFA_OFF, CFA_REG, KIND, SAVE_COLS, SP_COL

    out = Agreement(path)
    dwarf_cols = (3, 6, 12, 13, 14, 15)  # rbx rbp r12-r15, the order of the recipe columns
    with open(path, "rb") as fh:
        dw = ELFFile(fh).get_dwarf_info(relocate_dwarf_sections=False)
        if not dw.has_EH_CFI():
            return out
        fdes = [e for e in dw.EH_CFI_entries() if isinstance(e, FDE)][::max(every, 1)]
        for fde in fdes:
            lo = int(fde.header["initial_location"])
            hi = lo + int(fde.header["address_range"])
            fde.instructions = [i for i in fde.instructions if int(i.opcode) != 0x2E]
            try:
                table = fde.get_decoded().table
            except Exception:  # a rule pyelftools cannot decode: not comparable
                continue
            out.fdes += 1
            locs = [int(r["pc"]) for r in table] + [hi]
            for r, a, b in zip(table, locs, locs[1:], strict=False):
                if b <= a:
                    continue
                cfa = r["cfa"]
                if cfa.expr is not None or cfa.reg not in (6, 7):
                    continue
                # the recipe ranges inside [a, b)
                i0 = int(np.searchsorted(rec.starts, a, side="right")) - 1
                i1 = int(np.searchsorted(rec.starts, b, side="left"))
                for i in range(max(i0, 0), i1):
                    s = max(a, int(rec.starts[i]))
                    e = min(b, int(rec.starts[i + 1]) if i + 1 < len(rec.starts) else b)
                    if e <= s:
                        continue
                    rid = int(rec.rid[i])
                    row = rec.rows[rid] if rid >= 0 else None
                    if row is None or row[KIND] != 1:
                        out.cfi_only += e - s
                        continue
                    out.both += e - s
                    slots = []
                    for c in dwarf_cols:
                        rr = r.get(c)
                        slot = int(rr.arg) if rr is not None and rr.type == "OFFSET" else 0
                        if cfa.reg == 7 and slot < -int(cfa.offset):
                            slot = 0  # below rsp (an epilogue popped it): the value is back
                        slots.append(slot)
                    # the same CFA, or the same rsp offset beside a frame pointer
                    same_cfa = ((int(row[CFA_REG]), int(row[CFA_OFF])) == (int(cfa.reg),
                                                                            int(cfa.offset))
                                or (cfa.reg == 7 and int(row[SP_COL]) == int(cfa.offset)))
                    if same_cfa and int(row[SAVE_COLS + 1]) == slots[1]:
                        out.agree += e - s
                        if [int(x) for x in row[SAVE_COLS:SP_COL]] == slots:
                            out.agree_all += e - s
    return out
