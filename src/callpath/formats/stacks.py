"""The calling context tree seen as other tools see it: a tree of *frames* with sample weights.

speedscope, pprof, Chrome traces and folded stacks know procedures and lines, not HPCToolkit's
loops, statements and call-site scopes. This module derives, once per experiment and without
per-node Python loops, what every exporter needs:

- the frame nodes: procedure activations (called or inlined), plus machine code outside any
  procedure (``libgomp.so+0x1a86d``) and, when cost sits directly on them, entry points and the
  root; each with the nearest frame above it (entries and the root are never parents, so a
  thread's stacks start at its first procedure, as other tools write them);
- for every node of the tree, the frame that owns its cost and the source line inside that frame
  (the nearest statement or loop), so that a sample keeps its line and a frame its call line;
- distinct frames (one per procedure, or per module offset) with name, file, line and module.

Weights come from the *point* values of a metric (cost measured at the node itself), recovered
from the inclusive values when a database stores no point scope: a node's point value is its
inclusive value minus its children's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.model import Experiment, Metric, NodeKind, Relation
from callpath.model.treeops import group_rows, nearest_marked

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

ROOT_NAME = "<program root>"


def unique_rows(*cols: I64) -> tuple[list[tuple[int, ...]], I64, I64]:
    """Distinct rows of equal-length integer columns: (rows, first index of each, row of
    each element); the first occurrence represents its row (names depend on it)."""
    row_id, first = group_rows(*cols, stable=True)
    return list(zip(*(c[first].tolist() for c in cols), strict=True)), first, row_id


def _base(path: str) -> str:
    return os.path.basename(path) or path


@dataclass
class FrameTree:
    """Frames of an experiment's tree (see the module docstring).

    ``nodes`` are the tree nodes that are frames, in preorder; ``parent[k]`` is the position of
    the frame above ``nodes[k]`` in ``nodes`` (-1 at the top), ``frame[k]`` its distinct frame,
    ``call_line[k]`` the line of the caller's frame it was reached from (0 if unknown).
    ``owner[v]`` is the position of the frame that owns node ``v``'s cost (-1 for none) and
    ``line[v]`` the line of ``v`` inside that frame (0 if unknown)."""

    exp: Experiment
    nodes: I64
    parent: I64
    frame: I64
    call_line: I64
    owner: I64
    line: I64
    names: list[str]
    files: list[str]
    def_lines: list[int]
    modules: list[str]
    frame_module: I64  # module index of each distinct frame (-1 if none)
    inlined: npt.NDArray[np.bool_]  # per frame node: reached by an inlined call
    top: npt.NDArray[np.bool_]  # per frame node: an entry point or the root

    def kept(self, selfw: F64, incl: F64) -> I64:
        """Frame nodes worth writing: procedures with cost in their subtree, entries and the
        root only with cost of their own (their subtrees are other frames' business)."""
        return np.flatnonzero(np.where(self.top, selfw != 0, incl != 0)).astype(np.int64)

    def __len__(self) -> int:
        return len(self.nodes)

    def depth(self, parent: I64 | None = None) -> I64:
        """Frame depth of each frame node (0 at the top), one vectorised step per level;
        along ``parent`` instead of the frame parents when given."""
        par = self.parent if parent is None else parent
        d = np.zeros(len(self), dtype=np.int64)
        cur = par.copy()
        while True:
            act = np.flatnonzero(cur >= 0)
            if not len(act):
                return d
            d[act] += 1
            cur[act] = par[cur[act]]

    def frame_weights(self, point: F64) -> tuple[F64, F64]:
        """(self, inclusive) weight of every frame node from per-tree-node point values."""
        cct = self.exp.cct
        own = self.owner
        ok = own >= 0
        selfw: F64 = np.bincount(own[ok], weights=point[ok], minlength=len(self)).astype(np.float64)
        incl = cct.inclusive(point)[self.nodes]
        return selfw, incl

    def paths(self, leaves: I64, *, leaf_first: bool = False,
              parent: I64 | None = None) -> tuple[I64, I64]:
        """The frame paths of frame nodes ``leaves``, root first (or leaf first), as a ragged
        array: ``(offsets, frames)`` with path ``i`` in ``frames[offsets[i]:offsets[i+1]]``
        (frame node positions), along ``parent`` when given. Work is the total length of
        the paths."""
        par = self.parent if parent is None else parent
        depth = self.depth(par)[leaves] + 1
        offsets = np.zeros(len(leaves) + 1, dtype=np.int64)
        np.cumsum(depth, out=offsets[1:])
        out = np.empty(int(offsets[-1]), dtype=np.int64)
        cur = leaves.copy()
        pos = offsets[:-1].copy() if leaf_first else offsets[1:] - 1
        step = 1 if leaf_first else -1
        act = np.arange(len(leaves))
        while len(act):
            out[pos[act]] = cur[act]
            pos[act] += step
            cur[act] = par[cur[act]]
            act = act[cur[act] >= 0]
        return offsets, out


def frame_tree(exp: Experiment) -> FrameTree:
    """The frames of ``exp`` (see :class:`FrameTree`); vectorised over the tree's arrays."""
    cct = exp.cct
    n = len(cct)
    kind = cct.kind
    parent = cct.parent
    is_fn = kind == NodeKind.FUNCTION
    has_fn_above = nearest_marked(parent, is_fn) >= 0
    # machine code outside any procedure is a frame of its own (a caller without symbols)
    is_ins = (kind == NodeKind.INSTRUCTION) & ~has_fn_above
    callable_frame = is_fn | is_ins
    top = (kind == NodeKind.ENTRY) | (kind == NodeKind.ROOT)
    is_frame = callable_frame | top
    owner_node = nearest_marked(parent, is_frame)
    # where the line of a node inside its frame comes from: the nearest statement or loop
    anchor = nearest_marked(parent, is_frame | (kind == NodeKind.LINE) | (kind == NodeKind.LOOP))
    line_of = np.where(is_frame[anchor], 0, cct.line.astype(np.int64)[anchor])
    nodes = np.flatnonzero(is_frame).astype(np.int64)
    pos = np.full(n, -1, dtype=np.int64)
    pos[nodes] = np.arange(len(nodes), dtype=np.int64)
    owner = pos[owner_node]
    # a frame's parent: the nearest callable frame strictly above it (entries never parent)
    above = np.where(parent[nodes] >= 0, parent[nodes], 0)
    call_anc = nearest_marked(parent, callable_frame)[above]
    fparent = np.where(callable_frame[nodes] & (parent[nodes] >= 0) & (call_anc >= 0),
                       pos[np.maximum(call_anc, 0)], -1)
    call_line = np.where(parent[nodes] >= 0, line_of[above], 0)
    call_line = np.where(fparent >= 0, call_line, 0)
    # distinct frames: procedures by function index, code by (module, offset), tops by node
    fn = cct.function[nodes]
    tag = np.where(kind[nodes] == NodeKind.FUNCTION, np.where(fn >= 0, 0, 1),
                   np.where(is_ins[nodes], 1, 2)).astype(np.int64)
    mod = cct.module[nodes]
    a = np.where(tag == 0, fn, np.where(tag == 1, mod, nodes))
    b = np.where(tag == 1, cct.offset[nodes].astype(np.int64), 0)
    uniq, first, frame = unique_rows(tag, a, b)
    modules = [_base(m.path) for m in exp.modules]
    names: list[str] = []
    files: list[str] = []
    def_lines: list[int] = []
    fmod = np.full(len(uniq), -1, dtype=np.int64)
    for k, (t, av, bv) in enumerate(uniq):
        node = int(nodes[first[k]])
        if t == 0:
            f = exp.functions[av]
            m = f.module if f.module >= 0 else int(cct.module[node])
            fmod[k] = m
            if f.has_name and f.name:
                names.append(f.name)
            else:
                where = modules[m] if m >= 0 else "<unknown module>"
                names.append(f"<unknown procedure> {where}+{f.offset:#x}")
            files.append(exp.files[f.file].path if f.file >= 0 else "")
            def_lines.append(int(f.line))
        elif t == 1:
            fmod[k] = av
            where = modules[av] if av >= 0 else "<unknown module>"
            names.append(f"{where}+{bv:#x}" if kind[node] == NodeKind.INSTRUCTION
                         else f"<unknown procedure> {where}+{bv:#x}")
            files.append("")
            def_lines.append(0)
        else:
            names.append(ROOT_NAME if kind[node] == NodeKind.ROOT
                         else cct.entry_names.get(node, "<entry>"))
            files.append("")
            def_lines.append(0)
    return FrameTree(exp, nodes, fparent.astype(np.int64), frame, call_line.astype(np.int64),
                     owner, line_of.astype(np.int64), names, files, def_lines, modules, fmod,
                     cct.relation[nodes] == Relation.INLINED_CALL, top[nodes])


# ---- weights ------------------------------------------------------------------------------


def default_metric(exp: Experiment) -> Metric:
    """The metric exports use unless told: a sample count where the database has one
    (``callpath prof`` writes ``EVENT (samples)``), else the first metric."""
    if not exp.metrics:
        raise CallpathError("the database has no metrics to export")
    for m in exp.metrics:
        if m.name.endswith("(samples)"):
            return m
    return exp.metrics[0]


def point_values(exp: Experiment, metric: Metric, profile: int | None = None) -> F64:
    """Cost measured at each node itself, for the summary (``profile`` None) or one execution
    context: inclusive minus the children's inclusive. (hpcprof declares a point scope but
    stores no values in it, so the inclusive values are the one source every database has.)"""
    cct = exp.cct
    inc = exp.inclusive(metric) if profile is None else exp.values_in(profile, metric,
                                                                        "execution")
    child = np.bincount(cct.parent[1:], weights=inc[1:], minlength=len(cct))
    out: F64 = inc - child
    return out


def check_nonnegative(values: F64, metric: Metric, fmt: str) -> None:
    if len(values) and float(values.min()) < -1e-9 * max(1.0, float(np.abs(values).max())):
        raise CallpathError(f"metric {metric.name!r} has negative values, which {fmt} cannot "
                            "hold (expected a metric of costs; on a comparison choose "
                            "'M [base]' or 'M [new]')")


@dataclass(frozen=True)
class IntegerScale:
    """How a metric's values become the integers of folded stacks and pprof: ``value *
    factor``, named ``unit``."""

    factor: float
    unit: str


def integer_scale(metric: Metric, values: F64) -> IntegerScale:
    """Counts stay counts; seconds become nanoseconds; other fractional values millionths.
    A metric with a sampling period whose values are whole periods becomes sample counts."""
    name = metric.name
    nz = values[values != 0]
    if not len(nz) or np.allclose(nz, np.rint(nz), rtol=0, atol=1e-6):
        return IntegerScale(1.0, "count")
    if metric.period not in (0.0, 1.0):
        q = nz / metric.period
        if np.allclose(q, np.rint(q), rtol=0, atol=1e-6):
            return IntegerScale(1.0 / metric.period, "count")
    if bare_name(name).endswith("(sec)") or metric.unit in ("s", "sec", "seconds"):
        return IntegerScale(1e9, "nanoseconds")
    return IntegerScale(1e6, "millionths")


def bare_name(name: str) -> str:
    """A metric name without the column tag of a comparison: ``CPUTIME (sec) [base]`` →
    ``CPUTIME (sec)`` (``callpath diff`` and ``merge`` tag their columns so)."""
    if name.endswith("]") and " [" in name:
        return name[:name.rindex(" [")]
    return name


def metric_unit_name(metric: Metric) -> str:
    """The metric's name without a trailing unit in parentheses: ``CPUTIME (sec)`` →
    ``CPUTIME``, ``CPUTIME (sec) [base]`` → ``CPUTIME [base]``."""
    name = bare_name(metric.name)
    tag = metric.name[len(name):]
    if name.endswith(")") and " (" in name:
        name = name[:name.rindex(" (")]
    return name + tag


def weight_sources(exp: Experiment, contexts: list[int] | None, *, summary: bool = True
                   ) -> list[tuple[str, int | None]]:
    """(label, profile) pairs to export: the summary (profile None) when ``summary``, then the
    chosen execution contexts (all of them when ``contexts`` is None)."""
    out: list[tuple[str, int | None]] = [("summary", None)] if summary else []
    chosen = [p.index for p in exp.contexts] if contexts is None else contexts
    out += [(exp.context_label(exp.profiles[p]), p) for p in chosen]
    return out


def selected_points(exp: Experiment, metric: Metric, contexts: list[int] | None) -> F64:
    """Point values of the summary (``contexts`` None) or summed over chosen contexts."""
    if contexts is None:
        return point_values(exp, metric)
    total = np.zeros(len(exp.cct))
    for p in contexts:
        total += point_values(exp, metric, p)
    return total
