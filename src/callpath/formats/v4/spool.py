"""Phase 1 of the streamed writer (:mod:`~callpath.formats.v4.stream`): every profile's block
written in its ``profile.db`` form, in place or to a spool file, with the small summary kept
of it (:class:`Spool`, :class:`PairCounts`); then the spools' places in ``profile.db``, and in
phase 3 the copy of the spooled blocks the transpose did not copy on its way.

Why a module of its own: this is the part of the job that runs per chunk of profiles in a
forked worker (:func:`_spool_chunk`), and what it keeps is all the later phases know of the
values before they read them back.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.formats.v4.blocks import (
    PROFILE_INDEX,
    block_size,
    pad_to,
    sorted_block,
    write_profile_block,
)
from callpath.formats.v4.fileio import Writer, copy_file, create_file, shared_writes
from callpath.formats.v4.stream import I64, STATE, ValueSource


def _spool_path(directory: Path, first: int) -> Path:
    """The spool file of the chunk of profiles that starts at profile ``first``."""
    return directory / f"profiles-{first}.spool"


@dataclass
class Spool:
    """What one chunk of profiles left on disk (small; comes back from a worker)."""

    profiles: I64  # profile indices, ascending
    path: Path  # profile.db form of their blocks, from ``origin`` (8-aligned)
    size: int  # bytes, a multiple of 8
    n_values: I64
    p_values: I64  # relative to the spool's start
    n_ctxs: I64
    p_ctxs: I64
    cut_ctx: I64  # [k, b]: where bucket b starts in profile k's context index
    cut_val: I64  # [k, b]: ... and in its values (all 0 for a profile not in cct.db)
    pairs: PairCounts  # of the transposed profiles
    origin: int = 0  # where the spool starts in ``path``
    in_place: bool = False  # ``path`` is profile.db itself: nothing to copy
    dest: int = -1  # where the spool goes in profile.db (set once the sizes are known)

    def uncopied(self) -> I64:
        """Positions ``k`` of the blocks that the transpose does not copy into profile.db
        on its way (it copies the bucket ranges it reads; a profile not in ``cct.db``, or
        with a context index but no value, has none): the caller copies them whole."""
        if self.in_place:
            return np.zeros(0, dtype=np.int64)
        read = (self.cut_ctx[:, -1] == self.n_ctxs) & (self.cut_val[:, -1] == self.n_values)
        return np.flatnonzero(~read & ((self.n_ctxs > 0) | (self.n_values > 0)))

    @property
    def runs(self) -> I64:
        """[k, b]: how many values of profile ``profiles[k]`` bucket ``b`` holds."""
        return np.diff(self.cut_val, axis=1)

    @property
    def top_ctx(self) -> int:
        """1 + the largest context id with a transposed value (0 if none)."""
        return self.pairs.top


class PairCounts:
    """Per context id: how many values it has, and which metrics have one, over the profiles
    added; from these ``cct.db``'s layout is known before it is transposed, so the
    transposing workers write their pieces in place. Metric ids get columns as they appear."""

    def __init__(self, rows: int) -> None:
        self.values = np.zeros(rows, dtype=np.int64)
        self.col_of = np.full(1 << 16, -1, dtype=np.int64)
        self.ids: list[int] = []
        self.present = np.zeros((rows, 0), dtype=bool)
        self.top = 0

    def add(self, ctx: npt.NDArray[np.uint32], metric: npt.NDArray[np.uint16]) -> None:
        """The values of one profile (sorted by context)."""
        if not len(ctx):
            return
        self.top = max(self.top, int(ctx[-1]) + 1)
        rows = len(self.values)
        if self.top > rows:
            rows = max(self.top, rows + rows // 4)
            self.values = np.concatenate([self.values,
                                          np.zeros(rows - len(self.values), np.int64)])
            grow = np.zeros((rows - len(self.present), self.present.shape[1]), dtype=bool)
            self.present = np.concatenate([self.present, grow])
        ids = np.flatnonzero(np.bincount(metric))
        new = ids[self.col_of[ids] < 0]
        if len(new):
            self.col_of[new] = len(self.ids) + np.arange(len(new))
            self.ids += new.tolist()
            self.present = np.concatenate(
                [self.present, np.zeros((len(self.present), len(new)), dtype=bool)], axis=1)
        self.values += np.bincount(ctx, minlength=rows)
        width = self.present.shape[1]
        self.present.reshape(-1)[ctx.astype(np.int64) * width + self.col_of[metric]] = True


@dataclass
class _Job:
    source: ValueSource
    directory: Path  # for the temporary files
    transposed: npt.NDArray[np.bool_]  # per profile: its values go to cct.db
    bounds: I64  # context ids where buckets start (+ an open end)
    rows: int  # context ids expected (more are counted if they come)
    first: tuple[Path, int] | None  # profile.db and where the first chunk goes in it
    region: I64 | None = None  # per profile: where its block is predicted to start (+ end)


def spool_profiles(source: ValueSource, directory: Path, transposed: npt.NDArray[np.bool_],
                   bounds: I64, n_slots: int, first: tuple[Path, int] | None = None
                   ) -> list[Spool]:
    """Phase 1 over profiles ``1 ..``: spools in profile order. With ``first`` (an existing
    ``profile.db`` and an 8-aligned offset in it), the chunk of profile 1 is written there
    in place; the other chunks go to files in ``directory``."""
    job = STATE["job"] = _Job(source, directory, transposed, bounds, n_slots, first)
    try:
        with shared_writes(source):
            items = list(range(1, len(transposed)))
            if not items:
                return []
            if first is not None and source.bound is not None:
                got = [g for g in source.parallel(_predict_chunk, items) if g is not None]
                if got:  # more than one chunk: each goes where the bounds say
                    slots = np.zeros(len(transposed) + 1, dtype=np.int64)
                    for prof, size in got:
                        slots[prof + 1] = size
                    # [i - 1]: start of profile i
                    job.region = first[1] + np.cumsum(slots)[1:]
            return [s for s in source.parallel(_spool_chunk, items) if s is not None]
    finally:
        STATE.pop("job", None)


def _predict_chunk(profiles: Sequence[int]) -> tuple[I64, I64] | None:
    """The bounded sizes of these profiles' blocks; None when this chunk is all of them
    (one chunk is written in place from the start without predictions)."""
    job: _Job = STATE["job"]
    if len(profiles) == len(job.transposed) - 1:
        return None
    assert job.source.bound is not None
    sizes = np.array([block_size(*job.source.bound(int(i))) for i in profiles],
                     dtype=np.int64)
    return np.asarray(profiles, dtype=np.int64), sizes


def _spool_chunk(profiles: Sequence[int]) -> Spool | None:
    """Write the blocks of ``profiles``: in place in profile.db when this is the first chunk
    or the bounds predicted where it starts (switching to a spool file if a block would
    overrun the predicted region), else to a spool file."""
    job: _Job = STATE["job"]
    if not len(profiles):
        return None
    first = int(profiles[0])
    limit = -1  # end of the region this chunk may fill in place (-1: no limit)
    origin = 0
    in_place = True
    if job.first is not None and job.region is not None:
        path, origin = job.first[0], int(job.region[first - 1])
        limit = int(job.region[int(profiles[-1])])
    elif job.first is not None and first == 1:
        path, origin = job.first
    else:
        path, in_place = _spool_path(job.directory, first), False
    nb = len(job.bounds) - 1
    n = len(profiles)
    cut_ctx = np.zeros((n, nb + 1), dtype=np.int64)
    cut_val = np.zeros((n, nb + 1), dtype=np.int64)
    nv, pv, nc, pc = (np.zeros(n, dtype=np.int64) for _ in range(4))
    pairs = PairCounts(job.rows)
    pos = 0
    # profile.db is shared with the other workers; a spool file is this chunk's alone
    f = (Writer(os.open(path, os.O_RDWR), STATE["write_lock"], behind=STATE["behind"])
         if in_place else Writer(create_file(path), contextlib.nullcontext()))
    try:
        f.seek(origin)
        for k, i in enumerate(profiles):
            blk = sorted_block(job.source.block(int(i)), int(i))
            if len(blk.ctx_ids) > 0xFFFFFFFF:
                raise CallpathError(f"profile {i}: too many contexts for v4")
            if in_place and limit >= 0 and (origin + pos
                                            + block_size(len(blk.values), len(blk.ctx_ids))
                                            > limit):
                # the bounds were wrong: what was written moves to a spool, as does the rest
                f.close()
                spool = _spool_path(job.directory, first)
                f = Writer(create_file(spool), contextlib.nullcontext())
                copy_file(path, f.fd, 0, pos, origin)
                f.seek(pos)
                path, origin, in_place = spool, 0, False
            pv[k], pc[k], pos = write_profile_block(f, pos, blk)
            f.flush()
            nv[k], nc[k] = len(blk.values), len(blk.ctx_ids)
            if not job.transposed[i] or not len(blk.values):
                continue
            pairs.add(blk.ctx_of_values(), blk.metric_ids)
            cut = np.searchsorted(blk.ctx_ids, job.bounds)
            cut_ctx[k] = cut
            cut_val[k] = np.append(blk.starts.astype(np.int64), len(blk.values))[cut]
        pos = pad_to(f, pos)
    finally:
        f.close()
    return Spool(np.asarray(profiles, dtype=np.int64), path, pos, nv, pv, nc, pc,
                 cut_ctx, cut_val, pairs, origin, in_place, origin if in_place else -1)


def place_spools(spools: list[Spool], base: int, profile_db: Path, directory: Path) -> int:
    """Give every spool its place in ``profile_db`` (back to back in profile order from
    ``base``; each starts 8-byte aligned, so its pointers only move by that place) and
    return the end of the last. A chunk written in place elsewhere than its place (the
    bounds overestimated a block before it) is moved to a spool file in ``directory``, and
    ``profile_db`` is cut where the first such chunk begins (its blocks, and any behind it,
    are written at their places by the transpose; what was there is not left behind)."""
    pos = base
    cut = -1
    for sp in spools:
        if sp.in_place and (cut >= 0 or sp.origin != pos):
            cut = pos if cut < 0 else cut
            spool = _spool_path(directory, int(sp.profiles[0]))
            fd = create_file(spool)
            try:
                copy_file(sp.path, fd, 0, sp.size, sp.origin)
            finally:
                os.close(fd)
            sp.path, sp.origin, sp.in_place = spool, 0, False
        elif not sp.in_place and cut < 0:
            cut = pos
        sp.dest = pos
        pos += sp.size
    if cut >= 0:
        os.truncate(profile_db, cut)
    return pos


def copy_uncopied(dst: Path, spools: list[Spool]) -> None:
    """Copy into ``dst`` (profile.db) the spooled blocks that the transpose did not copy
    (:meth:`Spool.uncopied`: profiles outside ``cct.db``, context indices without values;
    none in ``callpath prof``'s databases), each whole, at its final place."""
    fd = -1
    try:
        for sp in spools:
            for k in sp.uncopied().tolist():
                if fd < 0:
                    fd = os.open(dst, os.O_WRONLY)
                start = int(min(sp.p_values[k], sp.p_ctxs[k]))
                end = int(sp.p_ctxs[k]) + PROFILE_INDEX.itemsize * int(sp.n_ctxs[k])
                copy_file(sp.path, fd, sp.dest + start, end - start, sp.origin + start)
    finally:
        if fd >= 0:
            os.close(fd)


def remove_spools(directory: Path) -> None:
    """Remove the spool directory and what is in it."""
    if not directory.exists():
        return
    for p in directory.iterdir():
        with contextlib.suppress(OSError):
            p.unlink()
    with contextlib.suppress(OSError):
        directory.rmdir()
