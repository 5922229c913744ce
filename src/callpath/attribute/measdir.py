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
from pathlib import Path

import numpy as np

from callpath.attribute.build import Tables, ThreadData, finish
from callpath.attribute.hpctk import (
    CALL,
    ENTRY_MAIN,
    ENTRY_THREAD,
    ENTRY_UNKNOWN,
    INS,
    LEX,
    LN,
    F,
    ModuleMapper,
    Step,
    load_structures,
)
from callpath.attribute.tree import TreeBuilder
from callpath.errors import CallpathError
from callpath.formats import measdir as md
from callpath.model import Experiment

_ROOT, _NATIVE, _PYTHON, _PARTIAL, _UNKNOWN = (int(k) for k in (
    md.NodeKind.ROOT, md.NodeKind.NATIVE, md.NodeKind.PYTHON, md.NodeKind.PARTIAL,
    md.NodeKind.UNKNOWN))


def is_callpath_measurements(d: Path) -> bool:
    return (d / "measurement.json").is_file()


class _PyMapper:
    """Python code locations → steps: through the file's structure, else function + line."""

    def __init__(self, tables: Tables, structs: dict[str, object]) -> None:
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
                m = self.mappers[code.file] = ModuleMapper(code.file, s, self.t)  # type: ignore[arg-type]
            out = m.steps(line)
            if out and out[0][0] == INS:
                out = ()
        if not out:
            lm = self.t.module(code.file)
            f = self.t.file(code.file)
            fid = self.t.function(code.function, lm, code.first_line, f, code.first_line)
            out = ((F, CALL, fid, -1, 0, -1, 0), (LN, LEX, -1, f, line, -1, 0))
        self.cache[key] = out
        return out


def prof_measdir(measdirs: list[Path], struct_files: list[Path], *,
                 ignore_structs: bool = False, title: str | None = None) -> Experiment:
    """The experiment of callpath measurement directories (see the module docstring)."""
    meas = [md.read(d) for d in measdirs]
    structs = list(struct_files)
    if not ignore_structs:
        for d in measdirs:
            if (d / "structs").is_dir():
                structs += sorted((d / "structs").glob("*.hpcstruct"))
    by_module = {} if ignore_structs else load_structures(structs)
    infos = meas[0].metrics
    for m in meas[1:]:
        if [x.name for x in m.metrics] != [x.name for x in infos]:
            raise CallpathError(f"{m.path}: measured {[x.name for x in m.metrics]}, but "
                                f"{meas[0].path} measured {[x.name for x in infos]}; "
                                "measurements to combine must sample the same events")
    nm = len(infos)
    scale = [1e-9 if x.unit == "ns" else 1.0 for x in infos]
    names = [(f"{x.name} (sec)" if x.unit == "ns" else x.name,
              x.description or x.event or x.name) for x in infos]
    names += [(f"{x.name} (samples)", f"samples of {x.event or x.name}") for x in infos]
    tables = Tables()
    tb = TreeBuilder()
    py = _PyMapper(tables, by_module)  # type: ignore[arg-type]
    mappers: dict[str, ModuleMapper] = {}
    threads: list[ThreadData] = []
    for m in meas:
        for proc, th in m.threads:
            modules = {mod.index: mod.path for mod in proc.modules}
            nodes = th.nodes
            n = len(nodes)
            anchor = np.zeros(n, dtype=np.int64)
            entry = tb.entry(ENTRY_MAIN, "main thread") if int(th.info.get("index", 0)) == 0 \
                else tb.entry(ENTRY_THREAD, "application thread")
            parents = nodes["parent"].tolist()
            kinds = nodes["kind"].tolist()
            flags = nodes["flags"].tolist()
            mods = nodes["module"].tolist()
            addrs = nodes["address"].tolist()
            for i in range(n):
                k = kinds[i]
                if k == _ROOT:
                    anchor[i] = entry
                    continue
                if parents[i] < 0 or parents[i] >= i:
                    raise CallpathError(f"{proc.path}: node {i} of thread {th.slot} has parent "
                                        f"{parents[i]} (expected an earlier node)")
                p = int(anchor[parents[i]])
                if k == _PARTIAL:
                    anchor[i] = tb.entry(ENTRY_UNKNOWN, "partial call paths")
                    continue
                if k == _NATIVE:
                    path = modules.get(mods[i])
                    if path is None:
                        raise CallpathError(f"{proc.path}: node {i} names load module "
                                            f"{mods[i]}, which is not in the module table")
                    mp = mappers.get(path)
                    if mp is None:
                        s = by_module.get(path) or by_module.get(
                            "base:" + os.path.basename(path))
                        mp = mappers[path] = ModuleMapper(path, s, tables)
                    ip = addrs[i] if flags[i] & md.NodeFlag.EXACT_PC else addrs[i] - 1
                    steps = mp.steps(ip)
                elif k == _PYTHON:
                    if not 0 <= mods[i] < len(proc.pycode):
                        raise CallpathError(f"{proc.path}: node {i} names Python code "
                                            f"{mods[i]}, which is not in the code table")
                    steps = py.steps(proc.pycode[mods[i]], addrs[i])
                else:  # UNKNOWN: a raw pc in no module
                    steps = ((INS, CALL, -1, -1, 0, tables.module("[unknown]"), addrs[i]),)
                for st in steps:
                    p = tb.node(p, *st)
                anchor[i] = p
            rows, cols = np.nonzero(th.samples)
            vrows, vcols = np.nonzero(th.values)
            an = np.concatenate([anchor[vrows], anchor[rows]])
            met = np.concatenate([vcols, cols + nm]).astype(np.int64)
            val = np.concatenate([th.values[vrows, vcols] * np.asarray(scale)[vcols],
                                  th.samples[rows, cols].astype(np.float64)])
            td = ThreadData(th.ids, an, met, val)
            if len(th.trace):
                order = np.argsort(th.trace["time"], kind="stable")
                tr = th.trace[order]
                td.trace_times = tr["time"].astype(np.uint64)
                td.trace_nodes = anchor[tr["node"].astype(np.int64)]
            threads.append(td)
    if not threads:
        raise CallpathError(f"{measdirs[0]}: the measurement holds no execution contexts "
                            "(no process recorded a sample)")
    cmd = meas[0].header.get("command") or []
    program = os.path.basename(str(cmd[0])) if cmd else measdirs[0].name
    return finish(tb, tables, threads, names, title=title or program,
                  description="callpath prof of " + " ".join(map(str, cmd)))
