"""An opened database and the cache of what was built from it, for the viewer's requests.

Building a view of a 10^6-node tree costs tens to hundreds of milliseconds (a filter, a
Bottom-up root level, the Flat structure); expanding a node or re-sorting must not pay that
again. So each database keeps small LRU caches: tree sources per (filters, threads), views
per (filters, threads, view), column sets per (filters, threads, derived). Column values are
cached by the analysis layer itself per view. A lock per database serialises work on it:
views materialize nodes as they are expanded, and uvicorn runs handlers in threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from callpath.analysis.columns import ColumnDef, ColumnSet
from callpath.analysis.source import TreeSource
from callpath.analysis.topdown import View
from callpath.engine.compose import columns_of, source_of, view_of
from callpath.engine.keys import NodeKeys
from callpath.engine.sources import Servable
from callpath.engine.state import ViewState
from callpath.errors import CallpathError
from callpath.model import Experiment

K = TypeVar("K")
V = TypeVar("V")

CACHE_SIZE = 8


class LRU(Generic[K, V]):
    """A tiny least-recently-used map."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._d: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, make: Callable[[], V]) -> V:
        hit = self._d.get(key)
        if hit is not None:
            self._d.move_to_end(key)
            return hit
        val = make()
        self._d[key] = val
        while len(self._d) > self.size:
            self._d.popitem(last=False)
        return val

    def peek(self, key: K) -> bool:
        return key in self._d

    def clear(self) -> None:
        self._d.clear()


@dataclass
class Built:
    """Everything a request about one view state needs."""

    state: ViewState
    source: TreeSource
    view: View
    columns: ColumnSet
    keys: NodeKeys
    n_metrics: int

    def column_key(self, c: ColumnDef) -> str:
        if c.metric is not None:
            return f"m{c.metric}{'i' if c.scope == 'inclusive' else 'e'}"
        return f"d{c.id - 2 * self.n_metrics}"

    def column(self, key: str, what: str = "column") -> ColumnDef:
        """The column a key names (``m<k>i``, ``m<k>e``, ``d<i>``)."""
        cols = self.columns.columns
        idx = -1
        if len(key) >= 3 and key[0] == "m" and key[-1] in "ie" and key[1:-1].isdigit():
            k = int(key[1:-1])
            if k < self.n_metrics:
                idx = 2 * k + (0 if key[-1] == "i" else 1)
        elif len(key) >= 2 and key[0] == "d" and key[1:].isdigit():
            i = int(key[1:])
            if 2 * self.n_metrics + i < len(cols):
                idx = 2 * self.n_metrics + i
        if idx < 0:
            known = ", ".join(self.column_key(c) for c in cols[:12])
            raise CallpathError(f"{what} {key[:40]!r}: unknown column (expected one of "
                                f"{known}{', ...' if len(cols) > 12 else ''})")
        return cols[idx]

    def node(self, key: str | None, default: int = 0) -> int:
        if key is None or key == "":
            return default
        return self.keys.resolve(key)

    def start(self) -> int:
        """The node shown as the root: the zoom node, else the root."""
        return self.node(self.state.zoom)


@dataclass
class Database:
    """One opened database."""

    id: int
    path: Path
    exp: Experiment
    lock: threading.RLock = field(default_factory=threading.RLock)
    # a filtered source of a 10^6-node tree holds ~60 MB of columns, a view up to ~100 MB
    _sources: LRU[tuple[object, ...], TreeSource] = field(default_factory=lambda: LRU(4))
    _views: LRU[tuple[object, ...], tuple[View, NodeKeys]] = field(
        default_factory=lambda: LRU(6))
    _columns: LRU[tuple[object, ...], ColumnSet] = field(default_factory=LRU)
    trace_cache: dict[str, object] = field(default_factory=dict)
    _servable: Servable | None = None
    # views being built ahead of time (see :meth:`warm_up`), by view-cache key
    _warm: dict[tuple[object, ...], Future[tuple[View, NodeKeys]]] = field(default_factory=dict)
    _prefetch: dict[str, Future[object]] = field(default_factory=dict)
    _pool: ThreadPoolExecutor | None = None

    @property
    def name(self) -> str:
        return self.path.name

    def build(self, state: ViewState) -> Built:
        """The source, view and columns of a state, from the caches when possible. Call with
        ``self.lock`` held."""
        skey = state.source_key
        source = self._sources.get(skey, lambda: self._make_source(state))
        vkey = (*skey, state.view)
        pending = self._warm.pop(vkey, None)
        if pending is not None and not pending.cancel():
            # being built in the background right now: wait for it rather than redo it (a
            # build still queued behind others was cancelled: building it here is sooner)
            self._views.get(vkey, pending.result)
        view, keys = self._views.get(vkey, lambda: self._make_view(state, source))
        columns = self._columns.get((*skey, state.derived),
                                    lambda: columns_of(source, state.derived))
        return Built(state, source, view, columns, keys, len(self.exp.metrics))

    def warm_up(self, state: ViewState, *, including: bool = False) -> None:
        """Build the other two views of ``state`` in a background thread, so that switching
        tabs finds them ready: a Flat or Bottom-up view of a 10^6-node tree takes about a
        second to build, tab switches should take milliseconds. Call with the lock held."""
        from callpath.analysis.topdown import VIEW_NAMES

        skey = state.source_key
        source = self._sources.get(skey, lambda: self._make_source(state))
        for name in VIEW_NAMES:
            vkey = (*skey, name)
            if (name == state.view and not including) or vkey in self._warm \
                    or self._views.peek(vkey):
                continue
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"callpath-warm-{self.id}")
            self._warm[vkey] = self._pool.submit(self._prebuild, name, source)

    def anticipate(self, state: ViewState) -> None:
        """After the first page of a view was served: build the other views (the user may
        switch tabs next) and index the traces (... or open the trace view), both in the
        background thread. Call with the lock held. The one place a request starts
        background work."""
        from callpath.engine.traces import prefetch

        self.warm_up(state)
        prefetch(self)

    def servable(self) -> Servable:
        """Which recorded source files can be shown (built once per database)."""
        if self._servable is None:
            self._servable = Servable(self.path, self.exp)
        return self._servable

    def close(self) -> None:
        """Drop queued background work (the running item finishes on its own)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def prefetch(self, key: str, make: Callable[[], object]) -> None:
        """Compute something in the background thread (after any view builds), once; a
        later :meth:`take` waits for it. Call with the lock held."""
        if key in self._prefetch or key in self.trace_cache:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"callpath-warm-{self.id}")
        self._prefetch[key] = self._pool.submit(make)

    def take(self, key: str) -> object | None:
        """The result of a :meth:`prefetch` under way (waiting for it); None when there was
        none, or it was still queued (then cancelled: the caller computes it sooner)."""
        fut = self._prefetch.pop(key, None)
        if fut is None or fut.cancel():
            return None
        return fut.result()

    def _prebuild(self, name: str, source: TreeSource) -> tuple[View, NodeKeys]:
        view = view_of(name, source)
        view.children(0)  # child lists (a sort over the tree in Top-down)
        for k in range(len(source.metrics)):  # the values every page shows
            view.inclusive(k)
            view.exclusive(k)
        return view, NodeKeys(view)

    def _make_source(self, state: ViewState) -> TreeSource:
        profiles = [self.exp.contexts[i].index for i in state.threads] if state.threads \
            else None
        return source_of(self.exp, profiles, state.filters)

    @staticmethod
    def _make_view(state: ViewState, source: TreeSource) -> tuple[View, NodeKeys]:
        view = view_of(state.view, source)
        return view, NodeKeys(view)


def open_databases(paths: list[str], warm: bool = True, index_traces: bool = False
                   ) -> list[Database]:
    """Open every database named on the command line (one-line error for a bad one) and,
    with ``warm``, start building each one's three views in the background (Top-down
    first): the browser's first request typically comes a moment later, and finds it built
    or under way. With ``index_traces``, the trace index is queued after them."""
    import callpath
    from callpath.engine.traces import prefetch

    out = []
    for i, p in enumerate(paths):
        exp = callpath.open(p)
        if not exp.metrics:
            raise CallpathError(f"{p}: the database has no metrics to view")
        out.append(Database(i, Path(p).resolve(), exp))
    if warm:
        for db in out:
            with db.lock:
                db.warm_up(ViewState(), including=True)
    if index_traces:
        for db in out:
            with db.lock:
                prefetch(db)
    return out
