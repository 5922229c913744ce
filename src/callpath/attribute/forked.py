"""Mapping a function over chunks of work in forked worker processes.

Forked, so that what the parent prepared (structures, the final tree) is shared copy-on-write
through :data:`STATE` instead of being pickled to each worker; results come back in order.
The parent does the last chunk itself while the workers do the others: it would only wait
otherwise, and its result (a partial tree of half the contexts at ``-j 2``) is neither
pickled nor unpickled. A worker that fails or dies is an error in the parent, not a hang
(a ``multiprocessing`` pool waits forever for a worker killed by the out-of-memory killer,
and for a result whose exception cannot be unpickled).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from callpath.structure.parallel import fork_map

T = TypeVar("T")
R = TypeVar("R")

#: What forked workers inherit from the parent; set before forking, cleared after.
STATE: dict[str, Any] = {}


def chunks(items: Sequence[T], n: int, weights: Sequence[float] | None = None
           ) -> list[Sequence[T]]:
    """``n`` contiguous chunks (in order) of nearly equal size, or of nearly equal total
    ``weights`` (one per item): each cut at the item boundary nearest to its share."""
    if weights is None or len(weights) != len(items) or not len(items):
        bounds = np.linspace(0, len(items), n + 1).round().astype(int)
    else:
        cum = np.concatenate([[0.0], np.cumsum(np.maximum(np.asarray(weights, float), 0))])
        target = cum[-1] * np.arange(1, n) / n
        after = np.searchsorted(cum, target).clip(1, len(items))
        nearer = np.where(target - cum[after - 1] < cum[after] - target, after - 1, after)
        bounds = np.maximum.accumulate(np.concatenate([[0], nearer, [len(items)]]))
    return [items[bounds[i]:bounds[i + 1]] for i in range(n)]


def map_chunks(fn: Callable[[Sequence[T]], R], items: Sequence[T], /, workers: int,
               weights: Sequence[float] | None = None) -> list[R]:
    """``[fn(chunk) for chunk in chunks(items, workers, weights)]``: the last chunk in this
    process, the others in forked workers (:func:`~callpath.structure.parallel.fork_map`: a
    worker's error is raised here, a worker killed by a signal is an error, never a hang)."""
    workers = max(1, min(workers, len(items)))
    if workers == 1:
        return [fn(items)]
    return fork_map(fn, list(chunks(items, workers, weights)))
