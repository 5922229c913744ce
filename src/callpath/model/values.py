"""Sparse metric values per execution context and per calling context, and traces.

The v4 database stores the same tensor (profile x context x metric) twice: profile-major in
``profile.db`` and context-major in ``cct.db``. Both are kept here as flat numpy arrays in the
exact on-disk order (CSR-like: an index array of starts plus a packed value array), so a reader
can hand out zero-copy views of a memory map and a writer can emit them unchanged. Stores load
blocks lazily: opening a database with 64 execution contexts touches none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
B = TypeVar("B")


@dataclass
class ProfileBlock:
    """The values of one execution context: contexts ``ctx_ids`` (sorted, non-empty ones only);
    the values of ``ctx_ids[k]`` are ``values[starts[k]:starts[k+1]]`` with metric identifiers
    ``metric_ids`` (sorted within each context)."""

    ctx_ids: npt.NDArray[np.uint32]
    starts: npt.NDArray[np.uint64]
    metric_ids: npt.NDArray[np.uint16]
    values: F64
    _ctx_of_values: npt.NDArray[np.uint32] | None = field(default=None, repr=False,
                                                          compare=False)

    @classmethod
    def empty(cls) -> ProfileBlock:
        return cls(np.zeros(0, np.uint32), np.zeros(0, np.uint64), np.zeros(0, np.uint16),
                   np.zeros(0, np.float64))

    @classmethod
    def from_triples(cls, ctx: npt.ArrayLike, metric: npt.ArrayLike,
                     value: npt.ArrayLike) -> ProfileBlock:
        """Build from unsorted (context, metric, value) triples; zeros are dropped, duplicates
        are summed."""
        c = np.asarray(ctx, dtype=np.uint64)
        m = np.asarray(metric, dtype=np.uint64)
        v = np.asarray(value, dtype=np.float64)
        key = (c << np.uint64(16)) | m
        ukey, inv = np.unique(key, return_inverse=True)
        vals = np.zeros(len(ukey), dtype=np.float64)
        np.add.at(vals, inv, v)
        keep = vals != 0
        ukey, vals = ukey[keep], vals[keep]
        cs = (ukey >> np.uint64(16)).astype(np.uint32)
        ms = (ukey & np.uint64(0xFFFF)).astype(np.uint16)
        ctx_ids, starts = np.unique(cs, return_index=True)
        return cls(ctx_ids, starts.astype(np.uint64), ms, vals)

    def __len__(self) -> int:
        return len(self.values)

    def ctx_of_values(self) -> npt.NDArray[np.uint32]:
        """The context identifier of every value (expands the CSR index once, then cached:
        every ``dense`` call of a summary profile needs it)."""
        if self._ctx_of_values is None:
            counts = np.diff(np.append(self.starts.astype(np.int64), len(self.values)))
            self._ctx_of_values = np.repeat(self.ctx_ids, counts)
        return self._ctx_of_values

    def dense(self, metric_id: int, n_slots: int) -> F64:
        """Values of one metric for every context identifier ``0..n_slots-1`` (0 if absent)."""
        out = np.zeros(n_slots, dtype=np.float64)
        sel = self.metric_ids == metric_id
        ctx = self.ctx_of_values()[sel].astype(np.int64)
        ok = ctx < n_slots
        out[ctx[ok]] = self.values[sel][ok]
        return out


@dataclass
class ContextBlock:
    """The values of one calling context across execution contexts (``cct.db`` layout): metric
    ``metric_ids[k]`` has values ``values[starts[k]:starts[k+1]]`` for profiles
    ``prof_indices`` (sorted within each metric)."""

    metric_ids: npt.NDArray[np.uint16]
    starts: npt.NDArray[np.uint64]
    prof_indices: npt.NDArray[np.uint32]
    values: F64

    @classmethod
    def empty(cls) -> ContextBlock:
        return cls(np.zeros(0, np.uint16), np.zeros(0, np.uint64), np.zeros(0, np.uint32),
                   np.zeros(0, np.float64))

    def metric_of_values(self) -> npt.NDArray[np.uint16]:
        counts = np.diff(np.append(self.starts.astype(np.int64), len(self.values)))
        return np.repeat(self.metric_ids, counts)


class BlockStore(Generic[B]):
    """A sequence of blocks loaded on demand by a loader function and cached.

    Readers pass a loader that decodes one block from a memory map; code that builds an
    experiment in memory passes the blocks themselves (:meth:`of`)."""

    def __init__(self, count: int, loader: Callable[[int], B]) -> None:
        self._count = count
        self._loader = loader
        self._cache: dict[int, B] = {}

    @classmethod
    def of(cls, blocks: Sequence[B]) -> BlockStore[B]:
        items = list(blocks)
        return cls(len(items), items.__getitem__)

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: int) -> B:
        if not 0 <= index < self._count:
            raise IndexError(index)
        blk = self._cache.get(index)
        if blk is None:
            blk = self._loader(index)
            self._cache[index] = blk
        return blk

    def __iter__(self) -> Iterator[B]:
        return (self[i] for i in range(self._count))


ProfileStore = BlockStore[ProfileBlock]
ContextStore = BlockStore[ContextBlock]


@dataclass
class ContextMajor:
    """All non-summary values sorted by (context, metric, profile): the order of ``cct.db``."""

    ctx: npt.NDArray[np.uint32]
    metric: npt.NDArray[np.uint16]
    prof: npt.NDArray[np.uint32]
    values: F64
    n_ctx_slots: int

    def bounds(self) -> npt.NDArray[np.int64]:
        """``bounds[c]:bounds[c+1]`` is the slice of context ``c``."""
        return np.searchsorted(self.ctx, np.arange(self.n_ctx_slots + 1)).astype(np.int64)

    def block(self, c: int, bounds: npt.NDArray[np.int64]) -> ContextBlock:
        lo, hi = int(bounds[c]), int(bounds[c + 1])
        mids, mstarts = np.unique(self.metric[lo:hi], return_index=True)
        return ContextBlock(mids.astype(np.uint16), mstarts.astype(np.uint64),
                            self.prof[lo:hi], self.values[lo:hi])

    def store(self) -> ContextStore:
        bounds = self.bounds()
        return BlockStore(self.n_ctx_slots, lambda c: self.block(c, bounds))


def transpose(profiles: ProfileStore, n_ctx_slots: int, summary_profiles: set[int]
              ) -> ContextMajor:
    """Context-major order (``cct.db``) from profile-major blocks, skipping summary profiles:
    one stable sort over all values, no per-context Python loop."""
    ctx_parts = [np.zeros(0, np.uint32)]
    met_parts = [np.zeros(0, np.uint16)]
    prof_parts = [np.zeros(0, np.uint32)]
    val_parts = [np.zeros(0, np.float64)]
    for p in range(len(profiles)):
        if p in summary_profiles:
            continue
        blk = profiles[p]
        ctx_parts.append(blk.ctx_of_values())
        met_parts.append(np.asarray(blk.metric_ids))
        prof_parts.append(np.full(len(blk), p, dtype=np.uint32))
        val_parts.append(np.asarray(blk.values))
    ctx = np.concatenate(ctx_parts)
    met = np.concatenate(met_parts)
    prof = np.concatenate(prof_parts)
    val = np.concatenate(val_parts)
    # Blocks are in profile order and each is sorted by (context, metric), so one stable sort
    # on the combined (context, metric) key yields (context, metric, profile) order.
    key = (ctx.astype(np.uint64) << np.uint64(16)) | met.astype(np.uint64)
    order = np.argsort(key, kind="stable")
    return ContextMajor(ctx[order], met[order], prof[order], val[order], n_ctx_slots)


@dataclass
class TraceLine:
    """The trace of one execution context: sample times (ns since the epoch) and the context
    identifier sampled at each (0 = not running)."""

    prof_index: int
    timestamps: npt.NDArray[np.uint64]
    ctx_ids: npt.NDArray[np.uint32]


@dataclass
class Traces:
    min_timestamp: int
    max_timestamp: int
    lines: list[TraceLine]
