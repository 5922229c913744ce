"""The input every view is computed from: a calling context tree and per-node *point* values.

Views never read a database directly. They take a :class:`TreeSource` — the (possibly
filtered) top-down tree plus, per metric, the cost measured at each node itself — and derive
inclusive and exclusive values from it with linear passes. Working from point values is what
lets filters, thread selections and view configurations share one code path: each just
produces another source (other points, or another tree over the same nodes).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.model import CCT, Experiment, Metric, NodeKind
from callpath.model.contexts import node_texts

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def point_from_inclusive(cct: CCT, inclusive: F64) -> F64:
    """Cost at each node itself: its inclusive value minus its children's (one bincount)."""
    child_sum = np.bincount(cct.parent[1:], weights=inclusive[1:], minlength=len(cct))
    return inclusive - child_sum


def summary_points(exp: Experiment, metric: Metric) -> F64:
    """Point values of the summary (sum over all execution contexts) for every node.

    Derived from the inclusive values rather than read from the "point" scope: hpcprof
    attributes point values to context ids that are not nodes of the tree (small.d has them
    on ids 3, 5, 12, 13, 14), while inclusive values are always on tree nodes."""
    return point_from_inclusive(exp.cct, exp.inclusive(metric))


def context_points(exp: Experiment, metric: Metric, profiles: Sequence[int]) -> F64:
    """Point values summed over the given profiles (indices into ``exp.profiles``)."""
    cct = exp.cct
    ctx = cct.ctx_id.astype(np.int64)
    total = np.zeros(len(cct), dtype=np.float64)
    eid = metric.prop_id(exp.scopes, "execution")
    if eid is None:
        raise CallpathError(f"metric {metric.name!r} has no per-context inclusive values")
    for p in profiles:
        total += exp.values[p].dense(eid, exp.n_ctx_slots)[ctx]
    return point_from_inclusive(cct, total)


def call_sites(kind: npt.NDArray[np.uint8], file: I64, line: npt.NDArray[Any], parent: I64
               ) -> tuple[I64, I64]:
    """``(line, file)`` of every node's call site, -1 where there is none: hpcviewer's
    ``[line] » callee`` takes the line of the parent when that is a statement or loop with a
    file. The arrays describe the tree ``parent`` indexes into."""
    safe = np.maximum(parent, 0)
    pk = kind[safe]
    site = (parent >= 0) & ((pk == NodeKind.LINE) | (pk == NodeKind.LOOP)) & (file[safe] >= 0)
    return (np.where(site, line[safe].astype(np.int64), -1),
            np.where(site, file[safe].astype(np.int64), -1))


@dataclass
class TreeSource:
    """A top-down tree with point values per metric, computed on first use.

    ``orig`` maps each node of ``cct`` to the node of ``exp.cct`` it stands for (identity
    unless a filter removed nodes); labels and source locations are read through it.
    ``profiles`` is the execution-context selection the values are summed over (None: all,
    read from the summary profile)."""

    exp: Experiment
    cct: CCT
    orig: I64
    profiles: tuple[int, ...] | None = None
    _points: dict[int, F64] = field(default_factory=dict, repr=False)
    _derived: dict[tuple[int, str], F64] = field(default_factory=dict, repr=False)
    parent_source: TreeSource | None = None  # the unfiltered source a filter started from
    moved_to: I64 | None = None  # original node -> node of this tree its cost went to

    @property
    def metrics(self) -> list[Metric]:
        return self.exp.metrics

    def metric_index(self, key: str | int | Metric) -> int:
        m = key if isinstance(key, Metric) else self.exp.metric(key)
        return self.exp.metrics.index(m)

    def points(self, metric: str | int | Metric) -> F64:
        k = self.metric_index(metric)
        arr = self._points.get(k)
        if arr is None:
            if self.parent_source is not None:
                assert self.moved_to is not None
                base = self.parent_source.points(k)
                arr = np.bincount(self.moved_to, weights=base,
                                  minlength=len(self.cct)).astype(np.float64)
            elif self.profiles is None:
                arr = summary_points(self.exp, self.exp.metrics[k])
            else:
                arr = context_points(self.exp, self.exp.metrics[k], self.profiles)
            self._points[k] = arr
        return arr

    def column(self, name: str) -> npt.NDArray[Any]:
        """A column of the experiment's tree (``kind``, ``function``, ...) for this source's
        nodes: the array itself when the source is the whole tree, else a gathered copy."""
        arr: npt.NDArray[Any] = getattr(self.exp.cct, name)
        return arr if self.cct is self.exp.cct else arr[self.orig]

    def with_profiles(self, profiles: Sequence[int] | None) -> TreeSource:
        """The same tree (same filters) with values summed over another context selection."""
        if self.parent_source is not None:
            base = self.parent_source.with_profiles(profiles)
            return TreeSource(self.exp, self.cct, self.orig, base.profiles,
                              parent_source=base, moved_to=self.moved_to)
        return tree_source(self.exp, profiles)

    def _is_plain(self) -> bool:
        return self.parent_source is None and self.profiles is None and self.cct is self.exp.cct

    def inclusive(self, metric: str | int | Metric) -> F64:
        """Top-down inclusive values: the cost of each subtree."""
        k = self.metric_index(metric)
        arr = self._derived.get((k, "i"))
        if arr is None:
            # the unfiltered summary: the database's own values, exactly as written
            arr = self.exp.inclusive(k) if self._is_plain() else self.cct.inclusive(self.points(k))
            self._derived[(k, "i")] = arr
        return arr

    def exclusive(self, metric: str | int | Metric) -> F64:
        """Top-down exclusive values: procedures without callees, other scopes themselves."""
        k = self.metric_index(metric)
        arr = self._derived.get((k, "e"))
        if arr is None:
            arr = self.exp.exclusive(k) if self._is_plain() else self.cct.exclusive(self.points(k))
            self._derived[(k, "e")] = arr
        return arr


def tree_source(exp: Experiment, profiles: Sequence[int] | None = None) -> TreeSource:
    """The unfiltered source of an experiment, over all contexts or a selection of them."""
    sel = None if profiles is None else tuple(int(p) for p in profiles)
    if sel is not None:
        bad = [p for p in sel if not 0 <= p < len(exp.profiles) or exp.profiles[p].is_summary]
        if bad:
            raise CallpathError(f"execution context index {bad[0]} is not a measured context "
                                f"(expected 1..{len(exp.profiles) - 1})")
    return TreeSource(exp, exp.cct, np.arange(len(exp.cct), dtype=np.int64), sel)


def select_contexts(exp: Experiment, pattern: str, *, regex: bool = False,
                    case_sensitive: bool = True) -> list[int]:
    """Profiles whose label matches ``pattern``, hpcviewer's execution-context filter.

    A plain pattern matches as a substring of the full label (``THREAD 0`` selects every
    thread 0 of every rank), of the short label (``1.0``) and of the thread's name
    (``worker_1``, a pool's worker; a plain pattern must end where a word does, so it is not
    ``worker_10``); with ``regex`` it is a regular expression searched in all three
    (``^worker_`` against the name: every worker). Returns profile indices (the summary is
    never selected)."""
    names = exp.id_names
    flags = 0 if case_sensitive else re.IGNORECASE
    if regex:
        try:
            rx = re.compile(pattern, flags)
        except re.error as e:
            raise CallpathError(f"context filter {pattern!r}: invalid regular expression: "
                                f"{e}") from None
    else:
        # a plain pattern must not match "THREAD 1" inside "THREAD 10": require a word end
        rx = re.compile(re.escape(pattern) + r"(?![0-9A-Za-z_])", flags)
    out = []
    # the labels as stored (NODE 8323328), as read (node left out) and as listed by
    # `report --contexts` (NODE 0x7f0100): a pattern copied from any of them selects
    hexed = node_texts(exp.profiles, names, omit_single=False)
    for p in exp.profiles:
        if p.is_summary:
            continue
        if rx.search(p.label(names)) or rx.search(p.short_label(names)) \
                or rx.search(exp.context_label(p)) or rx.search(p.label(names, hexed)) \
                or (p.name and rx.search(p.name)):
            out.append(p.index)
    return out
