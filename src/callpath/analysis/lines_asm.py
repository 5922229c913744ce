"""Machine instructions of source lines (PerfVisS Figure 2): for a line and a number of lines
around it, the instructions that the load module's DWARF line table maps there, decoded with
iced-x86, with the cost of each instruction where the database has instruction-level data
(v4 instruction contexts: HPCToolkit's, or ``callpath prof --instructions``).

The load modules searched are those of the procedures that hold line scopes of the file (and
of instruction scopes under them). A module that cannot be read where this runs (moved,
another machine, no DWARF) gives no instructions and a ``reason`` saying why; the listing is
never an exception for that, because the viewer shows the reason in its pane.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.model import Experiment, Metric, NodeKind, Relation
from callpath.model.treeops import nearest_marked

MAX_INSTRUCTIONS = 4000

_TABLES: dict[str, Any] = {}  # module path -> (mtime, size, LineTable, text sections)


class InstructionListing(list[dict[str, Any]]):
    """The instructions, in address order, each ``{"address", "line", "file", "bytes",
    "text", "module", "cost"}`` (``cost`` None when the database has no instruction-level
    data for it). ``reason``: why the listing is empty or partial (None when complete);
    ``modules``: the load modules read."""

    def __init__(self) -> None:
        super().__init__()
        self.reason: str | None = None
        self.modules: list[str] = []


def _file_id(exp: Experiment, file: str | int) -> int:
    if isinstance(file, int):
        if 0 <= file < len(exp.files):
            return file
        raise CallpathError(f"file index {file} out of range (0..{len(exp.files) - 1})")
    for i, f in enumerate(exp.files):
        if f.path == file:
            return i
    hits = [i for i, f in enumerate(exp.files)
            if f.path.endswith("/" + file.lstrip("/")) or Path(f.path).name == file]
    if len(hits) >= 1:
        return hits[0]
    raise CallpathError(f"source file {file!r} is not in the database")


def _modules_of_file(exp: Experiment, fid: int) -> list[int]:
    """Load modules holding code of file ``fid``: those of the procedures around its line
    scopes, and of the sampled instructions lexically under them (``prof --instructions``).
    An instruction scope reached by a call is a callee frame without a procedure (ld.so's
    lazy binder, libgomp's code without symbols): another module's code, not the line's."""
    cct = exp.cct
    lines = np.nonzero((cct.kind == NodeKind.LINE) & (cct.file == fid))[0]
    if not len(lines):
        return []
    owner = nearest_marked(cct.parent, cct.kind == NodeKind.FUNCTION)[lines]
    fns = cct.function[owner[owner >= 0]]
    mods = {exp.functions[int(f)].module for f in np.unique(fns[fns >= 0]).tolist()}
    par = cct.parent
    ins = np.nonzero(cct.kind == NodeKind.INSTRUCTION)[0]
    under = ins[np.isin(par[ins], lines) & (cct.relation[ins] == Relation.LEXICAL)]
    mods |= set(np.unique(cct.module[under]).tolist())
    return sorted(int(m) for m in mods if m >= 0)


def _load(path: str) -> tuple[Any, list[Any]]:
    """(line table, text sections) of a module, cached by path, mtime and size."""
    from callpath.structure.binary import read_debug
    from callpath.structure.elf import open_elf

    st = os.stat(path)
    got = _TABLES.get(path)
    if got is not None and got[0] == (st.st_mtime_ns, st.st_size):
        return got[1], got[2]
    mod = open_elf(path)
    try:
        dbg = read_debug(mod)
        if dbg is None:
            raise CallpathError(f"{path}: no DWARF line table (built without -g, and no "
                                "separate debug file found)")
        secs = list(mod.text_sections)
    finally:
        mod.close()
    _TABLES[path] = ((st.st_mtime_ns, st.st_size), dbg.lines, secs)
    return dbg.lines, secs


def _python_module(path: str) -> bool:
    """A Python profile's load module: a package directory, a module file, or a frozen or
    ``<string>`` module. Bytecode, not machine code: there is nothing to disassemble, and
    trying to read it as ELF gave 'not an ELF file' or 'cannot open: Is a directory'."""
    return path.endswith((".py", ".pyw")) or (path.startswith("<") and path.endswith(">")) \
        or os.path.isdir(path)


def _same_file(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return os.path.normpath(a) == os.path.normpath(b) or (
            os.path.basename(a) == os.path.basename(b)
            and (a.endswith("/" + b.lstrip("./")) or b.endswith("/" + a.lstrip("./"))))
    except ValueError:
        return False


def _instruction_costs(exp: Experiment, metric: Metric | None, module: int
                       ) -> dict[int, float]:
    """Exclusive cost of every instruction scope of ``module`` by address."""
    cct = exp.cct
    ins = np.nonzero((cct.kind == NodeKind.INSTRUCTION) & (cct.module == module))[0]
    if not len(ins) or metric is None:
        return {}
    try:
        vals = exp.exclusive(metric)[ins]
    except CallpathError:
        return {}
    addr = cct.offset[ins].astype(np.int64)
    ua, inv = np.unique(addr, return_inverse=True)
    tot = np.bincount(inv.ravel(), weights=vals, minlength=len(ua))
    return dict(zip(ua.tolist(), tot.tolist(), strict=True))


def line_instructions(exp: Experiment, file: str | int, line: int, around: int = 0,
                      metric: str | int | Metric | None = 0) -> InstructionListing:
    """The instructions of lines ``line - around .. line + around`` of ``file`` (a recorded
    path, a unique suffix or base name, or an index of ``exp.files``)."""
    import iced_x86

    if around < 0:
        raise CallpathError(f"lines around {around}: expected 0 or more")
    out = InstructionListing()
    fid = _file_id(exp, file)
    recorded = exp.files[fid].path
    m = None
    if metric is not None and exp.metrics:
        m = metric if isinstance(metric, Metric) else exp.metric(metric)
    mods = _modules_of_file(exp, fid)
    if not mods:
        out.reason = f"no load module of the database holds code of {recorded}"
        return out
    lo_line, hi_line = int(line) - int(around), int(line) + int(around)
    reasons = []
    fmt = iced_x86.Formatter(iced_x86.FormatterSyntax.GAS)
    python = []
    for mi in mods:
        path = exp.modules[mi].path if mi < len(exp.modules) else ""
        if _python_module(path):
            python.append(path)
            continue
        try:
            table, secs = _load(path)
        except (CallpathError, OSError) as e:
            msg = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            reasons.append(f"cannot read load module {path}: {msg}")
            continue
        out.modules.append(path)
        ids = np.asarray([i for i, f in enumerate(table.files) if _same_file(f, recorded)],
                         dtype=np.int32)
        if not len(ids):
            continue
        addr: npt.NDArray[np.uint64] = table.address
        sel = np.nonzero(np.isin(table.file, ids) & (table.line >= lo_line)
                         & (table.line <= hi_line))[0]
        sel = sel[sel + 1 < len(addr)]
        if not len(sel):
            continue
        starts = addr[sel].astype(np.int64)
        ends = addr[sel + 1].astype(np.int64)
        rows_line = table.line[sel]
        costs = _instruction_costs(exp, m, mi)
        seen: set[int] = set()
        for a, b, ln in sorted(zip(starts.tolist(), ends.tolist(), rows_line.tolist(),
                                   strict=True)):
            if b <= a:
                continue
            sec = next((s for s in secs if s.addr <= a < s.addr + s.size), None)
            if sec is None:
                continue
            b = min(b, sec.addr + sec.size)
            dec = iced_x86.Decoder(64, sec.data[a - sec.addr:b - sec.addr], ip=a)
            for ins in dec:
                if ins.ip in seen:
                    continue
                seen.add(ins.ip)
                raw = sec.data[ins.ip - sec.addr:ins.next_ip - sec.addr]
                out.append({"address": int(ins.ip), "line": int(ln), "file": recorded,
                            "bytes": raw.hex(), "text": fmt.format(ins), "module": path,
                            "cost": costs.get(int(ins.ip), 0.0) if costs else None})
                if len(out) >= MAX_INSTRUCTIONS:
                    out.reason = f"listing cut at {MAX_INSTRUCTIONS} instructions"
                    break
    out.sort(key=lambda d: (d["module"], d["address"]))
    if not out and out.reason is None and python and not reasons and not out.modules:
        out.reason = (f"Python code (load module {', '.join(python)}): the interpreter "
                      "runs its bytecode, so there are no machine instructions to show")
    elif not out and out.reason is None:
        out.reason = "; ".join(reasons) if reasons else (
            f"the line table of {', '.join(out.modules)} maps no instruction to lines "
            f"{lo_line}..{hi_line} of {recorded}")
    elif reasons and out.reason is None:
        out.reason = "; ".join(reasons)
    return out
