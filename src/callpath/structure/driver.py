"""Analysing many load modules: dispatch by file type, per-module errors, caching, parallelism.

One bad module (not an ELF, truncated, corrupt DWARF, unknown architecture) must not stop the
others: each job returns either a structure or the one-line message of its
:class:`CallpathError`. Results are cached by build-id (or, without one, by path, size and
modification time) in the measurement directory and in ``$XDG_CACHE_HOME/callpath/structs``,
so a module used by many runs is analysed once.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from callpath.errors import CallpathError
from callpath.structure.model import Structure


@dataclass
class Job:
    path: str  # the file to analyse
    name: str  # the load module's name as the run saw it (written as LM n=)
    cache: list[Path]  # candidate cache files, first = preferred place to write


@dataclass
class Result:
    job: Job
    structure: Structure | None
    error: str | None
    cached: bool = False


def analyze_path(path: str) -> Structure:
    """Structure of one file: a Python source (by suffix) or an ELF load module."""
    if path.endswith(".py"):
        from callpath.structure.python_ast import structure_of_python
        return structure_of_python(path)
    from callpath.structure.binary import analyze_binary
    return analyze_binary(path)


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "callpath" / "structs"


def cache_key(path: str, build_id: str | None) -> str:
    """``<name>-<build id>`` or, without one, ``<name>-<hash of path, size, mtime>``."""
    name = os.path.basename(path) or "module"
    if build_id:
        return f"{name}-{build_id}"
    try:
        st = os.stat(path)
        ident = f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        ident = path
    return f"{name}-{hashlib.sha1(ident.encode()).hexdigest()[:16]}"


def build_id_of(path: str) -> str | None:
    """The GNU build-id of an ELF file, cheaply (None for other files or on any error)."""
    if path.endswith(".py"):
        return None
    try:
        from callpath.structure.elf import open_elf
        m = open_elf(path, require_code=False)
    except CallpathError:
        return None
    try:
        return m.build_id
    finally:
        m.close()


def run_job(job: Job) -> Result:
    """Analyse one module, through the cache; never raises a user error."""
    from callpath.formats.hpcstruct import read_hpcstruct, write_hpcstruct_file
    for c in job.cache:
        if c.is_file():
            try:
                got = read_hpcstruct(c)
            except CallpathError:
                continue  # a damaged cache entry is recomputed
            if got:
                return Result(job, got[0], None, cached=True)
    try:
        s = analyze_path(job.path)
    except CallpathError as e:
        return Result(job, None, str(e))
    except (MemoryError, RecursionError) as e:
        return Result(job, None, f"{job.path}: analysis failed ({type(e).__name__})")
    s.path = job.name
    for c in job.cache:
        try:
            c.parent.mkdir(parents=True, exist_ok=True)
            write_hpcstruct_file([s], c)
        except OSError:
            continue
    return Result(job, s, None)


def run_jobs(jobs: list[Job], workers: int,
             progress: Callable[[int, int, Result], None] | None = None) -> list[Result]:
    """Run ``jobs`` over ``workers`` processes (in-process for one worker or one job)."""
    results: list[Result] = []
    it: Iterable[Result]
    if workers <= 1 or len(jobs) <= 1:
        it = (run_job(j) for j in jobs)
        for r in it:
            results.append(r)
            if progress:
                progress(len(results), len(jobs), r)
        return results
    import multiprocessing as mp
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ctx.Pool(min(workers, len(jobs))) as pool:
        for r in pool.imap(run_job, jobs):
            results.append(r)
            if progress:
                progress(len(results), len(jobs), r)
    return results


class ProgressBar:
    """A one-line progress bar on a terminal; silent otherwise."""

    def __init__(self, stream: IO[str] | None = None, enabled: bool | None = None) -> None:
        self.stream: IO[str] = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(isatty and isatty()) if enabled is None else enabled

    def __call__(self, done: int, total: int, r: Result) -> None:
        if not self.enabled:
            return
        width = 30
        filled = width * done // max(total, 1)
        name = os.path.basename(r.job.name)[:30]
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
                          f"{name:<30}")
        if done == total:
            self.stream.write("\n")
        self.stream.flush()
