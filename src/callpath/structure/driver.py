"""Analysing many load modules: dispatch by file type, per-module errors, caching, parallelism.

One bad module (not an ELF, truncated, corrupt DWARF, unknown architecture) must not stop the
others: each job returns either a structure or the one-line message of its
:class:`CallpathError`. Results are cached by build-id (or, without one, by path, size and
modification time) in the measurement directory and in ``$XDG_CACHE_HOME/callpath/structs``,
so a module used by many runs is analysed once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
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
    error: str | None = None  # known before any analysis (missing file, changed build-id)
    #: False when only the cache file matters (``struct MEASDIR`` without ``-o``): a cache hit
    #: is then checked for completeness but not parsed.
    need_structure: bool = True
    #: Processes for this one module (>1 only when it dominates the work, see run_jobs).
    threads: int = 1
    #: GPU binaries: look for nvdisasm to recover loops (minutes on the largest cubins;
    #: ``prof``'s on-demand structure, which maps kernel entries only, goes without)
    gpu_loops: bool = True


@dataclass
class Result:
    job: Job
    structure: Structure | None
    error: str | None
    cached: bool = False
    #: what the analysis could not recover, one line each (a GPU binary without line
    #: information, or without nvdisasm for its loops)
    notes: list[str] | None = None


def analyze_path(path: str, threads: int = 1,
                 progress: Callable[[int, int], None] | None = None) -> Structure:
    """Structure of one file: a Python source (by suffix) or an ELF load module (built by
    ``threads`` processes if it is large; ``progress(procedures done, total)``)."""
    if path.endswith(".py"):
        from callpath.structure.python_ast import structure_of_python
        return structure_of_python(path)
    from callpath.structure.cubin import analyze_gpu_binary, gpu_binary_kind
    if gpu_binary_kind(path):
        return analyze_gpu_binary(path).structure
    from callpath.structure.binary import analyze_binary
    return analyze_binary(path, jobs=threads, progress=progress)


#: Bumped whenever the analysis changes what it finds (v2: call sites, split DWARF, ifuncs;
#: v3: procedures named from symbols demangled; v4: a callee is no-return where the caller's
#: own DWARF units mark it so): cache entries stamped with another version are recomputed.
ANALYSIS_VERSION = 4
_STAMP = f"callpath struct analysis {ANALYSIS_VERSION}"


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "callpath" / "structs"


def _file_ident(path: str) -> str:
    try:
        st = os.stat(path)
        return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        return path


def cache_key(path: str, build_id: str | None, debug: str | None = None) -> str:
    """``<name>-<build id>`` or, without one, ``<name>-<hash of path, size, mtime>``.

    ``debug`` names where the DWARF comes from when it is in a separate file (see
    :func:`debug_tag`): installing a debug package later changes the key, so the better
    structure is recomputed instead of the cached one without lines being reused.
    """
    name = re.sub(r"[^A-Za-z0-9._+-]", "", os.path.basename(path)) or "module"
    ident = build_id or hashlib.sha1(_file_ident(path).encode()).hexdigest()[:16]
    if debug:
        ident += "-" + hashlib.sha1(debug.encode()).hexdigest()[:8]
    return f"{name}-{ident}"


def build_id_of(path: str) -> str | None:
    """The GNU build-id of an ELF file, cheaply (None for other files or on any error)."""
    return module_identity(path)[0]


def module_identity(path: str) -> tuple[str | None, str | None]:
    """``(build id, debug tag)`` of an ELF file; ``(None, None)`` for other files or errors.

    The debug tag is None when the file carries its own DWARF, else the identity (path, size,
    mtime) of the separate debug file found for it, or ``"none"``.
    """
    if path.endswith(".py"):
        return None, None
    from callpath.structure.cubin import find_nvdisasm, gpu_binary_kind
    if gpu_binary_kind(path):  # the structure has loops only where nvdisasm was found
        return None, "nvdisasm" if find_nvdisasm() else "no-nvdisasm"
    from callpath.structure.elf import find_debug_file, open_elf
    from callpath.structure.elfheaders import read_headers

    h = read_headers(path)  # the usual file: its headers read directly, no pyelftools
    if h is not None:
        if not h.sections:
            return None, None  # as open_elf refuses it
        bid = h.build_id or None
        if h.has_dwarf():
            return bid, None
        dbg = find_debug_file(h)
        return bid, _file_ident(dbg) if dbg else "none"
    try:
        m = open_elf(path, require_code=False)
    except CallpathError:
        return None, None
    try:
        if m.has_dwarf():
            return m.build_id, None
        dbg = find_debug_file(m)
        return m.build_id, _file_ident(dbg) if dbg else "none"
    except CallpathError:
        return m.build_id, None
    finally:
        m.close()


def run_job(job: Job, progress: Callable[[int, int], None] | None = None) -> Result:
    """Analyse one module, through the cache; never raises a user error. ``progress`` is
    told how many of its procedures are built (the analysis of one big library is minutes)."""
    from callpath.formats.hpcstruct import read_hpcstruct, write_hpcstruct_file
    if job.error is not None:
        return Result(job, None, job.error)
    for n, c in enumerate(job.cache):
        if not c.is_file():
            continue
        if not _current(c):
            continue  # written by another version of the analysis: recomputed
        got: list[Structure] = []
        if job.need_structure or not _complete(c):
            try:
                got = read_hpcstruct(c)
            except CallpathError:
                continue  # a damaged cache entry is recomputed
            if not got:
                continue
        for earlier in job.cache[:n]:  # e.g. the user's cache -> MEASDIR/structs
            try:
                earlier.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(c, earlier)
            except OSError:
                pass
        if not got:
            return Result(job, None, None, cached=True)
        got[0].path = job.name
        return Result(job, got[0], None, cached=True)
    notes: list[str] | None = None
    try:
        from callpath.structure.cubin import analyze_gpu_binary, gpu_binary_kind
        if gpu_binary_kind(job.path):
            g = analyze_gpu_binary(job.path, nvdisasm=job.gpu_loops)
            s, notes = g.structure, [f"{job.name}: {n}" for n in g.notes]
        else:
            s = analyze_path(job.path, job.threads, progress)
    except CallpathError as e:
        return Result(job, None, str(e))
    except (MemoryError, RecursionError) as e:
        return Result(job, None, f"{job.path}: analysis failed ({type(e).__name__})")
    s.path = job.name
    for c in job.cache:
        try:
            c.parent.mkdir(parents=True, exist_ok=True)
            write_hpcstruct_file([s], c, comment=_STAMP)
        except OSError:
            continue
    return Result(job, s, None, notes=notes)


def _current(path: Path) -> bool:
    """Whether a cached structure file carries this analysis version's stamp."""
    try:
        with open(path, "rb") as f:
            head = f.read(8192)
    except OSError:
        return False
    return f"<!-- {_STAMP} -->".encode() in head


def _complete(path: Path) -> bool:
    """Whether a structure file ends with its closing tag (writes are atomic renames, so this
    only fails for files damaged by something else)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64))
            return f.read().rstrip().endswith(b"</HPCToolkitStructure>")
    except OSError:
        return False


def idle_cores(workers: int) -> int:
    """How many processes one module's analysis should use, at most ``workers``, when the
    user did not ask for a number: splitting pays only with idle cores (measured on two
    shared cores: 8.1 -> 5.9 s for libpython with one core free, 6.9 -> 9.5 s with none), so
    the 1-minute load average (which counts this process) bounds it."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return max(workers, 1)
    free = (os.cpu_count() or 1) - load + 1
    return max(1, min(workers, int(free + 0.5)))


def run_jobs(jobs: list[Job], workers: int,
             progress: Callable[[int, int, Result], None] | None = None, *,
             explicit: bool = False) -> list[Result]:
    """Run ``jobs`` over ``workers`` processes (in-process for one worker or one job).

    The biggest files are started first (one large library would otherwise finish alone at the
    end); results come back in the order of ``jobs``. A module analysed alone (or bigger than
    the others together) is split over ``workers`` processes by address range when the user
    asked for that many (``explicit``: ``struct -j N``), else over the idle cores
    (:func:`idle_cores`): a number the user gave is honoured whatever the load (under load
    the split processes share the cores with the others, and the CPU time is the same).
    """
    results: list[Result] = []
    it: Iterable[Result]

    def split(workers: int) -> int:
        return max(1, workers) if explicit else idle_cores(workers)

    if len(jobs) == 1:
        jobs[0].threads = split(workers)
    if workers <= 1 or len(jobs) <= 1:
        inner = getattr(progress, "procedures", None)
        it = (run_job(j, inner(j) if inner is not None else None) for j in jobs)
        for r in it:
            results.append(r)
            if progress:
                progress(len(results), len(jobs), r)
        return results
    import multiprocessing as mp

    def size(j: Job) -> int:
        try:
            return os.path.getsize(j.path)
        except OSError:
            return 0

    order = sorted(range(len(jobs)), key=lambda k: -size(jobs[k]))
    # A module bigger than all the others together (libc beside a small program) would finish
    # alone on one core: let it build its procedures in several processes.
    sizes = [size(j) for j in jobs]
    big = order[0]
    if sizes[big] > sum(sizes) - sizes[big]:
        jobs[big].threads = split(workers)
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    # an executor, not a multiprocessing pool: a pool waits forever for a worker that the
    # out-of-memory killer took, an executor says its pool broke
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx) as pool:
        futures = [pool.submit(run_job, jobs[k]) for k in order]
        try:
            for f in as_completed(futures):
                r = f.result()
                results.append(r)
                if progress:
                    progress(len(results), len(jobs), r)
        except BrokenProcessPool:
            raise CallpathError("a worker process of the structure analysis died (killed by "
                                "a signal; out of memory?)") from None
    # Results come back pickled (new Job objects): match them by path and name.
    index = {(r.job.path, r.job.name): r for r in results}
    return [index[(j.path, j.name)] for j in jobs]


class ProgressBar:
    """A one-line progress bar on a terminal; silent otherwise."""

    def __init__(self, stream: IO[str] | None = None, enabled: bool | None = None) -> None:
        self.stream: IO[str] = stream or sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(isatty and isatty()) if enabled is None else enabled

    def procedures(self, job: Job) -> Callable[[int, int], None] | None:
        """A progress callback for the procedures of ``job`` (one module analysed in this
        process): ``name: 41% of 385,177 procedures`` on the same line."""
        if not self.enabled:
            return None
        name = os.path.basename(job.name)[:30]

        def show(done: int, total: int) -> None:
            pct = 100 * done // max(total, 1)
            self.stream.write(f"\r{name}: {pct:3d}% of {total:,} procedures ")
            self.stream.flush()
        return show

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


def measurement_jobs(directory: str | os.PathLike[str], *, user_cache: bool = True) -> list[Job]:
    """One job per distinct load module (and Python source) of a measurement directory.

    Modules are identified by build-id (the same library mapped by many processes, or under two
    paths, is analysed once); images the run saved (the vdso) are taken from the directory.
    Results are cached in ``MEASDIR/structs/`` (where ``callpath prof`` looks) and, unless
    ``user_cache`` is False, in the per-user cache. A module whose file is gone, or whose
    build-id differs from the one recorded at run time (rebuilt since), gets a job that only
    reports that.
    """
    from callpath.formats import measdir

    d = Path(directory)
    m = measdir.read(d)
    jobs: dict[str, Job] = {}
    for proc in m.processes:
        for mod in proc.modules:
            path = str(d / mod.saved) if mod.saved else mod.path
            if not path or path.startswith("["):
                continue  # a pseudo module without an image ([vdso] not saved, [heap], ...)
            if not os.path.isfile(path):
                key = f"missing:{path}"
                if key not in jobs:
                    jobs[key] = Job(path, mod.path, [], error=f"{path}: load module not found "
                                    "(deleted or moved since the measurement)")
                continue
            bid, dbg = module_identity(path)
            if mod.build_id and bid and bid != mod.build_id:
                key = f"changed:{path}"
                if key not in jobs:
                    jobs[key] = Job(path, mod.path, [], error=(
                        f"{path}: build-id {bid} differs from {mod.build_id} recorded by the "
                        "measurement (the file was rebuilt since); skipped"))
                continue
            key = cache_key(mod.path, bid or mod.build_id or None, dbg)
            if key in jobs:
                continue
            cache = [d / "structs" / f"{key}.hpcstruct"]
            if user_cache:
                cache.append(user_cache_dir() / f"{key}.hpcstruct")
            jobs[key] = Job(path, mod.path, cache)
        for code in proc.pycode:
            f = code.file
            if not f.endswith(".py") or not os.path.isfile(f):
                continue  # <frozen ...>, <string>, a file removed since
            key = cache_key(f, None)
            if key not in jobs:
                jobs[key] = Job(f, f, [d / "structs" / f"{key}.hpcstruct"])
    jobs.update(gpu_binary_jobs(d, user_cache=user_cache))
    return list(jobs.values())


def gpu_binary_jobs(directory: Path, *, user_cache: bool = True,
                    only: set[str] | None = None, loops: bool = True) -> dict[str, Job]:
    """One job per GPU binary the measurement saved (``gpubins/*.gpubin``; ``only``: those
    file names), named by its path in the directory. The file names are content hashes: they
    identify the binary wherever the directory is moved (``prof`` finds the structure by base
    name), and the cache key adds whether nvdisasm (loops) was there. A structure file of the
    same binary made with the other setting is removed from ``MEASDIR/structs/`` (prof would
    otherwise read either)."""
    jobs: dict[str, Job] = {}
    structs = directory / "structs"
    for p in sorted((directory / "gpubins").glob("*.gpubin")):
        if only is not None and p.name not in only:
            continue
        _, tag = module_identity(str(p))
        if not loops:
            tag = "no-nvdisasm"
        key = cache_key(str(p), p.stem, tag)
        for old in structs.glob(f"{p.name}-{p.stem}-*.hpcstruct"):
            if old.name != f"{key}.hpcstruct":
                with contextlib.suppress(OSError):
                    old.unlink()
        cache = [structs / f"{key}.hpcstruct"]
        if user_cache:
            cache.append(user_cache_dir() / f"{key}.hpcstruct")
        jobs[key] = Job(str(p), str(p), cache, gpu_loops=loops)
    return jobs


def analyze_measurement(directory: str | os.PathLike[str], *, workers: int | None = None,
                        user_cache: bool = True,
                        progress: Callable[[int, int, Result], None] | None = None
                        ) -> list[Result]:
    """Structure of every module a measurement used, cached in ``MEASDIR/structs/``.

    The library form of ``callpath struct MEASDIR``: never raises for one bad module (its
    :class:`Result` carries the message); raises :class:`CallpathError` only when the
    directory itself cannot be read.
    """
    jobs = measurement_jobs(directory, user_cache=user_cache)
    results = run_jobs(jobs, workers or os.cpu_count() or 1, progress)
    write_index(directory, results)
    return results


INDEX_FILE = "index.json"


def write_index(directory: str | os.PathLike[str], results: list[Result]) -> Path:
    """``MEASDIR/structs/index.json``: which structure file holds which module.

    ``{"version": 1, "modules": {"<module path as the run saw it>": "<file name>"}}`` for every
    module analysed (or found in the cache); a consumer such as ``callpath prof`` looks a
    module up by the path in its measurement's module table, without recomputing cache keys.
    """
    import json

    d = Path(directory) / "structs"
    d.mkdir(parents=True, exist_ok=True)
    index: dict[str, str] = {}
    p = d / INDEX_FILE
    before = ""
    if p.is_file():  # keep what an earlier run recorded (e.g. with other modules)
        try:
            before = p.read_text()
            index.update({str(k): str(v) for k, v in json.loads(before)["modules"].items()})
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            pass
    for r in results:
        if r.error is None and r.job.cache and r.job.cache[0].parent == d:
            index[r.job.name] = r.job.cache[0].name
    text = json.dumps({"version": 1, "modules": index}, indent=1, sort_keys=True) + "\n"
    if text != before:  # a second run with everything cached leaves the directory as it was
        tmp = d / f".{INDEX_FILE}.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, p)
    return p


def measurement_structures(directory: str | os.PathLike[str]) -> dict[str, Structure]:
    """The structures ``callpath struct MEASDIR`` left in ``MEASDIR/structs``, by module path
    (as the measurement's module tables and Python code tables name them)."""
    import json

    from callpath.errors import FormatError
    from callpath.formats.hpcstruct import read_hpcstruct

    d = Path(directory) / "structs"
    p = d / INDEX_FILE
    try:
        doc = json.loads(p.read_text())
        modules = {str(k): str(v) for k, v in doc["modules"].items()}
    except FileNotFoundError:
        raise CallpathError(f"{p}: missing (run 'callpath struct {directory}' first)") from None
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as e:
        raise FormatError(p, f"expected {{\"modules\": {{path: file}}}} ({e})") from None
    out: dict[str, Structure] = {}
    for path, name in modules.items():
        got = read_hpcstruct(d / name)
        if got:
            got[0].path = path
            out[path] = got[0]
    return out
