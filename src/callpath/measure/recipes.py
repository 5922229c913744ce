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
