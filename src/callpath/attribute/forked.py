"""Mapping a function over chunks of work in forked worker processes.

Forked, so that what the parent prepared (structures, the final tree) is shared copy-on-write
through :data:`STATE` instead of being pickled to each worker; results come back in order.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
R = TypeVar("R")

#: What forked workers inherit from the parent; set before forking, cleared after.
STATE: dict[str, Any] = {}


def chunks(items: Sequence[T], n: int) -> list[Sequence[T]]:
    """``n`` contiguous, nearly equal chunks (in order)."""
    bounds = np.linspace(0, len(items), n + 1).round().astype(int)
    return [items[bounds[i]:bounds[i + 1]] for i in range(n)]


def map_chunks(fn: Callable[[Sequence[T]], R], items: Sequence[T], workers: int) -> list[R]:
    """``[fn(chunk) for chunk in chunks(items, workers)]``, the chunks in forked workers."""
    workers = max(1, min(workers, len(items)))
    if workers == 1:
        return [fn(items)]
    try:
        ctx = multiprocessing.get_context("fork")
    except ValueError:  # no fork on this platform
        return [fn(items)]
    with ctx.Pool(workers) as pool:
        return pool.map(fn, chunks(items, workers))
