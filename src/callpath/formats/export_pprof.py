"""pprof's ``profile.proto`` (github.com/google/pprof/blob/main/proto/profile.proto), gzipped.

- one sample type per metric (values are int64: seconds become nanoseconds, counts stay
  counts, see :func:`~callpath.formats.stacks.integer_scale`);
- a sample per distinct (frame, source line) holding cost, optionally per execution context
  (a ``context`` label names it);
- a location per distinct (procedure, line), with one ``Line``, and inlined code as extra
  lines of its caller's location (innermost first); a sample's stack is its own location, then
  each caller's at the line of its call;
- a function per procedure (name, file, first line), a mapping per load module.

All messages are laid out at once with :mod:`callpath.formats.protowire`.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.formats import protowire as pw
from callpath.formats import stacks
from callpath.formats.stacks import FrameTree, IntegerScale, integer_scale, metric_unit_name
from callpath.model import Metric
from callpath.model.treeops import nearest_marked

I64 = npt.NDArray[np.int64]


class _Strings:
    def __init__(self) -> None:
        self.items: list[str] = [""]
        self.index: dict[str, int] = {"": 0}

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.items)
            self.items.append(s)
        return i


@dataclass
class PprofSource:
    """One execution context's (or the summary's) point values of every exported metric."""

    label: str | None  # None: no context label (the summary)
    points: list[npt.NDArray[np.float64]]


def sample_type_name(metric: Metric, scale: IntegerScale) -> str:
    """``CPUTIME (sec)`` in nanoseconds is type ``CPUTIME``; counts keep the metric's name."""
    return metric_unit_name(metric) if scale.unit == "nanoseconds" else metric.name


def pprof_bytes(ft: FrameTree, metrics: list[Metric], sources: list[PprofSource], *,
                comment: str = "", time_nanos: int = 0, level: int = 6) -> bytes:
    """The gzipped profile."""
    strs = _Strings()
    n_met = len(metrics)
    # samples: distinct (owner frame node, line) per source
    own = ft.owner
    ok = np.flatnonzero(own >= 0)
    key = own[ok] * (int(ft.line.max(initial=0)) + 1) + ft.line[ok]
    ukey, inv = np.unique(key, return_inverse=True)
    inv = inv.reshape(-1)
    sample_owner = ukey // (int(ft.line.max(initial=0)) + 1)
    sample_line = ukey % (int(ft.line.max(initial=0)) + 1)
    raw = np.zeros((len(sources), n_met, len(ukey)))
    for s, src in enumerate(sources):
        for m in range(n_met):
            raw[s, m] = np.bincount(inv, weights=src.points[m][ok], minlength=len(ukey))
    scales = [integer_scale(metrics[m], raw[:, m].ravel()) for m in range(n_met)]
    vals = np.stack([np.rint(raw[:, m] * scales[m].factor).astype(np.int64)
                     for m in range(n_met)], axis=-1)  # source x sample x metric
    # locations. A called frame at a line is one location (frame, line), shared by every
    # path through it. An inlined frame is part of its caller's location: its lines go
    # innermost first up to the frame it was inlined into (pprof's rule), keyed by frame
    # node since the chain above it is part of what it is.
    inl = ft.inlined & (ft.parent >= 0)
    phys = nearest_marked(ft.parent, ~inl)
    pparent = np.where(ft.parent >= 0, phys[np.maximum(ft.parent, 0)], -1)
    callers = np.flatnonzero(~inl & (ft.parent >= 0))
    k_node = np.concatenate([sample_owner, ft.parent[callers]])
    k_line = np.concatenate([sample_line, ft.call_line[callers]])
    k_tag = inl[k_node].astype(np.int64)
    rows, _, linv = stacks.unique_rows(k_tag, np.where(k_tag == 1, k_node, ft.frame[k_node]),
                                        k_line)
    ns = len(sample_owner)
    loc_of_sample = linv[:ns] + 1
    caller_loc = np.zeros(len(ft), dtype=np.int64)
    caller_loc[callers] = linv[ns:] + 1
    # stacks, leaf first: own location, then the caller location of every physical frame
    # but the outermost
    offsets, path = ft.paths(phys[sample_owner], leaf_first=True, parent=pparent)
    counts = np.diff(offsets)
    shifted = np.empty_like(path)
    shifted[1:] = caller_loc[path[:-1]]
    shifted[offsets[:-1]] = loc_of_sample
    # one sample message per (source, sample) with a nonzero value
    src_i, smp_i = np.nonzero(np.any(vals != 0, axis=-1))
    sel_off = offsets[smp_i]
    sel_cnt = counts[smp_i]
    take = np.repeat(sel_off, sel_cnt) + (np.arange(int(sel_cnt.sum()), dtype=np.int64)
                                          - np.repeat(np.cumsum(sel_cnt) - sel_cnt, sel_cnt))
    parts = [pw.len_field(1, pw.packed(shifted[take], sel_cnt)),
             pw.len_field(2, pw.packed(vals[src_i, smp_i].ravel(),
                                       np.full(len(smp_i), n_met, dtype=np.int64)))]
    labels = [None if s.label is None else s.label for s in sources]
    if any(lb is not None for lb in labels):
        key_i = strs("context")
        lab_msgs = pw.Ragged.of_bytes([
            b"" if lb is None else pw.concat([pw.scalar_field(1, [key_i]),
                                              pw.scalar_field(2, [strs(lb)])]).tobytes()
            for lb in labels])
        lab = pw.len_field(3, lab_msgs)
        keep = np.where([lb is not None for lb in labels], lab.lengths(), 0)
        lab = pw.select(lab, keep.astype(np.int64))
        idx = src_i
        per = pw.Ragged(lab.data, lab.offsets)
        parts.append(_pick(per, idx))
    samples = pw.len_field(2, pw.concat(parts))
    # sample types
    st = pw.len_field(1, pw.concat([
        pw.scalar_field(1, [strs(sample_type_name(m, sc)) for m, sc in
                            zip(metrics, scales, strict=True)]),
        pw.scalar_field(2, [strs(sc.unit) for sc in scales])]))
    # mappings
    nmod = len(ft.modules)
    mapping = pw.len_field(3, pw.concat([
        pw.scalar_field(1, np.arange(1, nmod + 1)),
        pw.scalar_field(5, [strs(m) for m in ft.modules]),
        pw.scalar_field(7, np.ones(nmod)), pw.scalar_field(8, np.ones(nmod)),
        pw.scalar_field(9, np.ones(nmod)), pw.scalar_field(10, np.ones(nmod))])) \
        if nmod else None
    # locations with their lines (innermost first)
    r = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
    tag, a, ln = r[:, 0], r[:, 1], r[:, 2]
    node = np.where(tag == 1, a, -1)
    first_frame = np.where(tag == 1, ft.frame[np.maximum(node, 0)], a)
    outer = np.where(tag == 1, ft.frame[phys[np.maximum(node, 0)]], a)  # inlined into
    mod = ft.frame_module[outer]
    e_loc, e_lvl, e_frame, e_line = [np.arange(len(r))], [np.zeros(len(r), np.int64)], \
        [first_frame], [ln]
    act = np.flatnonzero(tag == 1)
    cur = node[act]
    lvl = 0
    while len(act):
        keep = inl[cur]
        act, cur = act[keep], cur[keep]
        if not len(act):
            break
        lvl += 1
        e_line.append(ft.call_line[cur])
        cur = ft.parent[cur]
        e_loc.append(act)
        e_lvl.append(np.full(len(act), lvl, np.int64))
        e_frame.append(ft.frame[cur])
    eo = np.lexsort((np.concatenate(e_lvl), np.concatenate(e_loc)))
    e_locs = np.concatenate(e_loc)[eo]
    line_msg = pw.len_field(4, pw.concat([pw.scalar_field(1, np.concatenate(e_frame)[eo] + 1),
                                          pw.scalar_field(2, np.concatenate(e_line)[eo])]))
    starts = np.searchsorted(e_locs, np.arange(len(r) + 1))
    lines_of_loc = pw.Ragged(line_msg.data, line_msg.offsets[starts])
    location = pw.len_field(4, pw.concat([
        pw.scalar_field(1, np.arange(1, len(r) + 1)), pw.scalar_field(2, mod + 1),
        lines_of_loc]))
    # functions
    nf = len(ft.names)
    name_ids = [strs(n) for n in ft.names]
    function = pw.len_field(5, pw.concat([
        pw.scalar_field(1, np.arange(1, nf + 1)), pw.scalar_field(2, name_ids),
        pw.scalar_field(3, name_ids), pw.scalar_field(4, [strs(f) for f in ft.files]),
        pw.scalar_field(5, ft.def_lines)]))
    tail = [pw.scalar_field(9, [time_nanos])]
    if comment:
        tail.append(pw.scalar_field(13, [strs(comment)]))
    tail.append(pw.scalar_field(14, [strs(sample_type_name(metrics[0], scales[0]))]))
    table = pw.len_field(6, pw.strings(strs.items))
    body = b"".join(r.tobytes() for r in [st, samples, *([mapping] if mapping else []),
                                           location, function, table, *tail])
    return gzip.compress(body, compresslevel=level, mtime=0)


def _pick(r: pw.Ragged, idx: I64) -> pw.Ragged:
    """The strings ``idx`` of ``r``, in that order (repeats allowed)."""
    lens = r.lengths()[idx]
    total = int(lens.sum())
    starts = r.offsets[:-1][idx]
    out_off = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lens, out=out_off[1:])
    src = np.repeat(starts, lens) + (np.arange(total, dtype=np.int64)
                                     - np.repeat(out_off[:-1], lens))
    return pw.Ragged(r.data[src], out_off)
