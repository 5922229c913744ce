"""Reader of HPCToolkit's sparse database format v4 (``../specs/hpctoolkit-FORMATS.md``).

Design: every file is memory-mapped; tables are decoded with numpy record views that use the
structure sizes stored in the file as strides (forward compatibility); values in ``profile.db``
and ``cct.db`` are not touched until a block is asked for, and then handed out as zero-copy
views. The context tree is the one place with variable-size records: it is walked breadth-first,
one level at a time, with a tight Python loop over record sizes only; all fields are then
decoded for a whole level at once and the preorder is computed arithmetically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from callpath.errors import FormatError
from callpath.formats.v4.binfile import BinFile, index_of
from callpath.formats.v4.names import read_names
from callpath.formats.v4.taxonomy import root_descriptions
from callpath.model import (
    CCT,
    Combine,
    ContextBlock,
    ExecutionContext,
    Experiment,
    Function,
    Identifier,
    LoadModule,
    Metric,
    NodeKind,
    ProfileBlock,
    PropagationScope,
    Relation,
    ScopeInstance,
    ScopeType,
    SourceFile,
    SummaryStatistic,
    TraceLine,
    Traces,
)
from callpath.model.values import BlockStore

I64 = npt.NDArray[np.int64]

PROFILE_VALUE = np.dtype([("metric", "<u2"), ("value", "<f8")])  # 10 bytes, packed
PROFILE_INDEX = np.dtype([("ctx", "<u4"), ("start", "<u8")])  # 12 bytes, packed
CONTEXT_VALUE = np.dtype([("prof", "<u4"), ("value", "<f8")])  # 12 bytes, packed
CONTEXT_INDEX = np.dtype([("metric", "<u2"), ("start", "<u8")])  # 10 bytes, packed
TRACE_ELEM = np.dtype([("time", "<u8"), ("ctx", "<u4")])  # 12 bytes, packed


def read_v4(directory: str | Path) -> Experiment:
    """Open a v4 database directory. ``cct.db`` and ``trace.db`` are optional."""
    d = Path(directory)
    meta = _read_meta(BinFile(d / "meta.db", b"meta"))
    prof = BinFile(d / "profile.db", b"prof")
    profiles, loader = _read_profiles(prof)
    profiles = read_names(d, profiles)  # thread names, kept beside the database
    max_ctx = int(meta.cct.ctx_id.max())
    n_slots = max_ctx + 1
    context_values: BlockStore[ContextBlock] | None = None
    if (d / "cct.db").exists():
        cfile = BinFile(d / "cct.db", b"ctxt")
        n_ctx, cloader = _read_contexts(cfile, len(profiles))
        if max_ctx >= n_ctx:
            raise FormatError(d / "meta.db", f"context identifier {max_ctx} has no entry in "
                              f"cct.db, which lists {n_ctx} contexts")
        n_slots = n_ctx
        context_values = BlockStore(n_ctx, cloader)
    elif n_slots > 16 * len(meta.cct) + 65536:
        # Without cct.db the identifier range is only bounded by the tree; identifiers are
        # dense in practice, so a huge one is corruption and would cost gigabytes of memory.
        raise FormatError(d / "meta.db", f"context identifier {max_ctx} is implausibly large "
                          f"for a tree of {len(meta.cct)} contexts")
    traces = _read_traces(BinFile(d / "trace.db", b"trce")) if (d / "trace.db").exists() else None
    yaml_path = d / "metrics" / "default.yaml"
    metrics_yaml = None
    if yaml_path.is_file():
        try:
            metrics_yaml = yaml_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise FormatError(yaml_path, f"unreadable metric taxonomy: {e}") from None
        described = root_descriptions(metrics_yaml)
        for m in meta.metrics:
            if not m.description:
                m.description = described.get(m.name, "")
    return Experiment(
        cct=meta.cct, metrics=meta.metrics, scopes=meta.scopes, profiles=profiles,
        values=BlockStore(len(profiles), loader), n_ctx_slots=n_slots,
        modules=meta.modules, files=meta.files, functions=meta.functions,
        id_names=meta.id_names, title=meta.title, description=meta.description,
        context_values=context_values, traces=traces, metrics_yaml=metrics_yaml, path=d,
        format="hpctoolkit-v4",
    )


# ---- meta.db ---------------------------------------------------------------------------


@dataclass
class _Meta:
    title: str
    description: str
    id_names: list[str]
    scopes: list[PropagationScope]
    metrics: list[Metric]
    modules: list[LoadModule]
    files: list[SourceFile]
    functions: list[Function]
    cct: CCT


def _read_meta(f: BinFile) -> _Meta:
    gsz, gp = f.section(0)
    title = f.cstr(f.u64(gp, "pTitle"), gp, gp + gsz, "title")
    description = f.cstr(f.u64(gp + 8, "pDescription"), gp, gp + gsz, "description")
    isz, ip = f.section(1)
    pp_names = f.u64(ip, "ppNames")
    n_kinds = f.u8(ip + 8, "nKinds")
    ptrs = f.array(pp_names, "<u8", n_kinds, "identifier name pointers")
    id_names = [f.cstr(int(p), ip, ip + isz, "identifier name") for p in ptrs]
    ssz, sp = f.section(4)  # the common string table
    scopes, metrics = _read_metrics(f)
    modules, mod_base, mod_stride = _read_modules(f, sp, ssz)
    files, file_base, file_stride = _read_files(f, sp, ssz)
    mods = (mod_base, mod_stride, len(modules))
    fils = (file_base, file_stride, len(files))
    functions, fn_base, fn_stride = _read_functions(f, sp, ssz, mods, fils)
    cct = _read_tree(f, sp, ssz, (fn_base, fn_stride, len(functions)), fils, mods)
    return _Meta(title, description, id_names, scopes, metrics, modules, files, functions, cct)


def _read_metrics(f: BinFile) -> tuple[list[PropagationScope], list[Metric]]:
    msz, mp = f.section(2)
    lo, hi = mp, mp + msz
    p_metrics = f.u64(mp, "pMetrics")
    n_metrics = f.u32(mp + 8, "nMetrics")
    sz_metric = f.u8(mp + 0x0C, "szMetric")
    sz_inst = f.u8(mp + 0x0D, "szScopeInst")
    sz_summary = f.u8(mp + 0x0E, "szSummary")
    p_scopes = f.u64(mp + 0x10, "pScopes")
    n_scopes = f.u16(mp + 0x18, "nScopes")
    sz_scope = f.u8(mp + 0x1A, "szScope")
    sc = f.records(p_scopes, sz_scope, n_scopes,
                   {"name": ("<u8", 0), "type": ("u1", 8), "index": ("u1", 9)}, "scopes")
    scopes = []
    for r in sc:
        t = int(r["type"])
        if t > ScopeType.TRANSITIVE:
            raise FormatError(f.path, f"unknown propagation scope type {t} (expected 0..3)")
        scopes.append(PropagationScope(f.cstr(int(r["name"]), lo, hi, "scope name"),
                                       ScopeType(t), int(r["index"])))

    def scope_index(p: int) -> int:
        return int(index_of(np.array([p], np.uint64), p_scopes, sz_scope, n_scopes, f.path,
                            "propagation scope")[0])

    md = f.records(p_metrics, sz_metric, n_metrics,
                   {"name": ("<u8", 0), "insts": ("<u8", 8), "sums": ("<u8", 0x10),
                    "n_insts": ("<u2", 0x18), "n_sums": ("<u2", 0x1A)}, "metrics")
    metrics = []
    for r in md:
        insts = f.records(int(r["insts"]), sz_inst, int(r["n_insts"]),
                          {"scope": ("<u8", 0), "id": ("<u2", 8)}, "scope instances")
        sums = f.records(int(r["sums"]), sz_summary, int(r["n_sums"]),
                         {"scope": ("<u8", 0), "formula": ("<u8", 8), "combine": ("u1", 0x10),
                          "id": ("<u2", 0x12)}, "summary statistics")
        summaries = []
        for s in sums:
            c = int(s["combine"])
            if c > Combine.MAX:
                raise FormatError(f.path, f"unknown summary combine function {c} (expected 0..2)")
            summaries.append(SummaryStatistic(
                scope_index(int(s["scope"])), f.cstr(int(s["formula"]), lo, hi, "formula"),
                Combine(c), int(s["id"])))
        metrics.append(Metric(
            f.cstr(int(r["name"]), lo, hi, "metric name"),
            [ScopeInstance(scope_index(int(i["scope"])), int(i["id"])) for i in insts],
            summaries))
    return scopes, metrics


def _read_modules(f: BinFile, slo: int, ssz: int) -> tuple[list[LoadModule], int, int]:
    _, p = f.section(5)
    base, n, stride = f.u64(p, "pModules"), f.u32(p + 8, "nModules"), f.u16(p + 0xC, "szModule")
    rec = f.records(base, stride, n, {"flags": ("<u4", 0), "path": ("<u8", 8)}, "load modules")
    mods = [LoadModule(f.cstr(int(r["path"]), slo, slo + ssz, "module path"), int(r["flags"]))
            for r in rec]
    return mods, base, stride


def _read_files(f: BinFile, slo: int, ssz: int) -> tuple[list[SourceFile], int, int]:
    _, p = f.section(6)
    base, n, stride = f.u64(p, "pFiles"), f.u32(p + 8, "nFiles"), f.u16(p + 0xC, "szFile")
    rec = f.records(base, stride, n, {"flags": ("<u4", 0), "path": ("<u8", 8)}, "source files")
    files = [SourceFile(f.cstr(int(r["path"]), slo, slo + ssz, "file path"),
                        bool(int(r["flags"]) & 1), int(r["flags"])) for r in rec]
    return files, base, stride


def _read_functions(f: BinFile, slo: int, ssz: int, mods: tuple[int, int, int],
                    files: tuple[int, int, int]) -> tuple[list[Function], int, int]:
    _, p = f.section(7)
    base, n = f.u64(p, "pFunctions"), f.u32(p + 8, "nFunctions")
    stride = f.u16(p + 0xC, "szFunction")
    rec = f.records(base, stride, n, {"name": ("<u8", 0), "module": ("<u8", 8),
                                      "offset": ("<u8", 0x10), "file": ("<u8", 0x18),
                                      "line": ("<u4", 0x20), "flags": ("<u4", 0x24)}, "functions")
    mod_idx = index_of(rec["module"], *mods, f.path, "function's load module")
    file_idx = index_of(rec["file"], *files, f.path, "function's source file")
    funcs = []
    for k, r in enumerate(rec):
        pname = int(r["name"])
        funcs.append(Function(
            f.cstr(pname, slo, slo + ssz, "function name") if pname else "",
            int(mod_idx[k]), int(r["offset"]), int(file_idx[k]), int(r["line"]), int(r["flags"]),
            has_name=pname != 0))
    return funcs, base, stride


def _read_tree(f: BinFile, slo: int, ssz: int, fns: tuple[int, int, int],
               files: tuple[int, int, int], mods: tuple[int, int, int]) -> CCT:
    csz, cp = f.section(3)
    lo, hi = cp, cp + csz
    p_entries = f.u64(cp, "pEntryPoints")
    n_entries = f.u16(cp + 8, "nEntryPoints")
    sz_entry = f.u8(cp + 0xA, "szEntryPoint")
    ent = f.records(p_entries, sz_entry, n_entries,
                    {"sz": ("<u8", 0), "p": ("<u8", 8), "ctx": ("<u4", 0x10), "ep": ("<u2", 0x14),
                     "name": ("<u8", 0x18)}, "entry points")
    if n_entries and not (lo <= p_entries and p_entries + n_entries * sz_entry <= hi):
        raise FormatError(f.path, "entry points lie outside the context tree section", p_entries)
    max_records = csz // 0x20 + 1  # each context record takes at least 32 bytes

    # Level-by-level walk. Level 0 = root (implicit), level 1 = entry points.
    lvl_parent: list[I64] = [np.array([-1], np.int64)]
    lvl_offsets: list[I64] = [np.zeros(1, np.int64)]
    lvl_parent.append(np.zeros(n_entries, np.int64))
    lvl_offsets.append(p_entries + np.arange(n_entries, dtype=np.int64) * sz_entry)
    sizes = ent["sz"].astype(np.uint64)
    ptrs = ent["p"].astype(np.uint64)
    first_global = 1  # global (BFS) index of the first node of the current level
    total: int = 1 + n_entries
    ctx_words: list[npt.NDArray[np.uint64]] = []  # per level >= 2: the 4-word headers
    level_offsets_ctx: list[I64] = []
    while True:
        has = np.nonzero(sizes)[0]
        if len(has) == 0:
            break
        o, par_arr = _walk_children(f, ptrs[has].astype(np.int64),
                                    sizes[has].astype(np.int64), lo, hi,
                                    max_records - total)
        pars_np = first_global + has[par_arr]
        words = _gather_words(f, o, 4)
        ctx_words.append(words)
        level_offsets_ctx.append(o)
        lvl_parent.append(pars_np.astype(np.int64))
        lvl_offsets.append(o)
        first_global = total
        total += len(o)
        sizes = words[:, 0].astype(np.uint64)
        ptrs = words[:, 1].astype(np.uint64)

    n = total
    parent_bfs = np.concatenate(lvl_parent)
    level_sizes = [len(x) for x in lvl_parent]
    # Preorder positions: subtree sizes bottom-up, then positions top-down, level by level.
    bounds = np.concatenate([[0], np.cumsum(level_sizes)]).astype(np.int64)
    size = np.ones(n, dtype=np.int64)
    for lv in range(len(level_sizes) - 1, 1, -1):
        a, b = bounds[lv], bounds[lv + 1]
        # a level's parents all lie in the level above: a bincount over that level only
        pa, pb = bounds[lv - 1], bounds[lv]
        size[pa:pb] += np.bincount(parent_bfs[a:b] - pa, weights=size[a:b],
                                   minlength=int(pb - pa)).astype(np.int64)
    size[0] += int(size[bounds[1]:bounds[2]].sum()) if len(level_sizes) > 1 else 0
    pos = np.zeros(n, dtype=np.int64)
    for lv in range(1, len(level_sizes)):
        a, b = bounds[lv], bounds[lv + 1]
        lv_par = parent_bfs[a:b]
        sz = size[a:b]
        csum = np.cumsum(sz) - sz  # exclusive prefix over the level
        # siblings are contiguous (grouped by parent); subtract the group's first prefix
        first = np.r_[True, lv_par[1:] != lv_par[:-1]]
        grp_start = np.maximum.accumulate(np.where(first, np.arange(len(lv_par)), 0))
        pos[a:b] = pos[lv_par] + 1 + csum - csum[grp_start]
    order = np.empty(n, dtype=np.int64)
    order[pos] = np.arange(n, dtype=np.int64)  # order[preorder index] = bfs index

    # Decode fields in BFS order, then permute.
    ctx_id = np.zeros(n, np.uint32)
    kind = np.full(n, NodeKind.ROOT, np.uint8)
    relation = np.full(n, Relation.NONE, np.uint8)
    flags = np.zeros(n, np.uint8)
    func = np.full(n, -1, np.int64)
    file = np.full(n, -1, np.int64)
    line = np.zeros(n, np.uint32)
    mod = np.full(n, -1, np.int64)
    offset = np.zeros(n, np.uint64)
    propagation = np.zeros(n, np.uint16)
    entry_point = np.zeros(n, np.uint16)
    e_lo, e_hi = 1, 1 + n_entries
    ctx_id[e_lo:e_hi] = ent["ctx"]
    kind[e_lo:e_hi] = NodeKind.ENTRY
    entry_point[e_lo:e_hi] = ent["ep"]
    entry_names = {}
    if ctx_words:
        w = np.concatenate(ctx_words)
        o = np.concatenate(level_offsets_ctx)
        sl = slice(e_hi, n)
        w2 = w[:, 2]
        ctx_id[sl] = (w2 & 0xFFFFFFFF).astype(np.uint32)
        fl = ((w2 >> 32) & 0xFF).astype(np.uint8)
        rel = ((w2 >> 40) & 0xFF).astype(np.uint8)
        lex = ((w2 >> 48) & 0xFF).astype(np.uint8)
        nflex = ((w2 >> 56) & 0xFF).astype(np.int64)
        if np.any(rel > Relation.INLINED_CALL):
            raise FormatError(f.path, f"unknown context relation {int(rel.max())} (expected 0..2)")
        if np.any(lex > NodeKind.INSTRUCTION):
            raise FormatError(f.path, f"unknown lexical type {int(lex.max())} (expected 0..3)")
        flags[sl], relation[sl], kind[sl] = fl, rel, lex
        propagation[sl] = (w[:, 3] & 0xFFFF).astype(np.uint16)
        has_f = (fl & 1).astype(np.int64)
        has_s = ((fl >> 1) & 1).astype(np.int64)
        has_p = ((fl >> 2) & 1).astype(np.int64)
        need = has_f + 2 * has_s + 2 * has_p
        if np.any(need > nflex):
            bad = int(o[np.argmax(need > nflex)])
            raise FormatError(f.path, "context flags need more flex words than the record has",
                              bad)
        base_word = o // 8 + 4
        words_all = f.words

        def flex(present: I64, word: I64) -> npt.NDArray[np.uint64]:
            return np.where(present == 1, words_all[np.where(present == 1, word, 0)], 0
                            ).astype(np.uint64)

        pf = flex(has_f, base_word)
        pfile = flex(has_s, base_word + has_f)
        pline = flex(has_s, base_word + has_f + 1) & np.uint64(0xFFFFFFFF)
        pmod = flex(has_p, base_word + has_f + 2 * has_s)
        poff = flex(has_p, base_word + has_f + 2 * has_s + 1)
        func[sl] = index_of(pf, *fns, f.path, "context's function")
        file[sl] = index_of(pfile, *files, f.path, "context's file")
        mod[sl] = index_of(pmod, *mods, f.path, "context's load module")
        line[sl] = pline.astype(np.uint32)
        offset[sl] = poff
    for k in range(n_entries):
        pn = int(ent["name"][k])
        entry_names[int(pos[1 + k])] = f.cstr(pn, slo, slo + ssz, "entry point name")
    if np.any(ctx_id[1:] == 0):
        raise FormatError(f.path, "a context has identifier 0, which is reserved for the global "
                          "context")
    return CCT(
        ctx_id=ctx_id[order], parent=np.where(parent_bfs[order] >= 0,
                                               pos[np.maximum(parent_bfs[order], 0)], -1),
        kind=kind[order], relation=relation[order], flags=flags[order], function=func[order],
        file=file[order], line=line[order], module=mod[order], offset=offset[order],
        propagation=propagation[order], entry_point=entry_point[order],
        entry_names=entry_names,
        depth=np.repeat(np.arange(len(level_sizes), dtype=np.int64), level_sizes)[order],
        subtree_end=(pos + size)[order],
    )


SERIAL_TAIL = 16  # arrays still being walked when the walk goes on one array at a time


def _walk_children(f: BinFile, start: I64, size: I64, lo: int, hi: int, room: int
                   ) -> tuple[I64, I64]:
    """The records of many children arrays: ``(offsets, array index of each)``, grouped
    by array in array order, each array's records in file order.

    Records have variable length (32 bytes plus 8 per flex word, the count at byte 0x17),
    so an array must be walked record by record; all arrays of a level are walked together,
    one vectorised step per record rank. When only a few long arrays remain (a node with
    very many children), they are finished one at a time, which costs what a loop costs."""
    end = start + size
    bad = (start < lo) | (end > hi) | (start % 8 != 0)
    if bad.any():
        k = int(np.argmax(bad))
        raise FormatError(f.path, f"children array [{int(start[k]):#x}, {int(end[k]):#x}) is "
                          "outside the context tree section or misaligned", int(start[k]))
    buf = f.buf
    cur = start.copy()
    act = np.arange(len(start), dtype=np.int64)
    got_off: list[I64] = []
    got_arr: list[I64] = []
    count = 0
    while len(act) > SERIAL_TAIL:
        o = cur[act]
        e = end[act]
        if np.any(o + 0x20 > e):
            raise FormatError(f.path, "context record overruns its children array",
                              int(o[np.argmax(o + 0x20 > e)]))
        got_off.append(o)
        got_arr.append(act)
        count += len(o)
        if count > room:
            raise FormatError(f.path, "context tree has more records than its section can "
                              "hold (a cycle in the children pointers?)", int(o[0]))
        nxt = o + 0x20 + (buf[o + 0x17].astype(np.int64) << 3)
        if np.any(nxt > e):
            raise FormatError(f.path, "context record overruns its children array",
                              int(nxt[np.argmax(nxt > e)]))
        cur[act] = nxt
        act = act[nxt < e]
    for k in act.tolist():  # the few long arrays left
        off, stop = int(cur[k]), int(end[k])
        offs: list[int] = []
        while off < stop:
            offs.append(off)
            if off + 0x20 > stop:
                raise FormatError(f.path, "context record overruns its children array", off)
            off += 0x20 + (int(buf[off + 0x17]) << 3)
        if off != stop:
            raise FormatError(f.path, "context record overruns its children array", off)
        count += len(offs)
        if count > room:
            raise FormatError(f.path, "context tree has more records than its section can "
                              "hold (a cycle in the children pointers?)", int(start[k]))
        got_off.append(np.asarray(offs, dtype=np.int64))
        got_arr.append(np.full(len(offs), k, dtype=np.int64))
    if not got_off:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    offs_all = np.concatenate(got_off)
    arr_all = np.concatenate(got_arr)
    order = np.argsort(arr_all, kind="stable")  # by array, rank order kept within one
    return offs_all[order], arr_all[order]


def _gather_words(f: BinFile, offsets: I64, count: int) -> npt.NDArray[np.uint64]:
    """The first ``count`` u64 words of each record (records are 8-byte aligned)."""
    if len(offsets) == 0:
        return np.zeros((0, count), np.uint64)
    words = f.words
    idx = (offsets // 8)[:, None] + np.arange(count)[None, :]
    if int(idx.max()) >= len(words):
        raise FormatError(f.path, "context record lies past the end of the file",
                          int(offsets.max()))
    return np.asarray(words[idx], dtype=np.uint64)


# ---- profile.db ------------------------------------------------------------------------


def _read_profiles(f: BinFile) -> tuple[list[ExecutionContext], Callable[[int], ProfileBlock]]:
    _, pi = f.section(0)
    _, _ = f.section(1)
    base, n = f.u64(pi, "pProfiles"), f.u32(pi + 8, "nProfiles")
    stride = f.u8(pi + 0xC, "szProfile")
    rec = f.records(base, stride, n, {"n_values": ("<u8", 0), "p_values": ("<u8", 8),
                                      "n_ctxs": ("<u4", 0x10), "p_ctxs": ("<u8", 0x18),
                                      "id_tuple": ("<u8", 0x20), "flags": ("<u4", 0x28)},
                    "profile infos")
    if n == 0:
        raise FormatError(f.path, "no profiles: expected at least the summary profile")
    profiles = []
    for k, r in enumerate(rec):
        flg = int(r["flags"])
        ids: list[Identifier] = []
        pt = int(r["id_tuple"])
        if pt:
            n_ids = f.u16(pt, "identifier tuple length")
            idr = f.records(pt + 8, 16, n_ids, {"kind": ("u1", 0), "flags": ("<u2", 2),
                                                "logical": ("<u4", 4), "physical": ("<u8", 8)},
                            "identifier tuple")
            ids = [Identifier(int(i["kind"]), int(i["logical"]), int(i["physical"]),
                              int(i["flags"])) for i in idr]
        profiles.append(ExecutionContext(k, tuple(ids), bool(flg & 1), flg))
    if not profiles[0].is_summary:
        raise FormatError(f.path, "profile 0 is not a summary profile", base)

    def load(k: int) -> ProfileBlock:
        r = rec[k]
        nv, pv, nc, pc = int(r["n_values"]), int(r["p_values"]), int(r["n_ctxs"]), int(r["p_ctxs"])
        if nv == 0 and nc == 0:
            return ProfileBlock.empty()
        vals = f.array(pv, PROFILE_VALUE, nv, f"values of profile {k}")
        idx = f.array(pc, PROFILE_INDEX, nc, f"context index of profile {k}")
        starts = idx["start"]
        _check_csr(f, starts, nv, pc, f"profile {k}")
        return ProfileBlock(idx["ctx"], starts, vals["metric"], vals["value"])

    return profiles, load


def _check_csr(f: BinFile, starts: npt.NDArray[np.uint64], n_values: int, where: int,
               what: str) -> None:
    if len(starts) == 0:
        if n_values:
            raise FormatError(f.path, f"{what}: {n_values} values but an empty index", where)
        return
    if int(starts[0]) != 0 or np.any(np.diff(starts.astype(np.int64)) < 0) \
            or int(starts[-1]) > n_values:
        raise FormatError(f.path, f"{what}: start indices are not sorted within 0..{n_values}",
                          where)


# ---- cct.db ----------------------------------------------------------------------------


def _read_contexts(f: BinFile, n_profiles: int) -> tuple[int, Callable[[int], ContextBlock]]:
    _, cp = f.section(0)
    base, n = f.u64(cp, "pCtxs"), f.u32(cp + 8, "nCtxs")
    stride = f.u8(cp + 0xC, "szCtx")
    rec = f.records(base, stride, n, {"n_values": ("<u8", 0), "p_values": ("<u8", 8),
                                      "n_metrics": ("<u2", 0x10), "p_metrics": ("<u8", 0x18)},
                    "context infos")

    def load(c: int) -> ContextBlock:
        r = rec[c]
        nv, pv = int(r["n_values"]), int(r["p_values"])
        nm, pm = int(r["n_metrics"]), int(r["p_metrics"])
        if nv == 0 and nm == 0:
            return ContextBlock.empty()
        vals = f.array(pv, CONTEXT_VALUE, nv, f"values of context {c}")
        idx = f.array(pm, CONTEXT_INDEX, nm, f"metric index of context {c}")
        _check_csr(f, idx["start"], nv, pm, f"context {c}")
        return ContextBlock(idx["metric"], idx["start"], vals["prof"], vals["value"])

    return n, load


# ---- trace.db --------------------------------------------------------------------------


def _read_traces(f: BinFile) -> Traces:
    _, tp = f.section(0)
    base, n = f.u64(tp, "pTraces"), f.u32(tp + 8, "nTraces")
    stride = f.u8(tp + 0xC, "szTrace")
    tmin, tmax = f.u64(tp + 0x10, "minTimestamp"), f.u64(tp + 0x18, "maxTimestamp")
    rec = f.records(base, stride, n, {"prof": ("<u4", 0), "start": ("<u8", 8),
                                      "end": ("<u8", 0x10)}, "trace headers")
    lines = []
    for k, r in enumerate(rec):
        start, end = int(r["start"]), int(r["end"])
        if end < start or (end - start) % TRACE_ELEM.itemsize:
            raise FormatError(f.path, f"trace {k}: [{start:#x}, {end:#x}) is not a whole number "
                              "of 12-byte elements", start)
        el = f.array(start, TRACE_ELEM, (end - start) // TRACE_ELEM.itemsize, f"trace {k}")
        lines.append(TraceLine(int(r["prof"]), el["time"], el["ctx"]))
    return Traces(tmin, tmax, lines)
