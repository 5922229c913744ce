"""Metric columns of a view: measured metrics, derived metrics and view-configuration columns.

Columns are numbered the way formulas refer to them: metric ``k`` of the database gives
column ``$2k`` (inclusive) and ``$2k+1`` (exclusive); derived metrics follow in the order they
were defined and may use any column before them; CodeAnalyst view-configuration columns come
last (an inclusive and an exclusive column per configured column and context group).
Every column is computed for all materialized nodes of a view at once.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.analysis.derived import DerivedMetric
from callpath.analysis.numfmt import ValueFormat
from callpath.analysis.source import TreeSource
from callpath.analysis.topdown import View
from callpath.analysis.viewconfig import ColumnSpec, evaluate_column
from callpath.errors import CallpathError
from callpath.model.metrics import resolve_name

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ColumnDef:
    """One column. ``scope`` is ``inclusive`` or ``exclusive`` for measured metrics and view
    configuration columns, ``derived`` for derived metrics."""

    id: int
    title: str
    scope: str
    metric: int | None = None
    derived: DerivedMetric | None = None
    spec: ColumnSpec | None = None

    @property
    def ref(self) -> str:
        return f"${self.id}"

    @property
    def value_format(self) -> ValueFormat | None:
        return self.derived.value_format if self.derived is not None else None


class ColumnSet:
    """All columns available for one tree source, with evaluation over any view of it."""

    def __init__(self, source: TreeSource, derived: Sequence[DerivedMetric] = (),
                 config_columns: Sequence[ColumnSpec] = ()) -> None:
        self.source = source
        self.columns: list[ColumnDef] = []
        for k, m in enumerate(source.metrics):
            self.columns.append(ColumnDef(2 * k, f"{m.name} (I)", "inclusive", metric=k))
            self.columns.append(ColumnDef(2 * k + 1, f"{m.name} (E)", "exclusive", metric=k))
        for d in derived:
            self.add_derived(d)
        for spec in config_columns:
            for scope, tag in (("inclusive", "I"), ("exclusive", "E")):
                self.columns.append(ColumnDef(len(self.columns), f"{spec.title} ({tag})", scope,
                                              spec=spec))
        # per view (weakly held, so a dropped view frees its columns): (column, size) -> values
        self._cache: weakref.WeakKeyDictionary[View, dict[tuple[int, int], F64]] = \
            weakref.WeakKeyDictionary()
        self._ctx_sources: dict[tuple[int, ...] | None, TreeSource] = {}

    def add_derived(self, d: DerivedMetric) -> ColumnDef:
        """Append a derived metric; its formula may use only the columns before it."""
        cid = len(self.columns)
        d.parsed.check_references(range(cid), "column")
        if any(c.title == d.name for c in self.columns):
            raise CallpathError(f"derived metric {d.name!r}: a column of that name exists")
        col = ColumnDef(cid, d.name, "derived", derived=d)
        self.columns.append(col)
        return col

    # ---- lookup --------------------------------------------------------------------------

    def resolve(self, key: str | int) -> ColumnDef:
        """A column by ``$n``, number, exact title, metric name (its inclusive column), or
        unique case-insensitive prefix of a title."""
        if isinstance(key, int) or (isinstance(key, str) and key.lstrip("$").isdigit()):
            n = int(str(key).lstrip("$"))
            if 0 <= n < len(self.columns):
                return self.columns[n]
            raise CallpathError(f"column {key!r}: expected $0..${len(self.columns) - 1}")
        for c in self.columns:
            if c.title == key:
                return c
        for c in self.columns:
            if c.metric is not None and c.scope == "inclusive" \
                    and self.source.metrics[c.metric].name == key:
                return c
        return self.columns[resolve_name(key, [c.title for c in self.columns], "column")]

    def for_metric(self, key: str | int) -> list[ColumnDef]:
        """The inclusive and exclusive columns of a measured metric, or the one column of a
        derived metric / configured column named ``key``."""
        if isinstance(key, int):
            k = self.source.metric_index(key)
            return [self.columns[2 * k], self.columns[2 * k + 1]]
        # the measured metrics and the columns that stand alone (derived, configured), under
        # the one resolver of every --metric: a prefix that fits several is ambiguous
        measured = [self.source.metrics[c.metric].name for c in self.columns
                    if c.metric is not None and c.scope == "inclusive"]
        named = [c for c in self.columns if c.metric is None]
        i = resolve_name(key, measured + [c.title for c in named])
        if i < len(measured):
            return [self.columns[2 * i], self.columns[2 * i + 1]]
        return [named[i - len(measured)]]

    # ---- values --------------------------------------------------------------------------

    def values(self, view: View, col: ColumnDef | int) -> F64:
        """The column's value for every materialized node of ``view``."""
        c = self.columns[col] if isinstance(col, int) else col
        per_view = self._cache.setdefault(view, {})
        key = (c.id, len(view))
        hit = per_view.get(key)
        if hit is not None:
            return hit
        if c.metric is not None:
            out = self._measured(view, c.metric, c.scope)
        elif c.derived is not None:
            formula = c.derived.parsed
            out = formula.evaluate(lambda n: self.values(view, n),
                                   lambda n: float(self.values(view, n)[0]), len(view))
        elif c.spec is not None:
            out = evaluate_column(c.spec, lambda name, ctxs: self._config_operand(
                view, name, ctxs, c.scope))
        else:  # pragma: no cover - every ColumnDef has one of the three
            raise CallpathError(f"column {c.title!r} has nothing to compute")
        per_view[key] = out
        return out

    def _measured(self, view: View, k: int, scope: str, source: TreeSource | None = None
                  ) -> F64:
        """A measured metric's column in ``view``, from ``source`` (default: this set's);
        the view's own cached values when that is the view's source."""
        src = source or self.source
        if src is view.source:
            return view.inclusive(k) if scope == "inclusive" else view.exclusive(k)
        incl, excl = view.values_for(src, k)
        return incl if scope == "inclusive" else excl

    def with_source(self, source: TreeSource) -> ColumnSet:
        """The same columns computed from another source over the same tree (another
        execution-context selection)."""
        derived = [c.derived for c in self.columns if c.derived is not None]
        specs = [c.spec for c in self.columns if c.spec is not None and c.scope == "inclusive"]
        return ColumnSet(source, derived, specs)

    def aggregate_scalar(self, view: View, col: ColumnDef) -> float | None:
        """For a derived metric with the percent annotation: its formula on the aggregates."""
        if col.derived is None or not col.derived.percent:
            return None
        return col.derived.parsed.evaluate_scalar(lambda n: float(self.values(view, n)[0]))

    def _config_operand(self, view: View, metric_name: str,
                        ctxs: npt.NDArray[np.int64] | None, scope: str) -> F64:
        k = self.source.metric_index(metric_name)
        if ctxs is None:
            src = self.source
        else:
            contexts = self.source.exp.contexts
            profiles = tuple(contexts[int(i)].index for i in ctxs)
            src_hit = self._ctx_sources.get(profiles)
            if src_hit is None:
                src_hit = self.source.with_profiles(profiles)
                self._ctx_sources[profiles] = src_hit
            src = src_hit
        return self._measured(view, k, scope, src)
