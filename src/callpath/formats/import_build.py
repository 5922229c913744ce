"""An experiment from other tools' call stacks: what every importer hands its samples to.

An importer produces a :class:`StackSet`: distinct functions (name, file, module, line),
samples as root-first frames (function, line inside it, inlined or called), the execution
context and metric values of each sample. The calling context tree is built the way
``callpath prof`` shapes its own: a procedure node per frame, a statement node for the line
within it (the call site of the next frame, or where the sample fell), so that every view, the
diff and the exports treat an imported database like a measured one. The tree is a trie of the
samples' token sequences built one level at a time (one ``np.unique`` per depth, no loop over
samples) and then laid out in preorder from subtree sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.model import (
    CCT,
    EntryPoint,
    ExecutionContext,
    Experiment,
    Function,
    Identifier,
    IdKind,
    LoadModule,
    NodeKind,
    ProfileBlock,
    Relation,
    SourceFile,
    TraceLine,
    Traces,
    build_experiment,
    propagate,
    standard_metric,
    standard_scopes,
)

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

TOK_CALL, TOK_INLINED, TOK_LINE = 0, 1, 2


class Interner:
    """Distinct values to dense indices, in first-seen order."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, str, int]] = []
        self.index: dict[tuple[str, str, str, int], int] = {}

    def __call__(self, name: str, file: str = "", module: str = "", line: int = 0) -> int:
        key = (name, file, module, line)
        i = self.index.get(key)
        if i is None:
            i = self.index[key] = len(self.items)
            self.items.append(key)
        return i


@dataclass
class StackSet:
    """Samples to import. Frame ``j`` of sample ``i`` (root first) is at
    ``frame_fn[offsets[i] + j]``, with its line ``frame_line`` (0 if unknown) and whether it
    was inlined into its caller. ``values[i, k]`` is sample ``i``'s value of metric ``k``."""

    functions: list[tuple[str, str, str, int]]  # (name, file, module, first line)
    offsets: I64
    frame_fn: I64
    frame_line: I64
    frame_inlined: npt.NDArray[np.bool_]
    context: I64  # per sample: index into ``contexts``
    values: F64
    metric_names: list[str]
    contexts: list[tuple[Identifier, ...]]
    title: str = ""
    description: str = ""
    periods: list[float] = field(default_factory=list)
    times: npt.NDArray[np.uint64] | None = None  # per sample: ns, when the format has them


def stackset(functions: Interner, stacks: list[list[tuple[int, int, bool]]],
             context: list[int], values: list[list[float]] | F64, metric_names: list[str],
             contexts: list[tuple[Identifier, ...]], *, title: str = "",
             description: str = "") -> StackSet:
    """A :class:`StackSet` from Python lists (what the text readers collect)."""
    lens = np.fromiter((len(s) for s in stacks), dtype=np.int64, count=len(stacks))
    off = np.zeros(len(stacks) + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    flat = [t for s in stacks for t in s]
    fn = np.fromiter((t[0] for t in flat), dtype=np.int64, count=len(flat))
    ln = np.fromiter((t[1] for t in flat), dtype=np.int64, count=len(flat))
    inl = np.fromiter((t[2] for t in flat), dtype=bool, count=len(flat))
    vals = np.asarray(values, dtype=np.float64).reshape(len(stacks), len(metric_names))
    return StackSet(list(functions.items), off, fn, ln, inl,
                    np.asarray(context, dtype=np.int64), vals, metric_names, contexts, title,
                    description)


def thread_ids(n: int) -> list[tuple[Identifier, ...]]:
    return [(Identifier(IdKind.THREAD, i),) for i in range(n)]


def build(ss: StackSet) -> Experiment:
    """The experiment of a stack set (see the module docstring)."""
    n = len(ss.offsets) - 1
    if n == 0 or not np.any(ss.values != 0):
        raise CallpathError("no samples with a nonzero value to import")
    # tokens: each frame is a procedure token, then a line token when its line is known
    has_line = ss.frame_line > 0
    per_frame = 1 + has_line.astype(np.int64)
    cs = np.zeros(len(per_frame) + 1, dtype=np.int64)
    np.cumsum(per_frame, out=cs[1:])
    tok_len = cs[ss.offsets[1:]] - cs[ss.offsets[:-1]]  # tokens per sample (0 if no frames)
    n_tok = int(per_frame.sum())
    tpos = np.zeros(len(per_frame) + 1, dtype=np.int64)
    np.cumsum(per_frame, out=tpos[1:])
    tkind = np.full(n_tok, TOK_LINE, dtype=np.int64)
    tval = np.empty(n_tok, dtype=np.int64)
    tkind[tpos[:-1]] = np.where(ss.frame_inlined, TOK_INLINED, TOK_CALL)
    tval[tpos[:-1]] = ss.frame_fn
    lpos = tpos[:-1][has_line] + 1
    tval[lpos] = ss.frame_line[has_line]
    toff = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(tok_len, out=toff[1:])
    # trie, one level at a time (a sample without frames stays at the entry point)
    cur = np.full(n, -1, dtype=np.int64)  # trie node of each sample at the current level
    empty = np.zeros(0, dtype=np.int64)
    par_l: list[I64] = [empty]
    kind_l: list[I64] = [empty]
    val_l: list[I64] = [empty]
    level_l: list[I64] = [empty]
    count = 0
    act = np.flatnonzero(tok_len > 0)
    d = 0
    while len(act):
        pos = toff[act] + d
        k, v = tkind[pos], tval[pos]
        # one int64 key (parent, kind, value) sorted by parent first, so that siblings are
        # contiguous (np.unique(axis=0) sorts a void view, ~30x slower)
        if int(v.max(initial=0)) >= 1 << 32 or int(v.min(initial=0)) < 0 or count >= 1 << 28:
            raise CallpathError(f"a profile too large to import ({count:,} contexts, a line or "
                                "function index of 2^32 or more)")
        key = ((cur[act] + 1) << 34) | (k << 32) | v
        ukey, inv = np.unique(key, return_inverse=True)
        inv = inv.reshape(-1)
        par_l.append((ukey >> 34) - 1)
        kind_l.append((ukey >> 32) & 3)
        val_l.append(ukey & 0xFFFFFFFF)
        level_l.append(np.full(len(ukey), d, dtype=np.int64))
        cur[act] = inv + count
        count += len(ukey)
        d += 1
        act = act[tok_len[act] > d]
    par = np.concatenate(par_l)
    tk = np.concatenate(kind_l)
    tv = np.concatenate(val_l)
    lev = np.concatenate(level_l)
    leaf = cur
    pre = _preorder(par, lev)
    m = count
    order = np.empty(m, dtype=np.int64)
    order[pre] = np.arange(m)
    # tree columns: root, one entry, then the trie in preorder
    parent = np.concatenate([[-1, 0], np.where(par[order] >= 0, pre[np.maximum(par[order], 0)]
                                               + 2, 1)])
    k_o, v_o = tk[order], tv[order]
    is_fn = k_o != TOK_LINE
    kind = np.concatenate([[NodeKind.ROOT, NodeKind.ENTRY],
                           np.where(is_fn, NodeKind.FUNCTION, NodeKind.LINE)])
    rel = np.concatenate([[Relation.NONE, Relation.NONE],
                          np.where(k_o == TOK_CALL, Relation.CALL,
                                   np.where(k_o == TOK_INLINED, Relation.INLINED_CALL,
                                            Relation.LEXICAL))])
    fn_tab = ss.functions
    fn_col = np.concatenate([[-1, -1], np.where(is_fn, v_o, -1)])
    # a line's file is its procedure's (its parent in the trie is always that procedure)
    parent_fn = np.where(is_fn, v_o, 0)
    line_par = np.where(~is_fn, par[order], 0)
    line_fn = np.where(~is_fn, tv[np.maximum(line_par, 0)], -1)
    files = Interner()
    mods = Interner()
    f_file = np.array([files(f[1]) if f[1] else -1 for f in fn_tab], dtype=np.int64)
    f_mod = np.array([mods(f[2]) if f[2] else -1 for f in fn_tab], dtype=np.int64)
    file_col = np.concatenate([[-1, -1], np.where(is_fn, -1, f_file[np.maximum(line_fn, 0)])])
    line_col = np.concatenate([[0, 0], np.where(is_fn, 0, v_o)])
    mod_col = np.concatenate([[-1, -1], f_mod[np.where(is_fn, parent_fn,
                                                       np.maximum(line_fn, 0))]])
    mod_col = np.where(np.concatenate([[False, False], is_fn]), mod_col, -1)
    entry = np.zeros(m + 2, dtype=np.int64)
    entry[1] = EntryPoint.MAIN_THREAD
    cct = CCT.from_columns(parent, kind, relation=rel, function=fn_col, file=file_col,
                           line=line_col, module=mod_col, entry_point=entry,
                           entry_names={1: "main thread"})
    scopes = standard_scopes()
    metrics = [standard_metric(nm, 3 * k, scopes, period=(ss.periods[k] if k < len(ss.periods)
                                                          else 1.0))
               for k, nm in enumerate(ss.metric_names)]
    node_of_sample = np.ones(n, dtype=np.int64)  # no frames: the entry point
    has = leaf >= 0
    node_of_sample[has] = pre[leaf[has]] + 2
    blocks = []
    nz_ctx: list[ExecutionContext] = []
    lines: list[TraceLine] = []
    for c in range(len(ss.contexts)):
        sel = ss.context == c
        if not sel.any():
            continue
        ctx: list[I64] = []
        met: list[I64] = []
        val: list[F64] = []
        for mi in range(len(metrics)):
            ctx.append(node_of_sample[sel])
            met.append(np.full(int(sel.sum()), 3 * mi))
            val.append(ss.values[sel, mi])
        blk = ProfileBlock.from_triples(np.concatenate(ctx), np.concatenate(met),
                                        np.concatenate(val))
        blocks.append(propagate(cct, metrics, scopes, blk))
        nz_ctx.append(ExecutionContext(len(nz_ctx) + 1, ss.contexts[c]))
        if ss.times is not None:  # a trace: the context of each sample in time order
            idx = np.flatnonzero(sel)
            idx = idx[np.argsort(ss.times[idx], kind="stable")]
            lines.append(TraceLine(len(nz_ctx), ss.times[idx].astype(np.uint64),
                                   cct.ctx_id[node_of_sample[idx]].astype(np.uint32)))
    functions = [Function(nm, int(f_mod[i]), 0, int(f_file[i]), ln)
                 for i, (nm, _, _, ln) in enumerate(fn_tab)]
    return build_experiment(
        cct, metrics, scopes, nz_ctx, blocks,
        modules=[LoadModule(p[0]) for p in mods.items],
        files=[SourceFile(p[0]) for p in files.items], functions=functions,
        title=ss.title, description=ss.description,
        traces=Traces(min(int(t.timestamps[0]) for t in lines),
                      max(int(t.timestamps[-1]) for t in lines), lines) if lines else None)


def _preorder(par: I64, lev: I64) -> I64:
    """Preorder position of every node of a forest given in level order (parents first):
    subtree sizes bottom-up, then each node after its parent and its earlier siblings'
    subtrees, one vectorised step per level."""
    m = len(par)
    size = np.ones(m, dtype=np.int64)
    top = int(lev.max()) if m else 0
    bounds = np.searchsorted(lev, np.arange(top + 2))
    for d in range(top, 0, -1):
        nodes = np.arange(bounds[d], bounds[d + 1])
        np.add.at(size, par[nodes], size[nodes])
    # siblings are contiguous within a level (np.unique sorted them by parent first)
    pos = np.empty(m, dtype=np.int64)
    for d in range(top + 1):
        lo, hi = int(bounds[d]), int(bounds[d + 1])
        p = par[lo:hi]
        s = size[lo:hi]
        cs = np.cumsum(s) - s  # exclusive prefix within the level
        start = np.ones(hi - lo, dtype=bool)
        start[1:] = p[1:] != p[:-1]
        grp_first = np.maximum.accumulate(np.where(start, np.arange(hi - lo), 0))
        before = cs - cs[grp_first]
        base = np.where(p >= 0, pos[np.maximum(p, 0)] + 1, 0)
        pos[lo:hi] = base + before
    return pos
