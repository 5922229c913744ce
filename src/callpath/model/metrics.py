"""Metric descriptors, following the v4 database's three-level description.

A *metric* (``CPUTIME (sec)``) is measured per context. Its *propagated* values exist per
propagation scope (``point``: as measured; ``function``: exclusive; ``execution``: inclusive;
others such as ``lex_aware`` are custom) and are identified by a ``prop_metric_id`` in
per-execution-context profiles. *Summary statistics* combine the propagated values of all
execution contexts (sum, min, max of a formula such as ``$$`` or ``$$^2``) and are identified by
a ``stat_metric_id`` in the summary profile. Keeping this structure lets a database be written
back exactly and lets views pick inclusive/exclusive values without guessing from names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from callpath.errors import CallpathError


class ScopeType(IntEnum):
    """The v4 propagation scope ``type`` enumeration."""

    CUSTOM = 0
    POINT = 1
    EXECUTION = 2
    TRANSITIVE = 3


class Combine(IntEnum):
    """The v4 summary statistic ``combine`` enumeration."""

    SUM = 0
    MIN = 1
    MAX = 2


COMBINE_NAMES = {Combine.SUM: "sum", Combine.MIN: "min", Combine.MAX: "max"}


@dataclass(frozen=True)
class PropagationScope:
    name: str
    type: ScopeType
    propagation_index: int = 255  # bit in the contexts' propagation mask (TRANSITIVE only)


# The scopes every database written by callpath uses, in HPCToolkit's order.
POINT = PropagationScope("point", ScopeType.POINT)
FUNCTION = PropagationScope("function", ScopeType.TRANSITIVE, 0)
EXECUTION = PropagationScope("execution", ScopeType.EXECUTION)


@dataclass(frozen=True)
class ScopeInstance:
    """A propagated sub-metric: ``scope`` indexes ``Experiment.scopes``."""

    scope: int
    prop_metric_id: int


@dataclass(frozen=True)
class SummaryStatistic:
    """A summary statistic over execution contexts: ``formula`` (``$$`` is the value) is applied
    to each context's propagated value, then combined with ``combine``."""

    scope: int
    formula: str
    combine: Combine
    stat_metric_id: int


@dataclass
class Metric:
    """One measured metric with its propagated sub-metrics and summary statistics."""

    name: str
    scope_insts: list[ScopeInstance] = field(default_factory=list)
    summaries: list[SummaryStatistic] = field(default_factory=list)
    description: str = ""
    unit: str = ""
    period: float = 1.0

    def prop_id(self, scopes: list[PropagationScope], scope_name: str) -> int | None:
        """The ``prop_metric_id`` of this metric in the named scope, if measured there."""
        for inst in self.scope_insts:
            if scopes[inst.scope].name == scope_name:
                return inst.prop_metric_id
        return None

    def stat_id(self, scopes: list[PropagationScope], scope_name: str,
                combine: Combine = Combine.SUM, formula: str = "$$") -> int | None:
        """The ``stat_metric_id`` of a summary statistic, if the database has it."""
        for s in self.summaries:
            if (scopes[s.scope].name == scope_name and s.combine == combine
                    and s.formula == formula):
                return s.stat_metric_id
        return None


def resolve_name(key: str, names: Sequence[str], what: str = "metric") -> int:
    """Index of the name ``key`` designates among ``names``: the exact name, else the one
    name equal to it ignoring case, else the one name it begins (ignoring case); a string of
    digits that is no name is an index.

    Every command that takes a metric (``report -m``, ``lines -m``, ``export --metric``, the
    viewer's columns) resolves it here, so one spelling means the same everywhere. A key that
    fits several names is an error that lists exactly those (``-m REALTIME`` fits both
    ``REALTIME (sec)`` and ``REALTIME (samples)``; picking one would silently report the
    other unit); one that fits none lists all of them."""
    if key in names:
        return list(names).index(key)
    if key.isdigit():
        n = int(key)
        if 0 <= n < len(names):
            return n
        raise CallpathError(f"{what} index {n} out of range (0..{len(names) - 1})")
    low = key.lower()
    hits = [i for i, n in enumerate(names) if n.lower() == low]
    if not hits:
        hits = [i for i, n in enumerate(names) if n.lower().startswith(low)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise CallpathError(f"ambiguous {what} {key!r}: matches "
                            f"{', '.join(repr(names[i]) for i in hits)}")
    raise CallpathError(f"unknown {what} {key!r}: expected one of "
                        f"{', '.join(repr(n) for n in names)}")
