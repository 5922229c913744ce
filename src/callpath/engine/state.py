"""What one look at a database is: which view, filters, derived metrics, thread selection,
flatten level and zoom node. The viewer parses it from a request
(:mod:`callpath.view.params`); the engine caches what it builds per state
(:mod:`callpath.engine.database`)."""

from __future__ import annotations

from dataclasses import dataclass

from callpath.analysis.derived import DerivedMetric
from callpath.analysis.tree_filters import Filter


@dataclass(frozen=True)
class ViewState:
    """Hashable, so that built views can be cached per state."""

    view: str = "top-down"
    filters: tuple[Filter, ...] = ()
    derived: tuple[DerivedMetric, ...] = ()
    threads: tuple[int, ...] = ()
    flatten: int = 0
    zoom: str | None = None

    @property
    def source_key(self) -> tuple[tuple[Filter, ...], tuple[int, ...]]:
        """What the tree source depends on."""
        return (tuple(f for f in self.filters if f.enabled), self.threads)
