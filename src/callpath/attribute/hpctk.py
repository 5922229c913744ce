"""Attribution of HPCToolkit measurement directories (``*.hpcrun``, ``*.hpctrace``, ``structs/``).

Every hpcrun CCT node is a frame: a load module and an address (for callers, the call
instruction: hpcrun already stores return address − 1). Its address is mapped through the
module's structure to procedure → inlined code → loops → statement, and those contexts are
created (or found: :class:`TreeBuilder` interns them) under the context of its caller's call
site. The statement context is then the node's *anchor*: its samples are counted there and its
callees hang below it. Without structure for the module (or with ``ignore_structs``, like
``hpcprof --ignore-structs``) a frame is a single instruction context ``module+offset`` reached
by a call.

Values of metrics hpcrun marks ``move2proc`` (its GPU times and counts) go to the frame's
*entry* instead, the procedure its call enters. Placeholder frames (load module 0) are the
roots and entries of the tree, or procedures named as hpcprof names them (``<gpu kernel>``,
:mod:`callpath.model.gpu_names`); frames hpcrun did not unwind (GPU PC samples) are placed through
the GPU binary's call graph (:mod:`callpath.attribute.gpu_reconstruct`). docs/prof.md, "GPU
measurements".

hpcprof additionally keeps an invisible instruction context below every statement; values are
identical at every context that the tree lists, except ``point`` values, which here sit on the
statement itself (docs/prof.md lists the differences).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from callpath.attribute.build import Tables, ThreadData, finish
from callpath.attribute.elfsyms import DirectSymbols
from callpath.attribute.forked import STATE
from callpath.attribute.gpu_reconstruct import GpuCallGraph, Reconstructor
from callpath.attribute.hpcrun_periods import scaled_values
from callpath.attribute.hpcrun_yaml import metrics_yaml
from callpath.attribute.kernelsyms import KernelSymbols, is_kernel_symbols
from callpath.attribute.reduce import Partial, reduce_units, writer_mapper
from callpath.attribute.samples import spill
from callpath.attribute.thread_tree import Walker
from callpath.errors import CallpathError
from callpath.formats import hpcrun as hr
from callpath.formats.hpcstruct import read_hpcstruct
from callpath.model import (
    Experiment,
    Identifier,
    NodeKind,
    Relation,
)
from callpath.model.gpu_names import GPU_PLACEHOLDERS, OTHER_PLACEHOLDERS
from callpath.structure.model import Kind, Structure

F, LP, LN, INS = (int(NodeKind.FUNCTION), int(NodeKind.LOOP), int(NodeKind.LINE),
                  int(NodeKind.INSTRUCTION))
_FILE, _PROC, _ALIEN, _LOOP = int(Kind.FILE), int(Kind.PROC), int(Kind.ALIEN), int(Kind.LOOP)
CALL, INL, LEX = int(Relation.CALL), int(Relation.INLINED_CALL), int(Relation.LEXICAL)
# kind, relation, function, file, line, module, offset
Step = tuple[int, int, int, int, int, int, int]

ENTRY_MAIN, ENTRY_THREAD, ENTRY_UNKNOWN = 1, 2, 0
NOT_UNWOUND = 2  # the frame kind of a node hpcrun did not unwind


class SymbolTable:
    """Procedures of a load module from its symbol tables (the fallback without structure):
    sorted entries, ends and display names."""

    def __init__(self, entries: npt.NDArray[np.uint64], ends: npt.NDArray[np.uint64],
                 names: list[str], *, mangled: bool = False) -> None:
        self.entries, self.ends, self.names = entries, ends, names
        #: ``names`` are linkage names, demangled when :meth:`find` returns one (a stray
        #: address of libtorch_cpu.so needs one name of 385k; demangling all cost seconds)
        self.mangled = mangled
        self._shown: dict[int, str] = {}

    @classmethod
    def of_file(cls, path: str) -> SymbolTable | None:
        """The symbol table of the ELF file at ``path``; None if it cannot be read."""
        from callpath.structure.elf import open_elf
        from callpath.structure.symbols import procedures

        try:
            mod = open_elf(path)
        except (CallpathError, OSError):
            return None
        try:
            procs = procedures(mod, demangle_names=False)
        except (CallpathError, OSError):
            return None
        finally:
            mod.close()
        return cls(np.array([p.entry for p in procs], dtype=np.uint64),
                   np.array([p.end for p in procs], dtype=np.uint64),
                   [p.link_name for p in procs], mangled=True)

    def find(self, ip: int) -> tuple[int, str] | None:
        i = int(np.searchsorted(self.entries, np.uint64(ip), side="right")) - 1
        if i < 0 or ip >= int(self.ends[i]):
            return None
        if not self.mangled:
            return int(self.entries[i]), self.names[i]
        name = self._shown.get(i)
        if name is None:
            from callpath.structure.demangle import demangle
            name = self._shown[i] = demangle(self.names[i])
        return int(self.entries[i]), name


class ModuleMapper:
    """Maps addresses of one load module to structure steps, memoised per address."""

    def __init__(self, path: str, structure: Structure | None, tables: Tables,
                 symbols: SymbolTable | None = None,
                 kernel: KernelSymbols | None = None,
                 direct: DirectSymbols | None = None,
                 symbols_of: Callable[[], SymbolTable | None] | None = None) -> None:
        self.path = path
        self.s = structure
        self.t = tables
        self.symbols = symbols
        #: where the structure holds only some procedures (recovered on demand), the symbol
        #: table for an address outside them, read the first time one comes
        self.symbols_of = symbols_of
        self.kernel = kernel
        #: hpcprof's fallback where no structure covers an address: the module's ELF symbols
        self.direct = direct
        self.base = os.path.basename(path)
        self.cache: dict[int, tuple[Step, ...]] = {}

    def _file(self, sid: int) -> int:
        assert self.s is not None
        return self.t.file(self.s.text(sid) if sid >= 0 else f"[{self.base}]")

    def steps(self, ip: int) -> tuple[Step, ...]:
        got = self.cache.get(ip)
        if got is not None:
            return got
        lm = self.t.module(self.path)
        ksym = self.kernel.find(ip & 0xFFFFFFFFFFFFFFFF) if self.kernel is not None else None
        if ksym is not None:  # a kernel function, as hpcprof's KernelSymbols names it
            kfn = self.t.function(ksym[1], lm, ksym[0], -1, 0)
            self.cache[ip] = ((F, CALL, kfn, -1, 0, -1, 0),)
            return self.cache[ip]
        scope = lookup_one(self.s, ip) if self.s else -1
        dsym = self.direct.find(ip & 0xFFFFFFFFFFFFFFFF) \
            if self.direct is not None and scope < 0 else None
        if dsym is not None:
            dfn = self.t.function(dsym[1], lm, dsym[0], -1, 0)
            self.cache[ip] = ((F, CALL, dfn, -1, 0, -1, 0),)
            return self.cache[ip]
        if scope < 0 and self.symbols is None and self.symbols_of is not None:
            self.symbols, self.symbols_of = self.symbols_of(), None
        proc = self.symbols.find(ip) if self.symbols is not None and scope < 0 else None
        if proc is not None:
            fid = self.t.function(proc[1], lm, proc[0], -1, 0)
            out: tuple[Step, ...] = ((F, CALL, fid, -1, 0, -1, 0), (INS, LEX, -1, -1, 0, lm, ip))
        elif scope < 0:
            out = ((INS, CALL, -1, -1, 0, lm, ip),)
        else:
            out = self._chain_steps(scope, lm)
        self.cache[ip] = out
        return out

    def _chain_steps(self, scope: int, lm: int) -> tuple[Step, ...]:
        s = self.s
        assert s is not None
        # the chain's columns read once as Python ints (a numpy scalar per field and an
        # enum member per test cost more than the steps they made: ~8,000 chains of a
        # PyTorch run); scope kinds compared as ints (``_PROC`` ...)
        chain = s.chain(scope)
        chain.reverse()
        idx = np.array(chain, dtype=np.int64)
        kinds = s.kind[idx].tolist()
        keep = [i for i, k in enumerate(kinds) if k != _FILE]
        if len(keep) != len(chain):
            idx = idx[keep]
            kinds = [kinds[i] for i in keep]
        lines = s.line[idx].tolist()
        files = s.file[idx].tolist()
        names = s.name[idx].tolist()
        call_files = s.call_file[idx].tolist()
        call_lines = s.call_line[idx].tolist()
        rp0 = s.range_ptr[idx].tolist()
        rp1 = s.range_ptr[idx + 1].tolist()
        steps: list[Step] = []
        cur_file = -1
        for j, k in enumerate(kinds):
            line = lines[j]
            if k == _PROC:
                f = self._file(files[j])
                name = s.text(names[j])
                if files[j] < 0 and s.proc_suffix:
                    name = f"{name} [{self.base}]"
                lo = int(s.range_lo[rp0[j]]) if rp1[j] > rp0[j] else 0
                fid = self.t.function(name, lm, lo, f, line)
                steps.append((F, CALL, fid, -1, 0, -1, 0))
                cur_file = f
            elif k == _ALIEN:
                cf = self._file(call_files[j]) if call_files[j] >= 0 else cur_file
                steps.append((LN, LEX, -1, cf, call_lines[j], -1, 0))
                f = self._file(files[j])
                fid = self.t.function(s.text(names[j]), lm, 0, f, line)
                steps.append((F, INL, fid, -1, 0, -1, 0))
                cur_file = f
            elif k == _LOOP:
                f = self._file(files[j]) if files[j] >= 0 else cur_file
                lo = int(s.range_lo[rp0[j]]) if rp1[j] > rp0[j] else 0
                steps.append((LP, LEX, -1, f, line, lm, lo))
            else:  # STMT or CALL: a source line
                f = self._file(files[j]) if files[j] >= 0 else cur_file
                steps.append((LN, LEX, -1, f, line, -1, 0))
        if kinds and kinds[-1] in (_PROC, _ALIEN):
            steps.append((LN, LEX, -1, cur_file, lines[-1], -1, 0))
        return tuple(steps)


def lookup_one(s: Structure, ip: int) -> int:
    """``s.lookup`` of one offset: the innermost scope, -1 where the module has no code
    there (without the arrays that the vectorised lookup makes: an attribution asks this
    once per distinct address, thousands of times)."""
    if not len(s.map_lo):
        return -1
    off = np.uint64(ip & 0xFFFFFFFFFFFFFFFF)
    i = int(s.map_lo.searchsorted(off, side="right")) - 1
    if i < 0 or off >= s.map_hi[i]:
        return -1
    return int(s.map_scope[i])


def placeholder_name(code: int) -> str:
    """The name hpcprof gives an hpcrun placeholder frame: its standard name (``<gpu
    kernel>``), else the 8 characters of its code (non-printable ones as ``\\xx``)."""
    raw = (code & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")
    got = GPU_PLACEHOLDERS.get(raw) or OTHER_PLACEHOLDERS.get(raw)
    if got is not None:
        return got
    return "".join(chr(b) if 32 <= b < 127 else f"\\{b:02x}" for b in raw)


def load_structures(paths: list[Path]) -> dict[str, Structure]:
    """Structures by load module path (and by base name, for moved files)."""
    out: dict[str, Structure] = {}
    for p in paths:
        for s in read_hpcstruct(p):
            out.setdefault(s.path, s)
            out.setdefault("base:" + os.path.basename(s.path), s)
    return out


def _identifiers(tup: list[tuple[int, int, int]]) -> tuple[Identifier, ...]:
    out = []
    for word, phys, logical in tup:
        kind = word & 0x3FFF
        interp = word >> 14
        out.append(Identifier(kind, logical, phys, 1 if interp == 1 else 0))
    return tuple(out)


def is_hpctoolkit_measurements(d: Path) -> bool:
    return d.is_dir() and any(d.glob("*.hpcrun"))


def prof_hpctoolkit(measdirs: list[Path], struct_files: list[Path], *,
                    ignore_structs: bool = False, title: str | None = None,
                    workers: int = 1, mpi: bool = False,
                    stats: bool = False) -> Experiment | None:
    """The experiment hpcprof would write for HPCToolkit measurement directories, reduced by
    ``workers`` processes."""
    files: list[Path] = []
    structs = list(struct_files)
    for d in measdirs:
        files += sorted(d.glob("*.hpcrun"))
        if not ignore_structs and (d / "structs").is_dir():
            structs += sorted((d / "structs").glob("*.hpcstruct"))
    if not files:
        raise CallpathError(f"no *.hpcrun files in {', '.join(map(str, measdirs))}")
    part = reduce_units(reduce_hpcrun_files, files, workers, mpi,
                        {"structures": {} if ignore_structs else load_structures(structs)})
    if part is None:
        return None
    exp = finish(part.tb, part.tables, part.threads, part.metrics,
                 title=title or part.program,
                 description="callpath prof of HPCToolkit measurements",
                 stats=stats, parallel=writer_mapper(workers, mpi))
    # (with -M stats hpcprof's file also lists the statistics; this one, like the generic
    # one, does not)
    exp.metrics_yaml = metrics_yaml(descriptor_table(measdirs), [m.name for m in exp.metrics])
    return exp


def descriptor_table(measdirs: list[Path]) -> list[hr.HpcrunMetric]:
    """hpcrun's metric descriptors of the measurement directories (the first profile's of
    each; hpcrun writes one table per run), each name once, in order."""
    out: dict[str, hr.HpcrunMetric] = {}
    for d in measdirs:
        first = min(d.glob("*.hpcrun"), default=None)
        if first is not None:
            for m in hr.read_hpcrun(first).metrics:
                out.setdefault(m.name, m)
    return list(out.values())


def reduce_hpcrun_files(files: Sequence[Path]) -> Partial:
    """One worker's share: attribute these ``*.hpcrun`` files (and their traces), vectorised
    per tree level by :class:`Walker` and memoised across threads."""
    by_module: dict[str, Structure] = STATE.get("structures", {})
    part = Partial()
    tb = part.tb
    mappers: dict[int, ModuleMapper] = {}
    module_index: dict[str, int] = {}
    module_paths: list[str] = []
    module_dirs: dict[str, Path] = {}  # a relative load module's measurement directory
    walker = Walker(tb, lambda: tb.entry(ENTRY_UNKNOWN, "partial call paths"), entries=True)

    def make(kind: int, lm: int, ip: int) -> tuple[Step, ...] | int:
        if kind == NOT_UNWOUND:
            return not_unwound(lm, ip)
        if kind == 1:
            mp = mappers.get(lm)
            if mp is None:
                path = module_paths[lm]
                s = by_module.get(path) or by_module.get("base:" + os.path.basename(path))
                # a relative module is a file hpcrun copied into the measurement directory
                # (vdso/, kernel_symbols/): the very bytes measured, safe to read symbols from;
                # an absolute path names whatever is there now (docs/prof.md)
                where = module_dirs.get(path)
                ks = KernelSymbols.of_file(where / path) \
                    if where is not None and is_kernel_symbols(path) else None
                ds = DirectSymbols.of_file(where / path) \
                    if where is not None and ks is None else None
                mp = mappers[lm] = ModuleMapper(path, s, part.tables, kernel=ks, direct=ds)
            return mp.steps(ip)
        if ip in (hr.PRIMARY_ROOT, hr.NO_ACTIVITY):
            return 0
        if ip == hr.FENCE_MAIN:
            return tb.entry(ENTRY_MAIN, "main thread")
        if ip == hr.FENCE_THREAD:
            return tb.entry(ENTRY_THREAD, "application thread")
        if ip == hr.PARTIAL_ROOT:
            return tb.entry(ENTRY_UNKNOWN, "partial call paths")
        if ip == hr.UNNORMALIZED_IP:
            return ()  # hpcprof's unknown scope: transparent here
        # any other placeholder (<gpu kernel>, <omp idle>, ...): a function context of its
        # own, reached by a call, one per placeholder code (hpcprof's rule)
        name = placeholder_name(ip)
        return ((F, CALL, part.tables.function(name, -1, 0, -1, 0, tag=ip), -1, 0, -1, 0),)

    graphs: dict[int, GpuCallGraph | None] = {}

    def graph(lm: int) -> GpuCallGraph | None:
        """The GPU call graph of load module ``lm`` (hpcstruct ``--gpucfg yes``), if any."""
        if lm not in graphs:
            s = mappers[lm].s if lm in mappers else None
            g = GpuCallGraph(s) if s is not None and s.has_calls else None
            graphs[lm] = g if g is not None and g.valid else None
        return graphs[lm]

    def module_steps(lm: int, ip: int) -> tuple[Step, ...]:
        got = make(1, lm, ip)
        assert not isinstance(got, int)
        return got

    rebuild = Reconstructor(tb.node, module_steps, graph)
    reconstructed: set[tuple[int, int]] = set()  # (module, address) of such frames

    def not_unwound(lm: int, ip: int) -> tuple[Step, ...]:
        """A frame hpcrun did not unwind (a GPU PC sample). hpcprof reconstructs its calling
        contexts through the GPU binary's call graph where a structure file made with
        ``--gpucfg yes`` (``has-calls``) covers the instruction: the frame adds nothing
        here, its values are spread afterwards (:mod:`callpath.attribute.gpu_reconstruct`).
        Otherwise: an unknown procedure reached by a call, and the instruction reached by
        a call below it."""
        module_steps(lm, ip)  # (the module's mapper and structure)
        g = graph(lm)
        if g is not None and g.function_of(ip) >= 0:
            reconstructed.add((lm, ip))
            return ()
        point = (INS, CALL, -1, -1, 0, part.tables.module(module_paths[lm]), ip)
        return ((F, CALL, -1, -1, 0, -1, 0), point)

    for f in files:
        prof = hr.read_hpcrun(f)
        part.program = part.program or prof.header.get("program-name", "")
        # descriptors with a formula are hpcprof's derived statistics, not metrics
        local = np.array([-1 if m.formula else part.metric(m.name, m.description)
                          for m in prof.metrics] + [-1], dtype=np.int64)
        move2proc = np.array([m.move2proc for m in prof.metrics] + [False], dtype=bool)
        n = len(prof.node_id)
        order = np.argsort(prof.node_id, kind="stable")
        sorted_ids = prof.node_id[order]

        def index_of(ids: npt.NDArray[np.int64], what: str,
                     sorted_ids: npt.NDArray[np.int64] = sorted_ids,
                     order: npt.NDArray[np.int64] = order,
                     prof: hr.HpcrunProfile = prof) -> npt.NDArray[np.int64]:
            pos = np.minimum(np.searchsorted(sorted_ids, ids), max(len(sorted_ids) - 1, 0))
            ok = (sorted_ids[pos] == ids) if len(sorted_ids) else np.zeros(len(ids), bool)
            if not ok.all():
                bad = int(ids[~ok][0])
                raise CallpathError(f"{prof.path}: {what} names CCT node {bad}, which does "
                                    "not exist")
            return order[pos] + 1  # index 0 is the synthetic root
        top = prof.node_parent == 0
        parent = np.zeros(n + 1, dtype=np.int64)
        parent[0] = -1
        if (~top).any():
            parent[1:][~top] = index_of(prof.node_parent[~top], "a CCT node's parent")
        if n and np.any(parent[1:] >= np.arange(1, n + 1)):
            raise CallpathError(f"{prof.path}: a CCT node comes before its parent")
        lm = prof.node_lm
        placeholder = lm == hr.PLACEHOLDER_LM
        lm_paths = {k: module_index.setdefault(v, len(module_index))
                    for k, v in prof.modules.items()}
        module_paths[:] = list(module_index)
        for lm_path in prof.modules.values():
            if not os.path.isabs(lm_path):
                module_dirs.setdefault(lm_path, f.parent)
        known = np.isin(lm, np.fromiter(lm_paths, dtype=np.int64, count=len(lm_paths)))
        if np.any(~placeholder & ~known):
            bad = int(lm[~placeholder & ~known][0])
            raise CallpathError(f"{prof.path}: a CCT node names load module {bad}, which is "
                                "not in the load map")
        lut = np.full(int(lm.max(initial=0)) + 1, -1, dtype=np.int64)
        for k, v in lm_paths.items():
            if k < len(lut):
                lut[k] = v
        kind = np.concatenate([[-1], np.where(placeholder, 0, np.where(
            prof.node_unwound, 1, NOT_UNWOUND))]).astype(np.int64)
        gmod = np.concatenate([[-1], np.where(placeholder, -1, lut[lm])]).astype(np.int64)
        ip = np.concatenate([[0], prof.node_ip.astype(np.int64)])
        frame = walker.frame_ids(kind, gmod, ip, lambda k, m, a: 0 if k == -1 else make(k, m, a))
        anchor, entry = walker.anchors_and_entries(parent, frame, 0)
        at = index_of(prof.value_node, "a metric value")
        keep = local[prof.value_mid] >= 0
        # move2proc metrics (hpcrun's GPU times and counts) go to the procedure the frame's
        # call enters, the others to the frame's line (hpcprof's isRelation)
        where = np.where(move2proc[prof.value_mid], entry[at], anchor[at])
        metric, value = local[prof.value_mid], scaled_values(prof)
        rec = np.zeros(len(at), dtype=bool)
        if reconstructed:
            fids = [walker.frame_index[(NOT_UNWOUND, m, a)] for m, a in reconstructed
                    if (NOT_UNWOUND, m, a) in walker.frame_index]
            rec_frame = np.zeros(len(walker.steps), dtype=bool)
            rec_frame[np.array(fids, dtype=np.int64)] = True
            rec = rec_frame[frame[at]] & keep
        normal = keep & ~rec
        ctx, met, val = where[normal], metric[normal], value[normal]
        if rec.any():
            r_ctx, r_met, r_val = rebuild.redistribute(
                anchor[parent[at[rec]]], gmod[at[rec]], ip[at[rec]], metric[rec], value[rec],
                [name for name, _ in part.metrics], (ctx, met, val))
            ctx, met, val = (np.concatenate([ctx, r_ctx]), np.concatenate([met, r_met]),
                             np.concatenate([val, r_val]))
        th = ThreadData(_identifiers(prof.id_tuple), spill(STATE.get("spill"), ctx, met, val))
        tf = f.with_suffix(".hpctrace")
        if tf.exists():
            tr = hr.read_hpctrace(tf)
            th.trace_times = tr.times
            pos = np.minimum(np.searchsorted(sorted_ids, tr.nodes), max(n - 1, 0))
            ok = (sorted_ids[pos] == tr.nodes) if n else np.zeros(len(tr.nodes), bool)
            # a "call trace" (hpcrun's flag bit 2: GPU streams) names the procedure the
            # frame enters (the kernel), not its line (hpcprof's rule)
            named = entry if tr.flags & hr.TRACE_CALL_FLAG else anchor
            th.trace_nodes = np.where(ok, named[order[pos] + 1] if n else 0, 0)
        part.threads.append(th)
    return part
