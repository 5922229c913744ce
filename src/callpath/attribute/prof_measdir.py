"""Attribution of callpath's own measurement directories (``callpath run``, the Python sampler).

Each thread's tree (``callpath.formats.measdir``) is walked parents-first. A NATIVE frame is a
load module and a link-time address (callers carry return addresses, so the call instruction is
``address − 1``; leaves carry the EXACT_PC flag); it is mapped through the module's structure
from ``MEASDIR/structs/`` exactly as HPCToolkit frames are (:class:`ModuleMapper`). A PYTHON frame
is a code location (file, function) and a line; the file's ``ast`` structure gives its
procedure, loops and statement; without it the frame is the function and the line. Frames with
no structure become ``module+offset`` instruction contexts; PARTIAL paths go under the entry
"partial call paths". Every metric gets two database metrics: its value (seconds for CPU clocks
measured in ns) and its number of samples, so that the database's sample total can be checked
against the samples recorded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.attribute import gpu_ops as gpu_attr
from callpath.attribute import processes
from callpath.attribute.build import Tables, ThreadData, finish
from callpath.attribute.forked import STATE
from callpath.attribute.hpctk import (
    CALL,
    ENTRY_MAIN,
    ENTRY_THREAD,
    ENTRY_UNKNOWN,
    INS,
    LEX,
    LN,
    LP,
    F,
    ModuleMapper,
    Step,
    SymbolTable,
    load_structures,
    lookup_one,
)
from callpath.attribute.pypackages import package_root
from callpath.attribute.reduce import Partial, reduce_units, writer_mapper
from callpath.attribute.samples import spill
from callpath.attribute.thread_tree import Walker
from callpath.errors import CallpathError, FormatError
from callpath.formats import measdir as md
from callpath.formats import measdir_gpu as mdg
from callpath.model import Experiment
from callpath.structure.model import Kind, Structure

_ROOT, _NATIVE, _PYTHON, _PARTIAL, _UNKNOWN, _PLACEHOLDER = (int(k) for k in (
    md.NodeKind.ROOT, md.NodeKind.NATIVE, md.NodeKind.PYTHON, md.NodeKind.PARTIAL,
    md.NodeKind.UNKNOWN, md.NodeKind.PLACEHOLDER))
_PROC = int(Kind.PROC)
_SAMPLED = 1000  # frame kind of a sampled native PC when prof keeps instruction scopes


def is_callpath_measurements(d: Path) -> bool:
    return (d / "measurement.json").is_file()


class _PyMapper:
    """Python code locations → steps: through the file's structure, else function + line.

    The structure knows lines, the measurement knows which code object ran. A line inside a
    lambda, a comprehension or generator expression (separate code objects up to 3.11; 3.12
    inlines list, set and dict comprehensions) or a class body lies in the structure's
    enclosing function, so its frame was named after that function: a module-level lambda
    called from ``<module>`` read ``<module> » <module>``, a generator expression in ``evens``
    read ``evens``. Where the code object's qualified name is not the structure's procedure
    for its line, the frame is the code object's (as py-spy and tracebacks name it), with the
    structure's loops that begin inside it and the statement line.
    """

    def __init__(self, tables: Tables, structs: dict[str, Structure]) -> None:
        self.t = tables
        self.structs = structs
        self.mappers: dict[str, ModuleMapper] = {}
        self.cache: dict[tuple[str, str, int, int], tuple[Step, ...]] = {}

    def steps(self, code: md.PyCode, line: int) -> tuple[Step, ...]:
        key = (code.file, code.function, code.first_line, line)
        got = self.cache.get(key)
        if got is not None:
            return got
        s = self.structs.get(code.file)
        out: tuple[Step, ...] = ()
        if s is not None:
            m = self.mappers.get(code.file)
            if m is None:
                m = self.mappers[code.file] = ModuleMapper(package_root(code.file), s, self.t)
            out = m.steps(line)
            if out and out[0][0] == INS:
                out = ()
            if out and out[0][0] == F and _proc_name(s, line) != code.function:
                lm = self.t.module(package_root(code.file))
                fid = self.t.function(code.function, lm, code.first_line,
                                      self.t.file(code.file), code.first_line)
                inner = [x for x in out[1:] if x[0] != LP or x[4] >= code.first_line]
                out = ((F, CALL, fid, -1, 0, -1, 0), *inner)
        if not out:
            lm = self.t.module(package_root(code.file))
            f = self.t.file(code.file)
            fid = self.t.function(code.function, lm, code.first_line, f, code.first_line)
            out = ((F, CALL, fid, -1, 0, -1, 0), (LN, LEX, -1, f, line, -1, 0))
        self.cache[key] = out
        return out


def _proc_name(s: Structure, line: int) -> str | None:
    """The name of the innermost procedure of a Python file's structure around ``line``."""
    scope = lookup_one(s, line)
    if scope < 0:
        return None
    chain = s.chain(scope)
    for c, k in zip(chain, s.kind[chain].tolist(), strict=True):
        if k == _PROC:
            return s.text(int(s.name[c]))
    return None


def prof_measdir(measdirs: list[Path], struct_files: list[Path], *,
                 ignore_structs: bool = False, title: str | None = None,
                 workers: int = 1, mpi: bool = False,
                 stats: bool = False, instructions: bool = False,
                 keep_launchers: bool = False,
                 notify: Callable[[str], None] | None = None,
                 on_demand: bool = True, user_cache: bool = True,
                 phases: dict[str, float] | None = None) -> Experiment | None:
    """The experiment of callpath measurement directories (see the module docstring), reduced
    by ``workers`` processes (one work unit per process file).

    Modules without a structure file (``-S``, ``MEASDIR/structs/*.hpcstruct``) get their
    structure on demand (``on_demand``): only the procedures the samples touched, cached per
    build-id (:mod:`callpath.structure.ondemand`); without it they are attributed by their
    symbol tables. ``phases``, when given, receives the seconds spent on ``structure`` and
    ``attribute``."""
    import time

    t0 = time.perf_counter()
    heads = [_header(d) for d in measdirs]
    structs = list(struct_files)
    if not ignore_structs:
        for d in measdirs:
            if (d / "structs").is_dir():
                structs += sorted((d / "structs").glob("*.hpcstruct"))
    infos = heads[0][1]
    for d, (_, m) in zip(measdirs, heads, strict=True):
        if [x.name for x in m] != [x.name for x in infos]:
            raise CallpathError(f"{d}: measured {[x.name for x in m]}, but {measdirs[0]} "
                                f"measured {[x.name for x in infos]}; measurements to combine "
                                "must sample the same events")
    names = [(f"{x.name} (sec)" if x.unit == "ns" else x.name,
              x.description or x.event or x.name) for x in infos]
    names += [(f"{x.name} (samples)", f"samples of {x.event or x.name}") for x in infos]
    units = [f for d in measdirs for f in sorted(d.glob(md.PROCESS_GLOB), key=md.file_order)]
    # GPU operations (callpath run -e gpu=nvidia) are in companion files: their metrics
    # follow the sampled ones; a companion without a process file (a process that launched
    # GPU work but got no CPU sample) is a unit of its own
    companions = [f for d in measdirs for f in sorted(d.glob(mdg.GPU_GLOB), key=md.file_order)]
    gpu_offset = len(names) if companions else None
    if companions:
        names += gpu_attr.metric_names()
    have = {str(u) for u in units}
    units += [c for c in companions if str(c.with_name(mdg.process_name(c.name))) not in have]
    chosen = processes.select(units, keep_launchers)
    if chosen.launchers and notify is not None:
        notify(f"left out {len(chosen.launchers)} launcher process"
               f"{'es' if len(chosen.launchers) > 1 else ''} "
               f"({', '.join(sorted({n for _, n in chosen.launchers}))}); "
               "--keep-launchers keeps them")
    loaded = {} if ignore_structs else load_structures(structs)
    if on_demand and not ignore_structs:
        # only process files hold sampled call paths (GPU companions' launch paths that
        # reach a procedure no sample touched fall back to the symbol table)
        found = _on_demand([u for u in chosen.units if fnmatch(u.name, md.PROCESS_GLOB)],
                           loaded, workers, notify, user_cache)
        partial = {k for k in found if not k.endswith(".py")}
        loaded.update(found)
        loaded.update(_gpu_structures(measdirs, companions, loaded, workers, notify,
                                      user_cache))
    else:
        partial = set()
    t1 = time.perf_counter()
    if phases is not None:
        phases["structure"] = t1 - t0
    part = reduce_units(reduce_process_files, chosen.units, workers, mpi, {
        "structures": loaded, "metrics": infos,
        "names": names, "ignore_structs": ignore_structs, "instructions": instructions,
        "process_ids": chosen.process_ids, "gpu_offset": gpu_offset, "partial": partial})
    if part is None:
        return None
    if not part.threads:
        raise CallpathError(f"{measdirs[0]}: the measurement holds no execution contexts "
                            "(no process recorded a sample)")
    cmd = heads[0][0].get("command") or []
    program = os.path.basename(str(cmd[0])) if cmd else measdirs[0].name
    exp = finish(part.tb, part.tables, part.threads, part.metrics, title=title or program,
                 description="callpath prof of " + " ".join(map(str, cmd)),
                 stats=stats, parallel=writer_mapper(workers, mpi))
    if gpu_offset is not None:
        # hpcprof's presentation of GPU metrics: the kernel properties as formulas over the
        # accumulators, the accumulators invisible, the synchronization kinds hidden
        exp.metrics_yaml = gpu_attr.metrics_yaml_of(names[:gpu_offset],
                                                    [m.name for m in exp.metrics])
    if phases is not None:
        phases["attribute"] = time.perf_counter() - t1
    return exp


def _on_demand(units: Sequence[Path], loaded: dict[str, Structure], workers: int,
               notify: Callable[[str], None] | None, user_cache: bool
               ) -> dict[str, Structure]:
    """Structures of the modules and Python sources the measurement touched that ``loaded``
    does not cover (by path, or by base name for a structure file given with ``-S``)."""
    from callpath.structure.ondemand import (
        measurement_requests,
        python_structures,
        structures_for,
    )

    reqs, pyfiles = measurement_requests(units, skip=set(loaded), user_cache=user_cache)
    out: dict[str, Structure] = {}
    for r in structures_for(reqs, workers):
        if r.error is not None:
            if notify is not None:
                notify(f"{r.error} (attributed by address instead)")
        elif r.structure is not None:
            out[r.request.name] = r.structure
    out.update(python_structures(pyfiles, workers, user_cache=user_cache))
    return out


def _gpu_structures(measdirs: Sequence[Path], companions: Sequence[Path],
                    loaded: dict[str, Structure], workers: int,
                    notify: Callable[[str], None] | None, user_cache: bool
                    ) -> dict[str, Structure]:
    """Structures of the GPU binaries whose kernels ran (``gpu_kernel_binaries`` of the
    companions) that ``loaded`` does not hold: their functions and lines, without loops
    (nvdisasm of a library's largest cubins takes minutes, and only the kernels' entries are
    mapped), cached in ``MEASDIR/structs/`` and the user's cache as ``callpath struct
    MEASDIR`` caches its structures."""
    from callpath.structure.driver import gpu_binary_jobs, run_jobs

    wanted: dict[Path, set[str]] = {}
    for c in companions:
        try:
            info = md.read_process_info(c)
        except (CallpathError, OSError):
            continue
        for row in info.get("gpu_kernel_binaries") or []:
            name = os.path.basename(str(row[1])) if len(row) > 1 else ""
            if name and "base:" + name not in loaded:
                wanted.setdefault(c.parent, set()).add(name)
    jobs = [j for d in measdirs if d in wanted
            for j in gpu_binary_jobs(d, user_cache=user_cache, only=wanted[d],
                                     loops=False).values()]
    out: dict[str, Structure] = {}
    for r in run_jobs(jobs, workers) if jobs else []:
        if r.error and notify is not None:  # (notes on lines and loops are struct's to say)
            notify(r.error)
        if r.structure is not None:
            out[r.job.name] = r.structure
            out["base:" + os.path.basename(r.job.name)] = r.structure
    return out


def _header(d: Path) -> tuple[dict[str, Any], list[md.MetricInfo]]:
    """The header and metrics of a measurement directory, validated as ``measdir.read``
    validates them (read with no process file)."""
    import json

    hp = d / md.HEADER_FILE
    try:
        header = json.loads(hp.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise FormatError(hp, f"expected a JSON object ({e})") from None
    if not isinstance(header, dict) or header.get("format") != md.FORMAT_NAME:
        raise FormatError(hp, f"expected \"format\": \"{md.FORMAT_NAME}\"")
    version = header.get("version")
    if not isinstance(version, int) or not 1 <= version <= md.VERSION:
        raise FormatError(hp, f"unsupported version {version!r} (this reader knows "
                          f"1..{md.VERSION})")
    try:
        metrics = [md.MetricInfo.from_json(m) for m in header.get("metrics", [])]
    except (KeyError, TypeError, ValueError) as e:
        raise FormatError(hp, f"bad metric descriptor ({e})") from None
    return header, metrics


def reduce_process_files(files: Sequence[Path]) -> Partial:
    """One worker's share: attribute every thread of these process files (vectorised per
    tree level by :class:`Walker`, memoised across threads)."""
    by_module: dict[str, Structure] = STATE.get("structures", {})
    infos: list[md.MetricInfo] = STATE["metrics"]
    part = Partial(metrics=list(STATE["names"]))
    nm = len(infos)
    scale = np.array([1e-9 if x.unit == "ns" else 1.0 for x in infos])
    tables, tb = part.tables, part.tb
    py = _PyMapper(tables, by_module)
    mappers: dict[int, ModuleMapper] = {}
    module_paths: list[str] = []
    module_index: dict[str, int] = {}
    codes: list[md.PyCode] = []
    code_index: dict[tuple[str, str, int], int] = {}
    walker = Walker(tb)
    keep_ins = bool(STATE.get("instructions"))

    def make(kind: int, mod: int, addr: int) -> tuple[Step, ...] | int:
        if kind == _SAMPLED:
            # prof --instructions: a sampled PC keeps its address as an instruction scope
            # under its line scope (v4 instruction context), for the Lines tab's assembler
            st = make(_NATIVE, mod, addr)
            if isinstance(st, tuple) and st and st[-1][0] == LN:
                st = (*st, (INS, LEX, -1, -1, 0, tables.module(module_paths[mod]), addr))
            return st
        if kind == _NATIVE:
            mp = mappers.get(mod)
            if mp is None:
                path = module_paths[mod]
                s = by_module.get(path) or by_module.get("base:" + os.path.basename(path))
                syms = None
                if s is None and not STATE.get("ignore_structs"):
                    syms = SymbolTable.of_file(path)
                later = (lambda p=path: SymbolTable.of_file(p)) \
                    if s is not None and path in STATE.get("partial", ()) else None
                mp = mappers[mod] = ModuleMapper(path, s, tables, syms, symbols_of=later)
            return mp.steps(addr)
        if kind == _PYTHON:
            return py.steps(codes[mod], addr)
        if kind == _PARTIAL:
            return tb.entry(ENTRY_UNKNOWN, "partial call paths")
        if kind == _PLACEHOLDER:
            # -e REALTIME: <blocked>/<preempted> below the frame where the thread was switched
            # out, a function context of its own as hpcprof makes of hpcrun's placeholders
            name = next((v for k, v in md.PLACEHOLDER_NAMES.items() if int(k) == addr),
                        f"<placeholder {addr}>")
            return ((F, CALL, tables.function(name, -1, 0, -1, 0), -1, 0, -1, 0),)
        if kind == -1:  # a thread's own root: anchored by Walker.anchors, never by this
            return 0
        if kind == _ROOT:
            return tb.entry(ENTRY_THREAD, "application thread")
        return ((INS, CALL, -1, -1, 0, tables.module("[unknown]"), addr),)

    gpu_offset: int | None = STATE.get("gpu_offset")
    demangled: dict[str, str] = {}
    gpu_mappers: dict[str, ModuleMapper | None] = {}

    def kernel_steps(path: str, addr: int) -> tuple[Step, ...] | None:
        """A kernel's entry in its GPU binary mapped through the binary's structure (found
        by path, or by its content-hash file name), None without one."""
        if path not in gpu_mappers:
            s = by_module.get(path) or by_module.get("base:" + os.path.basename(path))
            gpu_mappers[path] = ModuleMapper(path, s, tables) if s is not None else None
        mp = gpu_mappers[path]
        if mp is None:
            return None
        got = mp.steps(addr)
        return got if got and got[0][0] == F else None

    def anchors_of(proc: md.ProcessProfile, th: md.ThreadProfile) -> npt.NDArray[np.int64]:
        """The builder node of every node of a thread's tree (its frames walked)."""
        nodes = th.nodes
        n = len(nodes)
        mod_map = np.array([module_index.setdefault(m.path, len(module_index))
                            for m in proc.modules] + [-1], dtype=np.int64)
        module_paths[:] = list(module_index)
        code_map = np.array([code_index.setdefault((c.file, c.function, c.first_line),
                                                   len(code_index)) for c in proc.pycode]
                            + [-1], dtype=np.int64)
        if len(codes) < len(code_index):
            codes[:] = [md.PyCode(*k) for k in code_index]
        parent = nodes["parent"].astype(np.int64)
        kind = nodes["kind"].astype(np.int64)
        module = nodes["module"].astype(np.int64)
        address = nodes["address"].astype(np.int64)
        idx = np.arange(n)
        if parent[0] != -1 or kind[0] != _ROOT or np.any(parent[1:] < 0) or np.any(
                parent[1:] >= idx[1:]):
            raise CallpathError(f"{proc.path}: thread {th.slot}: the tree does not start "
                                "at a root with every parent before its children")
        native = kind == _NATIVE
        python = kind == _PYTHON
        bad = native & ((module < 0) | (module >= len(proc.modules)))
        bad |= python & ((module < 0) | (module >= len(proc.pycode)))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise CallpathError(f"{proc.path}: node {i} of thread {th.slot} names "
                                f"{'load module' if native[i] else 'Python code'} "
                                f"{int(module[i])}, which is not in its table")
        gmod = np.where(native, mod_map[np.where(native, module, -1)],
                        np.where(python, code_map[np.where(python, module, -1)], -1))
        exact = (nodes["flags"] & int(md.NodeFlag.EXACT_PC)) != 0
        ip = np.where(native & ~exact, address - 1, address)
        kind[0] = -1
        if keep_ins:
            kind = np.where(native & exact, _SAMPLED, kind)
        frame = walker.frame_ids(kind, gmod, ip, make)
        entry = tb.entry(ENTRY_MAIN, "main thread") if int(th.info.get("index", 0)) == 0 \
            else tb.entry(ENTRY_THREAD, "application thread")
        return walker.anchors(parent, frame, entry)

    for f in files:
        is_companion = f.name.startswith("gpu-")
        gfile = mdg.read(f) if is_companion else None
        proc = gfile.process if gfile is not None else md.read_process(f, nm)
        proc_id = STATE.get("process_ids", {}).get(str(f))
        pending: list[gpu_attr.Pending] = []
        for th in proc.threads:
            n = len(th.nodes)
            if n == 0:
                continue
            pt = gpu_attr.Pending(processes.with_process(th.ids, proc_id), th.tid,
                                  str(th.info.get("name") or ""), int(th.info.get("index", 0)))
            pending.append(pt)
            anchor = anchors_of(proc, th)
            if gfile is not None:
                pt.anchor_of_node, pt.slot = anchor, th.slot
                continue
            rows, cols = np.nonzero(th.samples)
            vrows, vcols = np.nonzero(th.values)
            pt.add(np.concatenate([anchor[vrows], anchor[rows]]),
                   np.concatenate([vcols, cols + nm]).astype(np.int64),
                   np.concatenate([th.values[vrows, vcols] * scale[vcols],
                                   th.samples[rows, cols].astype(np.float64)]))
            if len(th.trace):
                order = np.argsort(th.trace["time"], kind="stable")
                tr = th.trace[order]
                tn = tr["node"].astype(np.int64)
                if np.any(tn >= n):
                    raise CallpathError(f"{proc.path}: thread {th.slot}: a trace record names "
                                        "a node that does not exist")
                pt.trace_times = tr["time"].astype(np.uint64)
                pt.trace_nodes = anchor[tn]
        if gfile is None and gpu_offset is not None:
            comp = f.with_name(mdg.companion_name(f.name))
            if comp.is_file():
                gfile = mdg.read(comp)
                for th in gfile.process.threads:
                    if len(th.nodes):
                        pending.append(gpu_attr.Pending(
                            processes.with_process(th.ids, proc_id), th.tid,
                            str(th.info.get("name") or ""), int(th.info.get("index", 0)),
                            anchor_of_node=anchors_of(gfile.process, th), slot=th.slot))
        streams = []
        if gfile is not None and gpu_offset is not None:
            streams = gpu_attr.attribute_companion(
                gfile.ops, gfile.names, pending, gpu_offset, tb, tables, demangled,
                bool(gfile.process.info.get("gpu_trace", False)), gfile.binaries(),
                kernel_steps)
        for pt in pending:
            if pt.merged:
                continue
            an, met, val = pt.arrays()
            td = ThreadData(pt.ids, spill(STATE.get("spill"), an, met, val), name=pt.name)
            td.trace_times, td.trace_nodes = pt.trace_times, pt.trace_nodes
            part.threads.append(td)
        for ids, times, tnodes in streams:
            empty = np.zeros(0, np.int64)
            td = ThreadData(ids, spill(STATE.get("spill"), empty, empty, np.zeros(0)))
            td.trace_times, td.trace_nodes = times, tnodes
            part.threads.append(td)
    return part
