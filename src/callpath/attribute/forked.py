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


def chunks(items: Sequence[T], n: int) -> list[Sequence[T]]:
    """``n`` contiguous, nearly equal chunks (in order)."""
    bounds = np.linspace(0, len(items), n + 1).round().astype(int)
    return [items[bounds[i]:bounds[i + 1]] for i in range(n)]


def map_chunks(fn: Callable[[Sequence[T]], R], items: Sequence[T], workers: int) -> list[R]:
    """``[fn(chunk) for chunk in chunks(items, workers)]``: the last chunk in this process,
    the others in forked workers (:func:`~callpath.structure.parallel.fork_map`: a worker's
    error is raised here, a worker killed by a signal is an error, never a hang)."""
    workers = max(1, min(workers, len(items)))
    if workers == 1:
        return [fn(items)]
    return fork_map(fn, list(chunks(items, workers)))
