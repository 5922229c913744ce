"""``meta.db``: the experiment's names and tables (general properties, identifier names,
metrics and propagation scopes, strings, load modules, source files, functions) and its context
tree, as v4 records.

Why a module of its own: ``meta.db`` is the one file written from memory in one piece, and the
largest body of layout code: every table's record layout and the tree, laid out as sibling
groups with every record's position and flex words computed for all nodes at once
(:func:`_context_section`). It depends on the rest of the writer only through the framing in
:mod:`~callpath.formats.v4.framing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.formats.v4.blocks import align_up
from callpath.formats.v4.framing import Section, cstruct, encode_string, file_header, footer
from callpath.model.cct import HAS_FUNCTION, HAS_POINT, HAS_SRCLOC, EntryPoint, NodeKind
from callpath.model.experiment import Experiment
from callpath.model.metrics import Metric, PropagationScope
from callpath.model.tables import SourceFile

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

MODULE_SPEC = cstruct([("flags", "<u4", 0), ("pPath", "<u8", 8)], 0x10)
FILE_SPEC = cstruct([("flags", "<u4", 0), ("pPath", "<u8", 8)], 0x10)
FUNCTION_SPEC = cstruct([("pName", "<u8", 0), ("pModule", "<u8", 8), ("offset", "<u8", 0x10),
                         ("pFile", "<u8", 0x18), ("line", "<u4", 0x20), ("flags", "<u4", 0x24)],
                        0x28)
ENTRY_SPEC = cstruct([("szChildren", "<u8", 0), ("pChildren", "<u8", 8), ("ctxId", "<u4", 0x10),
                      ("entryPoint", "<u2", 0x14), ("pPrettyName", "<u8", 0x18)], 0x20)
SCOPE_SPEC = cstruct([("pScopeName", "<u8", 0), ("type", "u1", 8),
                      ("propagationIndex", "u1", 9)], 0x10)
METRIC_SPEC = cstruct([("pName", "<u8", 0), ("pScopeInsts", "<u8", 8), ("pSummaries", "<u8", 0x10),
                       ("nScopeInsts", "<u2", 0x18), ("nSummaries", "<u2", 0x1A)], 0x20)
SCOPE_INST_SPEC = cstruct([("pScope", "<u8", 0), ("propMetricId", "<u2", 8)], 0x10)
SUMMARY_SPEC = cstruct([("pScope", "<u8", 0), ("pFormula", "<u8", 8), ("combine", "u1", 0x10),
                        ("statMetricId", "<u2", 0x12)], 0x18)

CTX_HEADER_WORDS = 4  # a {Ctx} record is 32 bytes plus its flex words
ENTRY_NAMES = {EntryPoint.UNKNOWN: "unknown entry", EntryPoint.MAIN_THREAD: "main thread",
               EntryPoint.APPLICATION_THREAD: "application thread"}


@dataclass
class TreeLayout:
    """The context tree as v4 records: entry points and {Ctx} records with their sizes."""

    entries: I64  # node indices of the entry points, in order (-1: a synthetic entry)
    synthetic_ctx: int  # ctx id of the synthetic entry wrapping root's non-entry children
    body: I64  # node indices of {Ctx} records in file order (sibling groups by parent)
    words: I64  # size of each body record in u64 words
    n_slots: int  # cct.db context count

    @classmethod
    def build(cls, exp: Experiment, n_slots: int, synthetic: int) -> TreeLayout:
        """``synthetic``: the context id of the "unknown entry" v4 needs above contexts that
        hang directly below the global context (e.g. from experiment.xml), -1 for none;
        :mod:`callpath.formats.v4.entry` chose it and gave it its values."""
        cct = exp.cct
        kind = cct.kind
        is_ctx = kind <= NodeKind.INSTRUCTION
        entries = np.flatnonzero(kind == NodeKind.ENTRY).astype(np.int64)
        if synthetic >= 0:
            entries = np.append(entries, -1)
        body = np.flatnonzero(is_ctx).astype(np.int64)
        body = body[np.argsort(cct.parent[body], kind="stable")]
        fl = cct.flags[body].astype(np.int64)
        nflex = (fl & HAS_FUNCTION) + 2 * ((fl >> 1) & 1) + 2 * ((fl >> 2) & 1)
        return cls(entries, synthetic, body, CTX_HEADER_WORDS + nflex, n_slots)


def meta_db_bytes(exp: Experiment, files: list[SourceFile], tree: TreeLayout) -> bytes:
    n_sections = 8
    header_size = 0x10 + 16 * n_sections
    sections: list[tuple[int, int]] = []
    chunks: list[bytes] = []
    pos = header_size

    def add(sec: Section) -> None:
        nonlocal pos
        sections.append((sec.size, sec.base))
        chunks.append(bytes(sec.base - pos) + bytes(sec.buf))
        pos = sec.base + sec.size

    # General Properties
    gen = Section(align_up(pos))
    hdr = gen.reserve(0x10)
    p_title = gen.put(encode_string(exp.title, "title") + b"\0")
    p_desc = gen.put(encode_string(exp.description, "description") + b"\0")
    gen.patch(hdr, np.array([p_title, p_desc], dtype="<u8"))
    add(gen)

    # Identifier Names
    idn = Section(align_up(pos))
    hdr = idn.reserve(9)
    names = idn.strings(exp.id_names, "identifier name")
    idn.align()
    pp = idn.put(np.array([names[s] for s in exp.id_names], dtype="<u8"))
    idn.patch(hdr, np.array([pp if exp.id_names else 0], dtype="<u8").tobytes()
              + bytes([len(exp.id_names)]))
    add(idn)

    # Performance Metrics
    add(_metrics_section(align_up(pos), exp.metrics, exp.scopes))

    # Common String Table
    strs = Section(align_up(pos))
    entry_names = [_entry_name(exp, int(e)) for e in tree.entries]
    table = strs.strings(entry_names, "entry point name")
    table.update(strs.strings([m.path for m in exp.modules], "load module path"))
    table.update(strs.strings([f.path for f in files], "source file path"))
    table.update(strs.strings([fn.name for fn in exp.functions if fn.has_name], "function name"))
    add(strs)

    # Load Modules
    mods = Section(align_up(pos))
    hdr = mods.reserve(0x0E)
    rec = np.zeros(len(exp.modules), MODULE_SPEC)
    rec["flags"] = [m.flags for m in exp.modules]
    rec["pPath"] = [table[m.path] for m in exp.modules]
    p_mods = mods.align()
    mods.put(rec)
    mods.patch(hdr, _table_header(p_mods, len(exp.modules), MODULE_SPEC.itemsize))
    add(mods)

    # Source Files
    fsec = Section(align_up(pos))
    hdr = fsec.reserve(0x0E)
    rec = np.zeros(len(files), FILE_SPEC)
    rec["flags"] = [(f.flags & ~1) | int(f.copied) for f in files]
    rec["pPath"] = [table[f.path] for f in files]
    p_files = fsec.align()
    fsec.put(rec)
    fsec.patch(hdr, _table_header(p_files, len(files), FILE_SPEC.itemsize))
    add(fsec)

    # Functions
    fns = Section(align_up(pos))
    hdr = fns.reserve(0x0E)
    p_fns = fns.align()
    fns.put(_function_records(exp, table, p_mods, p_files))
    fns.patch(hdr, _table_header(p_fns, len(exp.functions), FUNCTION_SPEC.itemsize))
    add(fns)

    # Context Tree
    add(_context_section(align_up(pos), exp, tree, table, entry_names, p_fns, p_files, p_mods))

    # Header order: General, IdNames, Metrics, Context, Strings, Modules, Files, Functions
    order = [0, 1, 2, 7, 3, 4, 5, 6]
    head = file_header(b"meta", [sections[i] for i in order])
    body = b"".join(chunks)
    return head + body + footer(b"meta", pos)


def _table_header(ptr: int, count: int, size: int) -> bytes:
    if count > 0xFFFFFFFF:
        raise CallpathError(f"{count} table entries; v4 allows at most 2^32-1")
    return (ptr if count else 0).to_bytes(8, "little") + count.to_bytes(4, "little") \
        + size.to_bytes(2, "little")


def _entry_name(exp: Experiment, node: int) -> str:
    if node < 0:
        return ENTRY_NAMES[EntryPoint.UNKNOWN]
    name = exp.cct.entry_names.get(node)
    if name is not None:
        return name
    ep = int(exp.cct.entry_point[node])
    return ENTRY_NAMES.get(EntryPoint(ep), f"entry point {ep}") if ep <= 2 \
        else f"entry point {ep}"


def _metrics_section(base: int, metrics: list[Metric], scopes: list[PropagationScope]
                     ) -> Section:
    sec = Section(base)
    hdr = sec.reserve(0x1B)
    names = sec.strings([s.name for s in scopes], "propagation scope name")
    names.update(sec.strings([s.formula for m in metrics for s in m.summaries], "formula"))
    names.update(sec.strings([m.name for m in metrics], "metric name"))

    p_scopes = sec.align()
    sc = np.zeros(len(scopes), SCOPE_SPEC)
    sc["pScopeName"] = [names[s.name] for s in scopes]
    sc["type"] = [int(s.type) for s in scopes]
    sc["propagationIndex"] = [s.propagation_index for s in scopes]
    sec.put(sc)

    def scope_ptr(i: int, what: str) -> int:
        if not 0 <= i < len(scopes):
            raise CallpathError(f"{what} refers to propagation scope {i}, but there are "
                                f"{len(scopes)}")
        return p_scopes + i * SCOPE_SPEC.itemsize

    p_metrics = sec.reserve(len(metrics) * METRIC_SPEC.itemsize)
    md = np.zeros(len(metrics), METRIC_SPEC)
    for k, m in enumerate(metrics):
        if len(m.scope_insts) > 0xFFFF or len(m.summaries) > 0xFFFF:
            raise CallpathError(f"metric {m.name!r} has too many sub-metrics for v4")
        md[k]["pName"] = names[m.name]
        md[k]["nScopeInsts"] = len(m.scope_insts)
        md[k]["nSummaries"] = len(m.summaries)
        if m.scope_insts:
            psi = np.zeros(len(m.scope_insts), SCOPE_INST_SPEC)
            psi["pScope"] = [scope_ptr(i.scope, f"metric {m.name!r}") for i in m.scope_insts]
            psi["propMetricId"] = [_metric_id(i.prop_metric_id, m) for i in m.scope_insts]
            md[k]["pScopeInsts"] = sec.put(psi)
        if m.summaries:
            ss = np.zeros(len(m.summaries), SUMMARY_SPEC)
            ss["pScope"] = [scope_ptr(s.scope, f"metric {m.name!r}") for s in m.summaries]
            ss["pFormula"] = [names[s.formula] for s in m.summaries]
            ss["combine"] = [int(s.combine) for s in m.summaries]
            ss["statMetricId"] = [_metric_id(s.stat_metric_id, m) for s in m.summaries]
            md[k]["pSummaries"] = sec.put(ss)
    sec.patch(p_metrics, md)
    head = np.zeros(1, cstruct([("pMetrics", "<u8", 0), ("nMetrics", "<u4", 8),
                                ("szMetric", "u1", 0xC), ("szScopeInst", "u1", 0xD),
                                ("szSummary", "u1", 0xE), ("pScopes", "<u8", 0x10),
                                ("nScopes", "<u2", 0x18), ("szScope", "u1", 0x1A)], 0x1B))
    head["pMetrics"] = p_metrics if metrics else 0
    head["nMetrics"] = len(metrics)
    head["szMetric"] = METRIC_SPEC.itemsize
    head["szScopeInst"] = SCOPE_INST_SPEC.itemsize
    head["szSummary"] = SUMMARY_SPEC.itemsize
    head["pScopes"] = p_scopes if scopes else 0
    head["nScopes"] = len(scopes)
    head["szScope"] = SCOPE_SPEC.itemsize
    sec.patch(hdr, head)
    return sec


def _metric_id(i: int, m: Metric) -> int:
    if not 0 <= i <= 0xFFFF:
        raise CallpathError(f"metric {m.name!r}: metric identifier {i} does not fit in 16 bits")
    return i


def _function_records(exp: Experiment, table: dict[str, int], p_mods: int, p_files: int
                      ) -> npt.NDArray[Any]:
    fns = exp.functions
    rec = np.zeros(len(fns), FUNCTION_SPEC)
    if not fns:
        return rec
    mod = np.array([f.module for f in fns], dtype=np.int64)
    fil = np.array([f.file for f in fns], dtype=np.int64)
    if np.any(mod >= len(exp.modules)) or np.any(fil >= len(exp.files)):
        raise CallpathError("a function refers to a load module or source file that does not "
                            "exist")
    rec["pName"] = [table[f.name] if f.has_name else 0 for f in fns]
    rec["pModule"] = np.where(mod >= 0, p_mods + 16 * mod, 0)
    rec["offset"] = [f.offset for f in fns]
    rec["pFile"] = np.where(fil >= 0, p_files + 16 * fil, 0)
    rec["line"] = [f.line for f in fns]
    rec["flags"] = [f.flags for f in fns]
    return rec


def _context_section(base: int, exp: Experiment, tree: TreeLayout, table: dict[str, int],
                     entry_names: list[str], p_fns: int, p_files: int, p_mods: int) -> Section:
    """The context tree: header, the entry point array, then every {Ctx} record, grouped into
    children arrays. All positions and fields are computed for all nodes at once."""
    cct = exp.cct
    n = len(cct)
    sec = Section(base)
    hdr = sec.reserve(0x0B)
    n_entries = len(tree.entries)
    if n_entries > 0xFFFF:
        raise CallpathError(f"{n_entries} entry points; v4 allows at most 65535")
    p_entries = sec.align()
    sec.reserve(n_entries * ENTRY_SPEC.itemsize)
    p_body = sec.align()

    body, words = tree.body, tree.words
    word_pos = np.zeros(len(body), dtype=np.int64)
    if len(body):
        np.cumsum(words[:-1], out=word_pos[1:])
    rec_ptr = p_body + 8 * word_pos
    # children arrays: one contiguous group per parent
    sz_children = np.zeros(n, dtype=np.uint64)
    p_children = np.zeros(n, dtype=np.uint64)
    if len(body):
        par = cct.parent[body]
        first = np.flatnonzero(np.r_[True, par[1:] != par[:-1]])
        gpar = par[first]
        sz_children[gpar] = 8 * np.add.reduceat(words, first)
        p_children[gpar] = rec_ptr[first]

    # entry points
    ent = np.zeros(n_entries, ENTRY_SPEC)
    e_nodes = tree.entries
    real = e_nodes >= 0
    ent["szChildren"] = np.where(real, sz_children[np.maximum(e_nodes, 0)], sz_children[0])
    ent["pChildren"] = np.where(real, p_children[np.maximum(e_nodes, 0)], p_children[0])
    ctx_ids = cct.ctx_id[np.maximum(e_nodes, 0)]
    if not real.all():  # the synthetic entry; tree.synthetic_ctx is -1 (no id) when there is none
        ctx_ids[~real] = tree.synthetic_ctx
    ent["ctxId"] = ctx_ids
    ent["entryPoint"] = np.where(real, cct.entry_point[np.maximum(e_nodes, 0)],
                                 EntryPoint.UNKNOWN)
    ent["pPrettyName"] = [table[s] for s in entry_names]
    sec.patch(p_entries, ent)

    # {Ctx} records as u64 words
    total_words = int(words.sum())
    w = np.zeros(total_words, dtype=np.uint64)
    if len(body):
        fl = (cct.flags[body] & (HAS_FUNCTION | HAS_SRCLOC | HAS_POINT)).astype(np.uint64)
        hf = (fl & HAS_FUNCTION).astype(np.int64)
        hs = ((fl >> np.uint64(1)) & np.uint64(1)).astype(np.int64)
        hp = ((fl >> np.uint64(2)) & np.uint64(1)).astype(np.int64)
        nflex = (words - CTX_HEADER_WORDS).astype(np.uint64)
        w[word_pos] = sz_children[body]
        w[word_pos + 1] = p_children[body]
        w[word_pos + 2] = (cct.ctx_id[body].astype(np.uint64)
                           | fl << np.uint64(32)
                           | cct.relation[body].astype(np.uint64) << np.uint64(40)
                           | cct.kind[body].astype(np.uint64) << np.uint64(48)
                           | nflex << np.uint64(56))
        w[word_pos + 3] = cct.propagation[body].astype(np.uint64)
        flex = word_pos + CTX_HEADER_WORDS

        def pointers(index: I64, present: npt.NDArray[np.bool_], base_ptr: int, stride: int,
                     count: int, what: str) -> U64:
            idx = index[present]
            if np.any((idx < 0) | (idx >= count)):
                raise CallpathError(f"a context's flags say it has a {what}, but its {what} "
                                    f"index is not one of the {count} in the table")
            return (base_ptr + stride * idx).astype(np.uint64)

        m = hf == 1
        w[flex[m]] = pointers(cct.function[body], m, p_fns, FUNCTION_SPEC.itemsize,
                              len(exp.functions), "function")
        m = hs == 1
        at = flex + hf
        w[at[m]] = pointers(cct.file[body], m, p_files, FILE_SPEC.itemsize, len(exp.files),
                            "source file")
        w[at[m] + 1] = cct.line[body][m].astype(np.uint64)
        m = hp == 1
        at = flex + hf + 2 * hs
        w[at[m]] = pointers(cct.module[body], m, p_mods, MODULE_SPEC.itemsize,
                            len(exp.modules), "load module")
        w[at[m] + 1] = cct.offset[body][m].astype(np.uint64)
    sec.put(w)
    sec.patch(hdr, (p_entries if n_entries else 0).to_bytes(8, "little")
              + n_entries.to_bytes(2, "little") + bytes([ENTRY_SPEC.itemsize]))
    return sec
