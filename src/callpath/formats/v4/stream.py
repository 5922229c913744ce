"""Streaming assembly of ``profile.db`` and ``cct.db``: bounded memory, optionally parallel.

The two files hold the same values twice, profile-major and context-major. Holding every
profile block and a transposed copy in memory cost 7.5 GB for 256 execution contexts of a
200,000-context tree, so values are streamed through files instead:

1. **Spool** (per chunk of profiles, in a worker when a :data:`Mapper` forks): each profile's
   block is produced (e.g. computed on demand by ``callpath prof``) and written at once in
   its ``profile.db`` form; what is kept is small: where the block's values cross fixed
   context-id boundaries ("buckets"), and per context how many values and which metrics it
   has. Only one block is alive at a time. The first chunk is written straight into
   ``profile.db``, right behind its fixed-size headers (so one worker, or ``-j 1``, writes
   every block exactly once, in place); the other chunks cannot know where they start
   before the chunks ahead of them are done, so they go to spool files (8-byte aligned,
   position independent).
2. **Transpose** (per run of buckets, in a worker): the values of one context range are
   read back from ``profile.db`` and the spools (two ``pread`` per profile: its context
   index and its values in the range) and put in (context, metric) order, profiles
   ascending inside a pair, which is ``cct.db``'s order, then encoded and written in
   place: from the counts every block's offset is known before the transpose starts. A
   piece holds about a million values. The bytes read from a spool are also written at
   their final place in ``profile.db`` on the way (``pwrite``): every byte of a spooled
   block is read for the transpose anyway, so this replaces a separate copy of the spools
   (a second read of a gigabyte and its page-cache traffic).
3. **Assembly** (in the caller): ``cct.db``'s header and index come from those counts;
   ``profile.db``'s headers, and the summary block behind the other profiles' blocks, are
   written last. The files are byte-identical to the ones written from memory, and do not
   depend on how the profiles were split into chunks.

Forked workers inherit the job through :data:`STATE` (set before mapping), so the value
source, which may hold a whole tree, is never pickled; only small results come back.

This module holds what the callers of the writer see: the :class:`ValueSource` the values
come from, the :data:`Mapper` that shares the work out, the transposed :class:`Groups`, and
:data:`STATE`. The phases live beside it, one module each, because each is a unit of its
own (its job, its worker function, its file layout): :mod:`~callpath.formats.v4.blocks`
(``profile.db``'s blocks in their on-disk form), :mod:`~callpath.formats.v4.spool` (phase 1
and the copies of phase 3), :mod:`~callpath.formats.v4.transpose` (phase 2) and
:mod:`~callpath.formats.v4.fileio` (the positional writes and copies they share).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from callpath.model.experiment import Experiment
from callpath.model.values import ProfileBlock

I64 = npt.NDArray[np.int64]

class Mapper(Protocol):
    """``mapper(fn, items, weights=None)`` = ``[fn(chunk) for chunk in <contiguous chunks of
    items>]``, the chunks in order, of nearly equal total ``weights`` (the estimated cost of
    each item; equal counts without); :func:`serial` runs one chunk in this process."""

    def __call__(self, fn: Callable[[Sequence[int]], Any], items: Sequence[int], /,
                 weights: Sequence[float] | None = None) -> list[Any]: ...

#: What forked workers inherit: the job being written (set by
#: :func:`~callpath.formats.v4.spool.spool_profiles` and
#: :func:`~callpath.formats.v4.transpose.transpose_buckets` around their mapping).
STATE: dict[str, Any] = {}


def serial(fn: Callable[[Sequence[int]], Any], items: Sequence[int], /,
           weights: Sequence[float] | None = None) -> list[Any]:
    """The :class:`Mapper` that runs everything here, as one chunk."""
    return [fn(items)]


@dataclass
class Groups:
    """The values of some (context, metric) pairs over the non-summary profiles, in ``cct.db``
    order: pair ``g`` is ``ctx[g], metric[g]`` with values ``values[starts[g]:starts[g+1]]``
    (``starts`` has one more entry) of profiles ``prof[...]``, ascending."""

    ctx: npt.NDArray[np.uint32]
    metric: npt.NDArray[np.uint16]
    starts: I64
    prof: npt.NDArray[np.uint32]
    values: npt.NDArray[np.float64]


@dataclass
class ValueSource:
    """Where the value blocks of a database come from while it is written.

    ``block(i)`` gives profile ``i``'s block (called once per profile, in a worker when
    ``parallel`` forks, and not kept); ``on_groups``, if set, is called in the workers on every
    transposed piece (:class:`Groups`) and its results, in context order, are handed to
    ``summary``, which then gives profile 0's block (statistics over the execution contexts
    come out of the transpose for free). Without ``summary``, profile 0 is ``block(0)``.

    ``bound(i)``, if set, gives upper bounds of the value and context counts of profile
    ``i``'s block, cheaper than the block: with them, every chunk of profiles is written
    straight into ``profile.db`` at the place the bounds predict (exact when the bounds are;
    a chunk found elsewhere is moved, see
    :func:`~callpath.formats.v4.spool.place_spools`).
    """

    block: Callable[[int], ProfileBlock]
    parallel: Mapper = serial
    on_groups: Callable[[Groups], Any] | None = None
    summary: Callable[[list[Any]], ProfileBlock] | None = None
    bound: Callable[[int], tuple[int, int]] | None = None


def value_source(exp: Experiment) -> ValueSource:
    """The experiment's own source when it carries one (``callpath prof``'s experiments
    compute their blocks on demand), else its stored blocks, written by this process."""
    src = getattr(exp, "value_source", None)
    return src if isinstance(src, ValueSource) else ValueSource(exp.values.__getitem__)
