"""The line × context matrix of PerfVisS (seeds/003): the cost of every source line in every
execution context, for one metric, built once per (database, metric, grouping, selection).

Rows form one long *line axis*: the files in the Flat view's default order (load modules by
cost, descending, then each module's files by cost), and within a file every line of the
source when the file can be read (zero lines included, so that a window of the axis aligns
with the listing), else only the lines the database knows, with ``gap_before`` marking where
lines are missing. Columns are execution contexts ordered by their identifiers, or groups of
them (``group="rank"`` sums the threads of each rank, ``"node"`` the ranks of each node).

A cell is the exclusive ("function" scope) value of the line scopes at that (file, line), over
all calling contexts, in that context: exactly what the Flat view's line scopes sum, split by
context. GPU operations are the one addition: a kernel, copy or synchronisation is measured on
a procedure scope below its placeholder (``<gpu kernel>`` > ``kernmain()``, ``<gpu copyin>``)
and has no line of its own, so its cost is charged to the nearest line scope above it, the
line that launched it (the call site the tree shows above the placeholder); a kernel's own
source lines (instruction-level GPU metrics) keep their rows. Without that charge the Lines
tab of a GPU database was empty for GPU time (:func:`launch_charges`).

The matrix is built in one vectorised pass over the per-context sparse values: each profile's
values for the metric are mapped context id → axis row by one lookup array, the (row, column,
value) triples are ordered by row with a two-pass 16-bit radix sort (numpy's
stable sort of uint16 keys) and duplicates summed with ``reduceat``. Only rows with cost are
stored (CSR); dense arrays exist only for the windows asked for (:func:`window`).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from callpath.analysis.source import point_from_inclusive, select_contexts
from callpath.errors import CallpathError
from callpath.model import Experiment, Metric, NodeKind, Relation
from callpath.model.contexts import ExecutionContext, node_texts
from callpath.model.gpu_names import GPU_PLACEHOLDERS
from callpath.model.treeops import nearest_marked

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
Bool = npt.NDArray[np.bool_]

GROUPS = ("none", "rank", "node")
_KEEP_KINDS = {"rank": ("NODE", "RANK"), "node": ("NODE",)}
MAX_SOURCE_BYTES = 64 << 20


@dataclass
class LineMatrix:
    """M[line, context] for one metric. Axis arrays have one element per row (``n_rows``);
    the values are CSR over the rows that have a nonzero value (``nz_rows``, sorted).

    - ``files[i]``: recorded path of axis file ``i`` (a copy's ``src/...`` path inside the
      database); ``file_labels[i]``: the path it was measured at, which the CLI prints and
      ``--file`` matches; ``file_ids[i]`` its index in ``exp.files``;
      ``file_start[i]:file_start[i+1]`` its rows; ``readable[i]`` whether the source was read
      (then every line of it is a row); ``source_paths[i]`` the file read.
    - ``file_of_row``, ``line_of_row``: axis file index and line number of each row;
      ``known``: the database has a line scope there (cost or not); ``gap_before``: lines of
      the file missing just before this row (0 where the source was read).
    - ``labels`` / ``short_labels``: one per column; ``column_profiles[c]``: the profile
      indices (``exp.profiles``) summed into column ``c``.
    - ``row_sum``: total of each row (dense, all rows); ``total``: the sum of all cells.
    - ``row_proc``: procedure index (into ``procedures``) owning each row, -1 if none;
      ``procedures``: names; ``proc_file``: axis file of each procedure.
    - ``launch``: the rows that hold the cost of GPU operations they launched
      (:func:`launch_charges`); all False in a database without GPU operations.
    """

    metric: str
    group: str
    files: list[str]
    file_ids: I64
    file_start: I64
    readable: list[bool]
    source_paths: list[Path | None]
    file_of_row: I32
    line_of_row: I64
    known: Bool
    gap_before: I64
    labels: list[str]
    short_labels: list[str]
    column_profiles: list[list[int]]
    nz_rows: I64
    indptr: I64
    cols: I32
    vals: F64
    row_sum: F64
    row_proc: I64
    procedures: list[str]
    proc_file: I64
    proc_function: I64
    database: str = ""
    file_labels: list[str] = field(default_factory=list)
    launch: Bool = field(default_factory=lambda: np.zeros(0, bool))
    _charge_from: I64 = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    _charge_to: I64 = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    _row_of_key: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)
    _node_rows: I64 = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def n_rows(self) -> int:
        return len(self.line_of_row)

    @property
    def n_cols(self) -> int:
        return len(self.labels)

    @property
    def total(self) -> float:
        return float(self.row_sum.sum())

    def has_cost(self) -> Bool:
        """Whether each row has a nonzero value in some context."""
        out = np.zeros(self.n_rows, dtype=bool)
        out[self.nz_rows] = True
        return out

    def entries(self, start_row: int, end_row: int) -> tuple[I64, I32, F64]:
        """The stored (row, column, value) triples of rows ``start_row <= row < end_row``."""
        a, b = np.searchsorted(self.nz_rows, [start_row, end_row])
        lo, hi = int(self.indptr[a]), int(self.indptr[b])
        counts = np.diff(self.indptr[a:b + 1])
        return np.repeat(self.nz_rows[a:b], counts), self.cols[lo:hi], self.vals[lo:hi]

    def node_rows(self) -> I64:
        """Axis row of every node of the experiment's tree that is a line scope (-1 else)."""
        return self._node_rows

    def charged(self, exclusive: F64) -> F64:
        """Per-node exclusive values (indexed by tree node) with the GPU operations' values
        added to their launch lines (:func:`launch_charges`): what each line scope holds in
        this matrix."""
        if not len(self._charge_from):
            return exclusive
        out = np.array(exclusive, dtype=np.float64)
        np.add.at(out, self._charge_to, out[self._charge_from])
        return out


# ---- building ---------------------------------------------------------------------------

_CACHE: dict[int, dict[tuple[Any, ...], LineMatrix]] = {}
_CACHE_LOCK = threading.Lock()


def build_line_matrix(exp: Experiment, metric: str | int | Metric = 0, group: str = "none",
                      contexts: str | Sequence[int] | None = None, *,
                      contexts_regex: bool = False) -> LineMatrix:
    """The line × context matrix of ``metric`` (name, prefix or index, as ``report -m``).

    ``group``: ``none`` (one column per execution context), ``rank`` (threads of each rank
    summed) or ``node`` (ranks of each node summed). ``contexts``: the Thread view's
    selection (a label pattern as ``report --threads``, regular expression with
    ``contexts_regex``) or a list of profile indices. Cached per experiment object."""
    if group not in GROUPS:
        raise CallpathError(f"grouping {group!r}: expected one of {', '.join(GROUPS)}")
    m = metric if isinstance(metric, Metric) else exp.metric(metric)
    if isinstance(contexts, str):
        profiles = select_contexts(exp, contexts, regex=contexts_regex)
        if not profiles:
            labels = ", ".join(exp.context_label(c) for c in exp.contexts[:8])
            raise CallpathError(f"context selection {contexts!r} selects no execution context "
                                f"(they are: {labels}{', ...' if len(exp.contexts) > 8 else ''})")
    elif contexts is None:
        profiles = [c.index for c in exp.contexts]
    else:
        profiles = [int(p) for p in contexts]
        bad = [p for p in profiles
               if not 0 <= p < len(exp.profiles) or exp.profiles[p].is_summary]
        if bad:
            raise CallpathError(f"execution context index {bad[0]} is not a measured context "
                                f"(expected 1..{len(exp.profiles) - 1})")
    if not profiles:
        raise CallpathError("the database has no execution contexts (no per-context values)")
    key = (m.name, group, tuple(profiles))
    with _CACHE_LOCK:
        per = _CACHE.get(id(exp))
        if per is not None and key in per:
            return per[key]
    mat = _build(exp, m, group, profiles)
    with _CACHE_LOCK:
        if id(exp) not in _CACHE:
            _CACHE[id(exp)] = {}
            weakref.finalize(exp, _CACHE.pop, id(exp), None)
        _CACHE[id(exp)][key] = mat
    return mat


def _columns(exp: Experiment, profiles: list[int], group: str
             ) -> tuple[list[str], list[str], list[list[int]]]:
    """Column labels and the profiles of each column, ordered by identifiers."""
    names = exp.id_names
    ctxs: list[ExecutionContext] = [exp.profiles[p] for p in profiles]

    def ident_key(c: ExecutionContext) -> tuple[tuple[int, int, int], ...]:
        return tuple((i.kind, i.logical_id, i.physical_id) for i in c.ids)

    ctxs.sort(key=ident_key)
    if group == "none":
        return ([exp.context_label(c) for c in ctxs], [c.short_label(names) for c in ctxs],
                [[c.index] for c in ctxs])
    keep = {k for k, n in enumerate(names) if n in _KEEP_KINDS[group]}
    groups: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for c in ctxs:
        gk = tuple((i.kind, i.logical_id) for i in c.ids if i.kind in keep)
        groups.setdefault(gk, []).append(c.index)
    labels, shorts = [], []
    nodes = node_texts(exp.profiles, names)  # a host id in hex, left out when one node
    for gk in groups:
        lab = " ".join(f"{names[k] if k < len(names) else f'KIND{k}'} {nodes.get(v, v)}"
                       for k, v in gk if not (k < len(names) and names[k] == "NODE"
                                           and nodes.get(v) == ""))
        labels.append(lab or "all")
        short = ".".join(str(v) for k, v in gk if names[k] != "NODE") if gk else "all"
        shorts.append(short or lab)
    return labels, shorts, list(groups.values())


def _source_path(exp: Experiment, file_index: int) -> Path | None:
    """The readable file for a recorded source (the database's ``src/`` copy, which must stay
    inside the database directory, or the recorded absolute path), None when there is none."""
    f = exp.files[file_index]
    rec = f.path
    if not rec or "\x00" in rec:
        return None
    p = Path(rec)
    if f.copied or not p.is_absolute():
        if exp.path is None:
            return None
        root = Path(exp.path)
        root = (root if root.is_dir() else root.parent).resolve()
        if p.is_absolute():
            p = Path(*p.parts[1:])
        cand = (root / p).resolve()
        try:
            cand.relative_to(root)
        except ValueError:
            return None
    else:
        cand = p.resolve()
    try:
        if cand.is_file() and os.access(cand, os.R_OK) and cand.stat().st_size <= MAX_SOURCE_BYTES:
            return cand
    except OSError:
        return None
    return None


def _count_lines(path: Path) -> int:
    data = path.read_bytes()
    n = data.count(b"\n")
    return n + (1 if data and not data.endswith(b"\n") else 0)


def _line_nodes(exp: Experiment) -> tuple[I64, I64]:
    """The line scopes of the tree (nodes of kind LINE with a file) and the procedure frame or
    inlined function that encloses each (-1 when none)."""
    cct = exp.cct
    idx = np.nonzero((cct.kind == NodeKind.LINE) & (cct.file >= 0))[0].astype(np.int64)
    is_fn = cct.kind == NodeKind.FUNCTION
    owner = nearest_marked(cct.parent, is_fn)
    return idx, owner[idx]


class LaunchCharges(NamedTuple):
    """GPU operations' tree nodes charged to line scopes (:func:`launch_charges`)."""

    nodes: I64  # the operations' nodes that are not line scopes
    lines: I64  # the line scope of each, whose row gets its cost
    launching: Bool  # whether that line lies outside every operation (it launched it)


def launch_charges(exp: Experiment, is_line: Bool) -> LaunchCharges:
    """The tree nodes of GPU operations that are not line scopes (the placeholders
    ``<gpu kernel>``, ``<gpu copyin>`` ... and the procedure scopes below them) and, for
    each, the line scope (``is_line``) whose row gets its cost: the nearest one above it,
    which is the line that launched the operation unless the operation has source lines of
    its own between (a kernel's lines, for instruction-level metrics); a line scope of line
    0 is passed over. Nodes with no line scope above them (an application thread's
    unstructured frames) are left out. Two linear passes, and none at all in a database
    without GPU placeholders."""
    empty = np.zeros(0, np.int64)
    none = LaunchCharges(empty, empty, np.zeros(0, bool))
    names = set(GPU_PLACEHOLDERS.values())
    placeholder_fns = [i for i, f in enumerate(exp.functions) if f.name in names]
    if not placeholder_fns:
        return none
    cct = exp.cct
    is_ph = (cct.kind == NodeKind.FUNCTION) & np.isin(cct.function, placeholder_fns)
    starts = np.flatnonzero(is_ph)
    if not len(starts):
        return none
    # inside a placeholder's subtree (itself included): [node, subtree_end) intervals in
    # preorder, counted by one cumulative sum
    depth = np.zeros(len(cct) + 1, np.int64)
    np.add.at(depth, starts, 1)
    np.add.at(depth, cct.subtree_end[starts], -1)
    under = np.cumsum(depth[:-1]) > 0
    # a line 0 (hpcprof's "[libcudart.so]:0" inside the runtime's launch call) says no line:
    # the launch goes on up to the line that called the runtime
    near = nearest_marked(cct.parent, is_line & (cct.line > 0))
    nodes = np.flatnonzero(under & ~is_line & (near >= 0)).astype(np.int64)
    lines = near[nodes]
    return LaunchCharges(nodes, lines, ~under[lines])


def _stable_row_order(rows: npt.NDArray[Any], n_rows: int) -> I64:
    """A stable argsort of row numbers: LSD radix on 16-bit digits (numpy sorts uint16 keys
    with a radix sort), much faster than a comparison sort of 10^7 int64 keys."""
    if n_rows <= 1 << 16:
        return np.argsort(rows.astype(np.uint16, copy=False), kind="stable")
    order = np.argsort((rows & 0xFFFF).astype(np.uint16), kind="stable")
    shift = 16
    while (n_rows - 1) >> shift:
        digit = ((rows[order] >> shift) & 0xFFFF).astype(np.uint16)
        order = order[np.argsort(digit, kind="stable")]
        shift += 16
    return order.astype(np.int64)


def _exclusive_per_profile(exp: Experiment, m: Metric, p: int
                           ) -> tuple[npt.NDArray[Any], F64] | None:
    """(context ids, values) of the metric's exclusive values in profile ``p``: the stored
    "function" scope, else derived from the inclusive ("execution") values."""
    fid = m.prop_id(exp.scopes, "function")
    if fid is not None:
        blk = exp.values[p]
        mids = np.asarray(blk.metric_ids)
        if len(mids) and int(mids.min()) == fid == int(mids.max()):  # one metric: no gather
            return blk.ctx_of_values(), np.asarray(blk.values)
        sel = mids == fid
        return blk.ctx_of_values()[sel], np.asarray(blk.values)[sel]
    if m.prop_id(exp.scopes, "execution") is None:
        return None
    incl = exp.values_in(p, m, "execution")
    excl = exp.cct.exclusive(point_from_inclusive(exp.cct, incl))
    nz = np.nonzero(excl)[0]
    return exp.cct.ctx_id[nz].astype(np.int64), excl[nz]


def _build(exp: Experiment, m: Metric, group: str, profiles: list[int]) -> LineMatrix:
    cct = exp.cct
    labels, shorts, col_profiles = _columns(exp, profiles, group)
    nodes, owner = _line_nodes(exp)
    nfile = cct.file[nodes].astype(np.int64)
    nline = cct.line[nodes].astype(np.int64)
    is_line = np.zeros(len(cct), bool)
    is_line[nodes] = True
    gpu_nodes, gpu_lines, launching = launch_charges(exp, is_line)

    # ---- procedures: the innermost function (frame or inlined) around each line scope ----
    fn_of = np.where(owner >= 0, cct.function[np.maximum(owner, 0)], -1)
    # canonical: same name, module, file and line is one procedure (hpcprof writes copies)
    fkeys: dict[tuple[str, int, int, int], int] = {}
    canon = np.full(len(exp.functions) + 1, -1, dtype=np.int64)
    proc_names: list[str] = []
    proc_fn: list[int] = []
    used = np.unique(fn_of[fn_of >= 0])
    for f in used.tolist():
        fd = exp.functions[f]
        k = (fd.name, fd.module, fd.file, fd.line)
        if k not in fkeys:
            fkeys[k] = len(proc_names)
            proc_names.append(fd.name or f"<unknown procedure {fd.offset:#x}>")
            proc_fn.append(f)
        canon[f] = fkeys[k]
    node_proc = canon[np.where(fn_of >= 0, fn_of, len(exp.functions))]

    # ---- files in the Flat view's order, sorted as it sorts by default: load modules by
    # cost, descending, and within each module its files by cost, descending (the cost of
    # the metric's line scopes over all contexts: what the file's rows sum to). A file goes
    # with the first module (by index) of a procedure enclosing its lines; ties keep the
    # table order (module, then file index). By path instead, a Python program's own file
    # came after every library file of the interpreter's prefix.
    fmod = np.array([f.module for f in exp.functions] + [-1], dtype=np.int64)
    nmod = np.where(fn_of >= 0, fmod[np.where(fn_of >= 0, fn_of, len(exp.functions))], -1)
    s_ex = _summary_exclusive(exp, m, nodes, gpu_nodes, gpu_lines)
    file_list: list[int] = []
    if len(nodes):
        big = np.int64(len(exp.files) + 1)
        key = np.where(nmod >= 0, nmod, np.int64(1 << 40)) * big + nfile
        ufile, inv = np.unique(nfile, return_inverse=True)
        best = np.full(len(ufile), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(best, inv, key)
        umod = best // big  # each file's module (1 << 40: no enclosing procedure)
        fcost = np.bincount(inv, weights=s_ex, minlength=len(ufile))
        mods, minv = np.unique(umod, return_inverse=True)
        mcost = np.bincount(minv, weights=fcost, minlength=len(mods))[minv]
        # unknown modules last, whatever their cost; then modules by cost, files by cost
        file_list = ufile[np.lexsort((ufile, -fcost, umod, -mcost,
                                      umod == np.int64(1 << 40)))].tolist()

    # ---- the axis ----------------------------------------------------------------------
    files, readable, paths = [], [], []
    starts = [0]
    f_rows: list[I64] = []
    f_gap: list[I64] = []
    f_known: list[Bool] = []
    order = np.lexsort((nline, nfile)) if len(nodes) else np.zeros(0, np.int64)
    sf = nfile[order]
    sl = nline[order]
    bounds = np.searchsorted(sf, np.asarray(file_list, dtype=np.int64))
    ends = np.searchsorted(sf, np.asarray(file_list, dtype=np.int64), side="right")
    for fi, f in enumerate(file_list):
        known_lines = np.unique(sl[bounds[fi]:ends[fi]])
        path = _source_path(exp, f)
        n_src = 0
        if path is not None:
            try:
                n_src = _count_lines(path)
            except OSError:
                path = None
        if path is not None:
            rows = np.union1d(np.arange(1, n_src + 1, dtype=np.int64), known_lines)
            gap = np.zeros(len(rows), np.int64)
        else:
            rows = known_lines
            gap = np.zeros(len(rows), np.int64)
            if len(rows):
                gap[0] = max(int(rows[0]) - 1, 0)
                gap[1:] = np.diff(rows) - 1
        files.append(exp.files[f].path)
        readable.append(path is not None)
        paths.append(path)
        f_rows.append(rows)
        f_gap.append(gap)
        f_known.append(np.isin(rows, known_lines, assume_unique=True))
        starts.append(starts[-1] + len(rows))
    n_rows = starts[-1]
    line_of_row = np.concatenate(f_rows) if f_rows else np.zeros(0, np.int64)
    file_start = np.asarray(starts, dtype=np.int64)
    file_of_row = np.repeat(np.arange(len(files), dtype=np.int32), np.diff(file_start))

    # row of every line node: position of (file, line) on the axis
    pos_of_file = np.full(len(exp.files) + 1, -1, dtype=np.int64)
    pos_of_file[np.asarray(file_list, dtype=np.int64)] = np.arange(len(file_list))
    node_row = np.full(len(nodes), -1, dtype=np.int64)
    if len(nodes):
        af = pos_of_file[nfile]
        seg_lo = file_start[af]
        seg_hi = file_start[af + 1]
        # lines are sorted within each file's segment: one searchsorted per node, vectorised
        # by offsetting each file's lines into a disjoint key range
        span = np.int64(int(line_of_row.max()) + 2 if n_rows else 1)
        axis_key = file_of_row.astype(np.int64) * span + line_of_row
        node_row = np.searchsorted(axis_key, af * span + nline)
        assert np.all((node_row >= seg_lo) & (node_row < seg_hi))
    all_node_rows = np.full(len(cct), -1, dtype=np.int64)
    all_node_rows[nodes] = node_row

    # ---- values: per column, one bincount over the rows that have line scopes (their
    # ranks: duplicates of a row within the column are summed there, and its nonzeros come
    # out sorted by row); then one stable sort of the ranks turns the columns into rows
    scope_rows = np.unique(node_row)  # axis rows that have line scopes, sorted
    n_scope = len(scope_rows)
    # contexts that are not line scopes count into one extra bin, dropped afterwards: no
    # mask or gather per profile
    ctx_rank = np.full(max(exp.n_ctx_slots, int(cct.ctx_id.max()) + 1), n_scope,
                       dtype=np.int64)
    ctx_rank[cct.ctx_id[nodes].astype(np.int64)] = np.searchsorted(scope_rows, node_row)
    # a GPU operation's contexts count into its launch line's bin
    ctx_rank[cct.ctx_id[gpu_nodes].astype(np.int64)] = ctx_rank[
        cct.ctx_id[gpu_lines].astype(np.int64)]
    r_parts: list[npt.NDArray[Any]] = []
    v_parts: list[F64] = []
    counts = np.zeros(len(col_profiles), dtype=np.int64)
    rank_dtype = np.uint16 if n_scope <= 1 << 16 else np.int64
    for c, profs in enumerate(col_profiles):
        acc = np.zeros(n_scope + 1, dtype=np.float64)
        for p in profs:
            got = _exclusive_per_profile(exp, m, p)
            if got is None:
                raise CallpathError(f"metric {m.name!r} has no per-context values")
            ctx, v = got
            if len(ctx) and int(ctx.max()) >= len(ctx_rank):
                ok = ctx < len(ctx_rank)
                ctx, v = ctx[ok], v[ok]
            acc += np.bincount(ctx_rank[ctx], weights=v, minlength=n_scope + 1)
        acc = acc[:n_scope]
        nz = np.flatnonzero(acc)
        r_parts.append(nz.astype(rank_dtype))
        v_parts.append(acc[nz])
        counts[c] = len(nz)
    ranks = np.concatenate(r_parts) if r_parts else np.zeros(0, rank_dtype)
    vals = np.concatenate(v_parts) if v_parts else np.zeros(0, np.float64)
    colv = np.repeat(np.arange(len(col_profiles), dtype=np.int32), counts)
    del r_parts, v_parts
    if len(ranks):
        o = _stable_row_order(ranks.astype(np.int64) if rank_dtype != np.uint16 else ranks,
                              n_scope)
        ranks, colv, vals = ranks[o], colv[o], vals[o]
        del o
    per_rank = np.bincount(ranks.astype(np.int64), minlength=n_scope) if len(ranks) else \
        np.zeros(n_scope, np.int64)
    has_rows = per_rank > 0
    nz_rows = scope_rows[has_rows].astype(np.int64)
    indptr = np.zeros(len(nz_rows) + 1, dtype=np.int64)
    np.cumsum(per_rank[has_rows], out=indptr[1:])
    row_sum = np.zeros(n_rows, dtype=np.float64)
    if len(nz_rows):
        row_sum[nz_rows] = np.add.reduceat(vals, indptr[:-1])

    # ---- which procedure owns each row: the one with the largest cost there (else the first
    # scope's), so that a line shared by two procedures is listed under one of them
    row_proc = np.full(n_rows, -1, dtype=np.int64)
    has = (node_proc >= 0)
    if has.any():
        tot = np.zeros(len(cct))
        tot[nodes] = s_ex
        w = tot[nodes][has]
        o2 = np.lexsort((-w, node_row[has]))
        rr = node_row[has][o2]
        pp = node_proc[has][o2]
        firsts = np.ones(len(rr), dtype=bool)
        firsts[1:] = rr[1:] != rr[:-1]
        row_proc[rr[firsts]] = pp[firsts]
    proc_file = np.full(len(proc_names), -1, dtype=np.int64)
    if len(proc_names):
        # a procedure's file: its declared file when on the axis, else its first row's
        pf = np.array([exp.functions[f].file for f in proc_fn], dtype=np.int64)
        proc_file = np.where(pf >= 0, pos_of_file[np.maximum(pf, 0)], -1)
        first_row = np.full(len(proc_names), n_rows, dtype=np.int64)
        ok = row_proc >= 0
        np.minimum.at(first_row, row_proc[ok], np.nonzero(ok)[0])
        fallback = np.where(first_row < n_rows, file_of_row[np.minimum(first_row,
                                                                       max(n_rows - 1, 0))]
                            if n_rows else -1, -1)
        proc_file = np.where(proc_file >= 0, proc_file, fallback)

    launch = np.zeros(n_rows, bool)
    launch[all_node_rows[gpu_lines[launching]]] = True
    return LineMatrix(
        metric=m.name, group=group, files=files, file_ids=np.asarray(file_list, np.int64),
        file_start=file_start, readable=readable, source_paths=paths,
        file_of_row=file_of_row, line_of_row=line_of_row,
        known=np.concatenate(f_known) if f_known else np.zeros(0, bool),
        gap_before=np.concatenate(f_gap) if f_gap else np.zeros(0, np.int64),
        labels=labels, short_labels=shorts, column_profiles=col_profiles,
        nz_rows=nz_rows, indptr=indptr, cols=colv.astype(np.int32), vals=vals,
        row_sum=row_sum, row_proc=row_proc, procedures=proc_names,
        proc_file=proc_file.astype(np.int64), proc_function=np.asarray(proc_fn, np.int64),
        database=str(exp.path or ""), _node_rows=all_node_rows,
        file_labels=[exp.files[f].original for f in file_list], launch=launch,
        _charge_from=gpu_nodes, _charge_to=gpu_lines)


def _summary_exclusive(exp: Experiment, m: Metric, nodes: I64, gpu_nodes: I64,
                       gpu_lines: I64) -> F64:
    """Exclusive summary values of the line nodes, GPU operations charged to their launch
    lines (to order files and pick a row's owner procedure); zeros when the summary has
    none."""
    try:
        excl = exp.exclusive(m)
    except CallpathError:
        return np.zeros(len(nodes))
    if len(gpu_nodes):
        excl = np.array(excl, dtype=np.float64)
        np.add.at(excl, gpu_lines, excl[gpu_nodes])
    return np.asarray(excl[nodes], dtype=np.float64)


# ---- reading the matrix ---------------------------------------------------------------

def window(m: LineMatrix, start_row: int, count: int) -> F64:
    """Dense values of rows ``start_row .. start_row+count-1`` (clipped to the axis):
    shape (rows, contexts). Cost: the stored entries of those rows only."""
    lo = max(0, int(start_row))
    hi = min(m.n_rows, lo + max(0, int(count)))
    out = np.zeros((max(hi - lo, 0), m.n_cols), dtype=np.float64)
    if hi > lo:
        r, c, v = m.entries(lo, hi)
        out[r - lo, c] = v
    return out


def rows_dense(m: LineMatrix, rows: npt.ArrayLike) -> F64:
    """Dense values of arbitrary rows (any order), shape (len(rows), contexts)."""
    rr = np.asarray(rows, dtype=np.int64).reshape(-1)
    if len(rr) and (rr.min() < 0 or rr.max() >= m.n_rows):
        raise CallpathError(f"line row out of range (expected 0..{m.n_rows - 1})")
    out = np.zeros((len(rr), m.n_cols), dtype=np.float64)
    if not len(m.nz_rows) or not len(rr):
        return out
    k = np.minimum(np.searchsorted(m.nz_rows, rr), len(m.nz_rows) - 1)
    hit = np.nonzero(m.nz_rows[k] == rr)[0]
    lo = m.indptr[k[hit]]
    n = m.indptr[k[hit] + 1] - lo
    # the entries of every requested row with cost, gathered at once
    idx = np.repeat(lo - np.cumsum(n) + n, n) + np.arange(int(n.sum()))
    out[np.repeat(hit, n), m.cols[idx]] = m.vals[idx]
    return out


def line_stats(m: LineMatrix, rows: npt.ArrayLike) -> dict[str, npt.NDArray[Any]]:
    """Per row: ``sum``, ``min`` / ``min_context``, ``max`` / ``max_context`` (column
    indices), ``mean`` and ``stdev`` (population) over the columns.

    Ties follow the seed's sorted processor view (Figure 1c: ``0 1 0 0`` prints
    ``min 0(3) max 1(1)``): contexts are sorted by decreasing value, stable, so the maximum
    names the first context that has it and the minimum the last."""
    rr = np.asarray(rows, dtype=np.int64).reshape(-1)
    n = len(rr)
    out: dict[str, npt.NDArray[Any]] = {
        "sum": np.zeros(n), "min": np.zeros(n), "min_context": np.zeros(n, np.int64),
        "max": np.zeros(n), "max_context": np.zeros(n, np.int64), "mean": np.zeros(n),
        "stdev": np.zeros(n)}
    if not n or not m.n_cols:
        return out
    step = max(1, (1 << 22) // m.n_cols)
    nc = m.n_cols
    for a in range(0, n, step):
        d = rows_dense(m, rr[a:a + step])
        sl = slice(a, a + len(d))
        out["sum"][sl] = d.sum(axis=1)
        out["max"][sl] = d.max(axis=1)
        out["max_context"][sl] = d.argmax(axis=1)
        out["min"][sl] = d.min(axis=1)
        out["min_context"][sl] = nc - 1 - d[:, ::-1].argmin(axis=1)
        out["mean"][sl] = d.mean(axis=1)
        out["stdev"][sl] = d.std(axis=1)
    return out


def row_of(m: LineMatrix, file: str | int, line: int) -> int:
    """Axis row of (file, line); ``file`` is a recorded path (or its unique suffix) or an
    axis file index. Raises :class:`CallpathError` when the line is not on the axis."""
    fi = file_index(m, file)
    lo, hi = int(m.file_start[fi]), int(m.file_start[fi + 1])
    k = lo + int(np.searchsorted(m.line_of_row[lo:hi], int(line)))
    if k >= hi or int(m.line_of_row[k]) != int(line):
        raise CallpathError(f"line {line} of {m.file_labels[fi]} is not on the line axis (the "
                            f"file has lines {int(m.line_of_row[lo]) if hi > lo else 0}.."
                            f"{int(m.line_of_row[hi - 1]) if hi > lo else 0})")
    return k


def file_index(m: LineMatrix, file: str | int) -> int:
    """Axis index of a file named by its original path (or its recorded one), a unique path
    suffix or base name, or an axis index."""
    if isinstance(file, int):
        if 0 <= file < len(m.files):
            return file
        raise CallpathError(f"file index {file} out of range (0..{len(m.files) - 1})")
    names = m.file_labels or m.files
    for table in (names, m.files):  # the original path, or a copy's path in the database
        if file in table:
            return table.index(file)
    hits = [i for i, f in enumerate(names) if f.endswith("/" + file.lstrip("/"))
            or Path(f).name == file]
    if len(hits) == 1:
        return hits[0]
    listed = ", ".join(names[:10])
    if not hits:
        raise CallpathError(f"file {file!r} has no line with data in this database "
                            f"(expected one of: {listed}{', ...' if len(names) > 10 else ''})")
    raise CallpathError(f"file {file!r} is ambiguous: "
                        f"{', '.join(names[i] for i in hits[:5])}")


def source_text(m: LineMatrix, file: int) -> list[str] | None:
    """The lines of axis file ``file`` (index 0 is line 1), None when it cannot be read."""
    p = m.source_paths[file]
    if p is None:
        return None
    try:
        return p.read_bytes().decode("utf-8", "replace").splitlines()
    except OSError:
        return None


def rows_of_node(exp: Experiment, m: LineMatrix, node: int) -> I64:
    """The axis rows of a tree scope (a node of ``exp.cct``): a line scope's own row; for a
    procedure, loop or inlined function, the rows of the line scopes inside it (not across
    calls), sorted. Empty when the scope has no line scope on the axis."""
    cct = exp.cct
    if not 0 <= node < len(cct):
        raise CallpathError(f"node {node} out of range (0..{len(cct) - 1})")
    nr = m.node_rows()
    if int(nr[node]) >= 0:
        return np.asarray([nr[node]], dtype=np.int64)
    lo, hi = node, int(cct.subtree_end[node])
    sub = np.arange(lo, hi)
    # stop at calls: a node below a call (relation CALL) belongs to the callee
    called = (cct.relation[sub] == Relation.CALL) & (sub != node)
    if called.any():
        cut = np.zeros(hi - lo + 1, dtype=np.int64)
        ends = cct.subtree_end[sub[called]] - lo
        np.add.at(cut, sub[called] - lo, 1)
        np.add.at(cut, ends, -1)
        inside = np.cumsum(cut)[:-1] == 0
        sub = sub[inside]
    rows = nr[sub]
    return np.unique(rows[rows >= 0])
