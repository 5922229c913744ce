"""Structure on demand: only the procedures a measurement touched, cached per build-id.

The libraries of the ML stack are hundreds of megabytes (libtorch_cpu.so: 446 MB, 380k
procedures); a run touches a few thousand of their procedures, and most libraries it maps it
never executes. Recovering the whole structure of every mapped module cost minutes and
gigabytes after the program ended. Here ``callpath prof`` recovers, per module, only the
procedures that contain a sampled address or a return address of a sampled call path (their
loops, inlined code, lines and call sites, by the same code as ``callpath struct``:
:class:`~callpath.structure.binary.PreparedModule`), and a module no sample is in is not
opened at all.

The result is cached per module identity (build-id and separate debug file, the key of
``callpath struct``'s cache) as a ``.cpstruct`` entry (:mod:`callpath.structure.store`) holding
the structure of the procedures analysed so far, the module's procedure table (entries and
ends, so that a later run finds which procedures its addresses need without reading the symbol
table) and the entries analysed. A later run that touches more procedures analyses only those
and rewrites the entry with the union: the cache grows with use. Entries live in
``$XDG_CACHE_HOME/callpath/structs/<key>.cpstruct`` and in
``MEASDIR/structs/<key>.cpstruct`` (the measurement then carries what it needs when it is
moved to another machine).
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.formats import measdir as md
from callpath.structure import store
from callpath.structure.driver import (
    ANALYSIS_VERSION,
    cache_key,
    idle_cores,
    module_identity,
    user_cache_dir,
)
from callpath.structure.dwarf_lines import LineCache
from callpath.structure.dwarf_units import UnitCache
from callpath.structure.model import Structure, StructureBuilder, concat_structures

#: Bumped whenever the entry's layout changes (the analysis version is checked too).
FORMAT_VERSION = 2
_FORMAT = "callpath on-demand structure"


#: Procedures to build before a module's on-demand build is split over processes (each costs
#: ~10 ms on libtorch_cpu.so; a fork and the pickled result back, ~50 ms).
ONDEMAND_PARALLEL_MIN = 64


def _expect() -> dict[str, object]:
    return {"format": _FORMAT, "version": FORMAT_VERSION, "analysis": ANALYSIS_VERSION}


def _expect_state() -> dict[str, object]:
    return {"format": "callpath prepared module", "version": FORMAT_VERSION,
            "analysis": ANALYSIS_VERSION}


@dataclass
class ModuleRequest:
    """One load module and the addresses of it that a measurement touched."""

    path: str  # the file to analyse (the saved image for the vdso)
    name: str  # the module's path as the run saw it (the structure's LM name)
    addrs: npt.NDArray[np.uint64]  # link-time addresses, unique, sorted
    cache: list[Path] = field(default_factory=list)  # entries, first = the measurement's
    error: str | None = None  # known before any analysis (missing file, changed build-id)
    #: where the module-wide facts of the analysis are kept (per-user cache only: they are
    #: megabytes for libtorch_cpu.so, and a measurement directory need not carry them)
    state: Path | None = None


@dataclass
class OnDemandResult:
    request: ModuleRequest
    structure: Structure | None
    error: str | None
    analysed: int = 0  # procedures analysed by this call
    known: int = 0  # procedures the cache held before it
    procedures: int = 0  # procedures of the module (its symbol table)


def _empty(name: str, build_id: str | None) -> Structure:
    b = StructureBuilder(name, build_id)
    b.has_calls = True
    return b.build()


def structure_for(req: ModuleRequest, jobs: int = 1) -> OnDemandResult:
    """The structure of every procedure of ``req.path`` that holds one of ``req.addrs`` (and
    of all procedures analysed by earlier runs: the cache entry's), analysing only those not
    yet cached. Never raises a user error: the result carries its one-line message."""
    if req.error is not None:
        return OnDemandResult(req, None, req.error)
    try:
        return _structure_for(req, jobs)
    except CallpathError as e:
        return OnDemandResult(req, None, str(e))
    except (MemoryError, RecursionError) as e:
        return OnDemandResult(req, None, f"{req.path}: analysis failed ({type(e).__name__})")


def _structure_for(req: ModuleRequest, jobs: int) -> OnDemandResult:
    from callpath.structure.binary import PreparedModule
    from callpath.structure.elf import open_elf

    s: Structure | None = None
    empty = np.zeros(0, np.uint64)
    lo = hi = done = nowhere = empty
    found = -1
    for n, c in enumerate(req.cache):
        got = store.load(c, _expect())
        if got is not None:
            s, _meta, extra = got
            try:
                lo, hi = extra["proc_lo"].astype(np.uint64), extra["proc_hi"].astype(np.uint64)
                done = extra["done"].astype(np.uint64)
                nowhere = extra["nowhere"].astype(np.uint64)
            except KeyError:
                s = None
                continue
            if len(lo) != len(hi):
                s = None
                continue
            found = n
            break
    prep = None
    mod = None
    addrs = np.asarray(req.addrs, dtype=np.uint64)

    def prepare(near: npt.NDArray[np.uint64]) -> PreparedModule:
        """The module-wide facts: from the per-user state entry when there is one, else
        read from the file (and kept there for the next run that needs them). A module with
        symbols and DWARF has its DWARF read only around ``near`` (no state is kept: it
        holds only what these addresses needed)."""
        nonlocal mod
        mod = open_elf(req.path)
        if req.state is not None:
            got_state = store.load_arrays(req.state, _expect_state())
            if got_state is not None:
                try:
                    return PreparedModule(mod, demangle_all=False, state=got_state[1])
                except (ValueError, KeyError, IndexError, TypeError, zlib.error):
                    pass  # a damaged entry: read the file
        lines = LineCache(_beside(req.state, "lines")) if req.state is not None else None
        units = UnitCache(_beside(req.state, "units")) if req.state is not None else None
        p = PreparedModule(mod, demangle_all=False, near=near, line_cache=lines,
                           unit_cache=units)
        if req.state is not None and not p.partial:
            store.save_arrays(req.state, _expect_state(), p.state())
        if lines is not None and units is not None and p.partial:
            # a whole read keeps its state instead
            lines.save()
            units.save()
        return p

    def locate(entry: npt.NDArray[np.uint64], end: npt.NDArray[np.uint64]
               ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
        i = np.searchsorted(entry, addrs, side="right").astype(np.int64) - 1
        ok = i >= 0
        ok &= addrs < end[np.where(ok, i, 0)] if len(end) else False
        return i, ok

    missing = np.zeros(0, np.int64)
    grown = False
    try:
        known = len(done)
        if found >= 0:
            # the addresses that no cached procedure analysed holds and that no earlier run
            # found outside every procedure: only around these is the module read again
            # (libpython's DWARF around every sampled address was 0.3 s of a warm run, around
            # the new ones a fraction of it)
            i, ok = locate(lo, hi)
            held = ok.copy()
            held[ok] = np.isin(lo[i[ok]], done)
            addrs = addrs[~held & ~np.isin(addrs, nowhere)]
            if len(addrs):
                prep = prepare(addrs)
                if not prep.partial and not np.array_equal(prep.entry, lo):
                    # cannot happen for one build-id
                    raise CallpathError(f"{req.path}: its procedures differ from the cached "
                                        "ones of the same build-id")
        else:
            prep = prepare(addrs)
        if prep is not None:
            # the prepared table is exact around every address asked for
            i, ok = locate(prep.entry, prep.end)
            need = np.unique(i[ok])
            missing = need[~np.isin(prep.entry[need], done)]
            if len(missing):
                order, groups = prep.groups(missing)
                new = prep.build_parallel(order, groups, jobs, min_procs=ONDEMAND_PARALLEL_MIN)
                s = new if s is None else concat_structures([s, new])
                done = np.union1d(done, prep.entry[missing]).astype(np.uint64)
            lost = np.setdiff1d(addrs[~ok], nowhere)
            if len(lost):
                nowhere = np.union1d(nowhere, lost).astype(np.uint64)
                grown = True
            lo, hi = _merge(lo, hi, prep.entry, prep.end) if prep.partial else (prep.entry,
                                                                                 prep.end)
    finally:
        if mod is not None:
            mod.close()
    if s is None:
        s = _empty(req.name, None)
    s.path = req.name
    extra_out = {"proc_lo": lo, "proc_hi": hi, "done": done, "nowhere": nowhere}
    head = dict(_expect(), module=req.name)
    for n, c in enumerate(req.cache):
        if len(missing) or grown or found < 0 or n < found:  # new, grown, or only later
            store.save(c, s, head, extra_out)
    return OnDemandResult(req, s, None, analysed=len(missing), known=known, procedures=len(lo))


def _beside(state: Path, what: str) -> Path:
    """Where a module's decoded line programs (``lines``) or the records of its DWARF units
    (``units``) are kept: beside its state entry."""
    return state.with_name(state.name.replace(".prep.cpstruct", f".{what}.cpstruct"))


def _merge(lo: npt.NDArray[np.uint64], hi: npt.NDArray[np.uint64],
           lo2: npt.NDArray[np.uint64], hi2: npt.NDArray[np.uint64]
           ) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """The union of two procedure tables of one module read around different addresses:
    each knows the entries DWARF adds near its own addresses, so an entry's end is the
    least of the two (the next entry either knows)."""
    e = np.concatenate([lo, lo2])
    x = np.concatenate([hi, hi2])
    order = np.lexsort((x, e))
    e, x = e[order], x[order]
    first = np.ones(len(e), dtype=bool)
    first[1:] = e[1:] != e[:-1]
    e, x = e[first], x[first]
    if len(e) > 1:
        x[:-1] = np.minimum(x[:-1], e[1:])
    return e.astype(np.uint64), x.astype(np.uint64)


def measurement_requests(files: Sequence[Path], *, skip: set[str] | None = None,
                         user_cache: bool = True
                         ) -> tuple[list[ModuleRequest], dict[str, npt.NDArray[np.int64]]]:
    """What a measurement touched: one request per load module with a sampled address or a
    return address (the call instruction: ``address - 1``) in a sampled call path, by its path
    as the run saw it (``skip``: keys of the structures already loaded, by path or by
    ``base:<file name>`` as ``-S`` files are matched), and the Python sources of its code
    tables with the lines its Python frames were at. Vectorised per thread; modules are
    deduplicated by path across processes, their addresses merged."""
    skip = skip or set()
    native_kind = int(md.NodeKind.NATIVE)
    exact_flag = int(md.NodeFlag.EXACT_PC)
    addrs: dict[str, list[npt.NDArray[np.uint64]]] = {}
    where: dict[str, tuple[str, str, Path]] = {}  # name -> (file, recorded build-id, measdir)
    pyfiles: dict[str, list[npt.NDArray[np.int64]]] = {}
    for f in files:
        proc = md.read_process(f)
        d = Path(f).parent
        mods, ips = [], []
        py_kind = int(md.NodeKind.PYTHON)
        for th in proc.threads:
            nodes = th.nodes
            if len(nodes) == 0:
                continue
            py = nodes["kind"].astype(np.int64) == py_kind
            if py.any():
                code = nodes["module"].astype(np.int64)[py]
                line = nodes["address"].astype(np.int64)[py]
                order = np.argsort(code, kind="stable")
                ks, at = np.unique(code[order], return_index=True)
                for k, part in zip(ks.tolist(), np.split(line[order], at[1:]), strict=True):
                    if 0 <= k < len(proc.pycode):
                        pyfiles.setdefault(proc.pycode[k].file, []).append(part)
            native = nodes["kind"].astype(np.int64) == native_kind
            m = nodes["module"].astype(np.int64)[native]
            a = nodes["address"].astype(np.uint64)[native]
            exact = (nodes["flags"][native] & exact_flag) != 0
            mods.append(m)
            ips.append(np.where(exact | (a == 0), a, a - np.uint64(1)))
        for pc in proc.pycode:  # code objects on no sampled path still have a file
            pyfiles.setdefault(pc.file, [])
        if not mods:
            continue
        m = np.concatenate(mods)
        a = np.concatenate(ips)
        ok = (m >= 0) & (m < len(proc.modules))
        m, a = m[ok], a[ok]
        if len(m) == 0:  # only Python frames (the Python sampler without --native)
            continue
        _module_addrs(proc.modules, m, a, d, skip, addrs, where)
    lines = {f: np.unique(np.concatenate(v)) if v else np.zeros(0, dtype=np.int64)
             for f, v in pyfiles.items()
             if f.endswith(".py") and f not in skip and os.path.isfile(f)}
    return _requests(addrs, where, user_cache), lines


def frame_requests(modules: Sequence[md.Module], module: npt.NDArray[np.int64],
                   address: npt.NDArray[np.uint64], exact: npt.NDArray[np.bool_],
                   measdir: Path) -> list[ModuleRequest]:
    """:func:`measurement_requests` of unwound native frames (``module`` indices into
    ``modules``, link-time ``address``, ``exact`` for a sampled pc rather than a return
    address) before they are written: what ``callpath profile --native`` analyses beside the
    rest of the merge."""
    a = np.where(exact | (address == 0), address, address - np.uint64(1))
    ok = (module >= 0) & (module < len(modules))
    addrs: dict[str, list[npt.NDArray[np.uint64]]] = {}
    where: dict[str, tuple[str, str, Path]] = {}
    if ok.any():
        _module_addrs(modules, module[ok], a[ok], measdir, set(), addrs, where)
    return _requests(addrs, where, True)


def _module_addrs(modules: Sequence[md.Module], m: npt.NDArray[np.int64],
                  a: npt.NDArray[np.uint64], d: Path, skip: set[str],
                  addrs: dict[str, list[npt.NDArray[np.uint64]]],
                  where: dict[str, tuple[str, str, Path]]) -> None:
    """Add the addresses ``a`` of modules ``m`` (indices into ``modules`` of a process file of
    measurement directory ``d``) to ``addrs`` and ``where`` (by module path)."""
    order = np.argsort(m, kind="stable")
    m, a = m[order], a[order]
    ks, starts = np.unique(m, return_index=True)
    for k, part in zip(ks.tolist(), np.split(a, starts[1:]), strict=True):
        mod = modules[k]
        if (not mod.path or mod.path in skip or "base:" + os.path.basename(mod.path) in skip
                or (mod.path.startswith("[") and not mod.saved)):
            continue
        addrs.setdefault(mod.path, []).append(np.unique(part))
        where.setdefault(mod.path, (str(d / mod.saved) if mod.saved else mod.path,
                                    mod.build_id, d))


def _requests(addrs: dict[str, list[npt.NDArray[np.uint64]]],
              where: dict[str, tuple[str, str, Path]], user_cache: bool) -> list[ModuleRequest]:
    out = []
    for name, parts in addrs.items():
        path, recorded, d = where[name]
        req = ModuleRequest(path, name, np.unique(np.concatenate(parts)))
        if not os.path.isfile(path):
            req.error = f"{path}: load module not found (deleted or moved since the measurement)"
            out.append(req)
            continue
        bid, dbg = module_identity(path)
        if recorded and bid and bid != recorded:
            req.error = (f"{path}: build-id {bid} differs from {recorded} recorded by the "
                         "measurement (the file was rebuilt since); skipped")
            out.append(req)
            continue
        key = cache_key(name, bid or recorded or None, dbg) + ".cpstruct"
        req.cache = [d / "structs" / key]
        if user_cache:
            req.cache.append(user_cache_dir() / key)
            req.state = user_cache_dir() / key.replace(".cpstruct", ".prep.cpstruct")
        out.append(req)
    return out


def request_cost(r: ModuleRequest) -> float:
    """Seconds, roughly: reading a module's tables grows with its file (libtorch_cpu.so's
    446 MB: ~1 s), building with the procedures touched (~1-3 ms each)."""
    try:
        size = os.path.getsize(r.path)
    except OSError:
        size = 0
    return size * 2e-9 + len(r.addrs) * 1e-3


def structures_for(reqs: list[ModuleRequest], workers: int,
                   progress: Callable[[int, int, OnDemandResult], None] | None = None
                   ) -> list[OnDemandResult]:
    """:func:`structure_for` of every request: in this process when there is one (it then
    gets the idle cores), else in ``workers`` processes, the costliest first. Results in the
    order of ``reqs``."""
    cost = request_cost
    if workers <= 1 or len(reqs) <= 1:
        res = []
        for r in reqs:
            res.append(structure_for(r, idle_cores(workers)))
            if progress:
                progress(len(res), len(reqs), res[-1])
        return res
    import multiprocessing as mp

    order = sorted(range(len(reqs)), key=lambda k: -cost(reqs[k]))
    big, rest = order[0], order[1:]
    # One module outweighing all others together (libtorch_cpu.so beside small ones) is built
    # last, in this process, its procedures split over the idle cores; otherwise every module
    # goes through the pool, the costliest first (libpython's and libtorch_cpu.so's side by
    # side, the small ones filling in after).
    alone = cost(reqs[big]) > sum(cost(reqs[k]) for k in rest)
    pooled = rest if alone else order
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    results: dict[int, OnDemandResult] = {}
    with ProcessPoolExecutor(min(workers, len(pooled)), mp_context=ctx) as pool:
        futures = {pool.submit(structure_for, reqs[k], 1): k for k in pooled}
        try:
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                if progress:
                    progress(len(results), len(reqs), results[futures[fut]])
        except BrokenProcessPool:
            raise CallpathError("a worker process of the structure analysis died (killed by "
                                "a signal; out of memory?)") from None
    if alone:
        results[big] = structure_for(reqs[big], idle_cores(workers))
        if progress:
            progress(len(results), len(reqs), results[big])
    return [results[k] for k in range(len(reqs))]


def python_structures(files: Sequence[str] | Mapping[str, npt.NDArray[np.int64]],
                      workers: int, *, user_cache: bool = True) -> dict[str, Structure]:
    """The structure of each Python source in ``files`` (those with a syntax error left out:
    their frames keep function and line): from the per-user cache when the file is
    unchanged (key: path, size, modification time); else from the bytecode the interpreter
    cached beside the source when there is a ``.pyc`` of this interpreter for exactly this
    file (:mod:`~callpath.structure.python_code`), else parsed with ``ast``; in ``workers``
    processes, and cached. Without the cache (``user_cache=False``) and given a mapping of
    files to their sampled lines, only those lines' statements are built.

    ``import torch`` alone runs the module code of ~900 files, so a ``--native`` run of a
    PyTorch program has that many sources in its samples: parsing them took 9.5 s of CPU,
    their bytecode 4.4 s (3.0 s with the sampled lines only), reading their cache entries
    back 0.1 s."""
    from callpath.structure.parallel import fork_map

    out: dict[str, Structure] = {}
    todo: list[tuple[str, npt.NDArray[np.int64] | None, Path | None]] = []
    lines = files if isinstance(files, Mapping) else None
    for f in files:
        c = _python_cache_path(f) if user_cache else None
        got = store.load(c, _expect_py()) if c is not None else None
        if got is not None:
            s = got[0]
            s.path = f
            out[f] = s
        else:
            todo.append((f, lines[f] if lines is not None and c is None else None, c))
    if not todo:
        return out
    n = max(1, min(workers, len(todo) // 16 or 1))
    chunks = [todo[k::n] for k in range(n)]
    for part in (fork_map(_python_structure, chunks) if n > 1
                 else [_python_structure(todo)]):
        for f, s in part:
            out[f] = s
    return out


def cache_python_sources(units: Sequence[Path], stop: Callable[[], bool] | None = None) -> int:
    """Build and cache (per user) the structure of every Python source whose code the process
    files ``units`` sampled, in this process, until ``stop()`` says so; return how many were
    built.

    ``callpath profile --native`` runs this in a child beside the merge of the native stacks:
    the merge only rewrites the native part of each path, so the Python sources are known
    before it, and their structure (~11 ms each from bytecode; a warm run of the PyTorch loop
    meets ~60 sources no earlier run sampled) is then ready when ``prof`` asks for it. When
    the merge ends first (a cold cache: ~900 sources), the child stops after its current
    source and ``prof`` builds the rest on every core."""
    _reqs, pyfiles = measurement_requests(units, skip=set(), user_cache=True)
    todo: list[tuple[str, npt.NDArray[np.int64] | None, Path | None]] = []
    for f in pyfiles:
        c = _python_cache_path(f)
        if store.load_arrays(c, _expect_py()) is None:
            todo.append((f, None, c))
    return len(_python_structure(todo, stop))


def _python_structure(items: list[tuple[str, npt.NDArray[np.int64] | None, Path | None]],
                       stop: Callable[[], bool] | None = None) -> list[tuple[str, Structure]]:
    """Structures from bytecode, else from ``ast``; saved where a cache path is given."""
    from callpath.structure.python_ast import structure_of_python
    from callpath.structure.python_code import structure_from_bytecode

    out = []
    for f, lines, c in items:
        if stop is not None and stop():
            break
        s = structure_from_bytecode(f, lines)
        if s is None:
            try:
                s = structure_of_python(f)
            except CallpathError:
                continue
        s.path = f
        if c is not None:
            store.save(c, s, _expect_py())
        out.append((f, s))
    return out


def _python_cache_path(f: str) -> Path:
    """A Python source's entry in the per-user cache (key: path, size, modification time)."""
    return user_cache_dir() / (cache_key(f, None) + ".cpstruct")


def _expect_py() -> dict[str, object]:
    return {"format": "callpath python structure", "version": FORMAT_VERSION,
            "analysis": ANALYSIS_VERSION}
