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
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.model.experiment import Experiment
from callpath.model.values import ProfileBlock

I64 = npt.NDArray[np.int64]

class Mapper(Protocol):
    """``mapper(fn, items, weights=None)`` = ``[fn(chunk) for chunk in <contiguous chunks of
    items>]``, the chunks in order, of nearly equal total ``weights`` (the estimated cost of
    each item; equal counts without); :func:`serial` runs one chunk in this process."""

    def __call__(self, fn: Callable[[Sequence[int]], Any], items: Sequence[int], /,
                 weights: Sequence[float] | None = None) -> list[Any]: ...

#: What forked workers inherit: the job being written (set by :func:`spool_profiles` and
#: :func:`transpose_buckets` around their mapping).
STATE: dict[str, Any] = {}

PROFILE_VALUE = np.dtype([("metricId", "<u2"), ("value", "<f8")])  # 10 bytes
PROFILE_INDEX = np.dtype([("ctxId", "<u4"), ("startIndex", "<u8")])  # 12 bytes
CONTEXT_VALUE = np.dtype([("profIndex", "<u4"), ("value", "<f8")])  # 12 bytes
CONTEXT_INDEX = np.dtype([("metricId", "<u2"), ("startIndex", "<u8")])  # 10 bytes

VALUES_PER_BUCKET = 1 << 20  # target size of a transposed piece (values): its arrays stay
#                               below glibc's mmap threshold, so they are reused, not faulted in
#: what transposing a context costs, in values (see transpose_buckets)
COST_PER_CONTEXT = 15
MAX_BUCKETS = 256  # context ranges a profile's values are cut into for the transpose


def _write_lock() -> Any:
    """One lock for the writes of all workers into one file (created before they fork).

    ext4 holds a file's inode lock through each buffered ``write``, so two processes writing
    one file take turns anyway, and the one waiting spins on that lock in the kernel, burning
    its CPU; waiting on this lock instead sleeps."""
    import multiprocessing
    try:
        return multiprocessing.get_context("fork").Lock()
    except (ValueError, OSError):
        return contextlib.nullcontext()


@contextlib.contextmanager
def _shared_writes(source: ValueSource) -> Iterator[None]:
    """While a phase maps its chunks: the write lock of the file they share, and whether
    each process writes from a thread of its own (see :class:`_Writer`: when several write)."""
    STATE["write_lock"] = _write_lock()
    STATE["behind"] = source.parallel is not serial
    try:
        yield
    finally:
        STATE.pop("write_lock", None)
        STATE.pop("behind", None)


class _Writer:
    """Positional writes into one file descriptor (owned: ``close`` closes it), taking
    ``lock`` around each batch: the write lock when the file is shared with other workers.

    ``write`` queues buffers that nothing modifies afterwards (every block and piece is made
    anew) at the current position; ``flush`` writes what was queued since the last one as
    one batch. With ``behind`` (one of several processes writing), a thread of the process
    does the batches, so that it computes its next block or piece while the last one is
    copied into the page cache (the other worker's writes to the same file come between);
    at most two batches wait (bounded memory). ``close`` writes what is left, waits, and
    raises the first error."""

    def __init__(self, fd: int, lock: Any, behind: bool = False) -> None:
        self.fd = fd
        self.lock = lock
        self.at = 0
        self.pending: list[tuple[int, memoryview]] = []
        self.error: BaseException | None = None
        self.jobs: queue.Queue[list[tuple[int, memoryview]] | None] | None = None
        self.thread: threading.Thread | None = None
        if behind:
            self.jobs = queue.Queue(maxsize=2)
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()

    def seek(self, at: int) -> None:
        self.at = at

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        self.pending.append((self.at, view))
        self.at += len(view)
        return len(view)

    def flush(self) -> None:
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        if self.jobs is not None:
            self.jobs.put(batch)
        else:
            self._write(batch)

    def _write(self, batch: list[tuple[int, memoryview]]) -> None:
        with self.lock:
            for at, view in batch:
                _pwrite_bytes(self.fd, view, at)

    def _run(self) -> None:
        assert self.jobs is not None
        while (batch := self.jobs.get()) is not None:
            if self.error is not None:
                continue
            try:
                self._write(batch)
            except BaseException as e:  # raised again by close()
                self.error = e

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self.jobs is not None and self.thread is not None:
                self.jobs.put(None)
                self.thread.join()
            os.close(self.fd)
        if self.error is not None:
            raise self.error


def _create(path: Path) -> int:
    """A new (or emptied) file for writing, as ``open(path, "wb")``; reading too, as the
    spool a chunk moves to is read back by the transpose."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)


def _spool_path(directory: Path, first: int) -> Path:
    """The spool file of the chunk of profiles that starts at profile ``first``."""
    return directory / f"profiles-{first}.spool"


def serial(fn: Callable[[Sequence[int]], Any], items: Sequence[int], /,
           weights: Sequence[float] | None = None) -> list[Any]:
    """The :class:`Mapper` that runs everything here, as one chunk."""
    return [fn(items)]


def align_up(n: int, a: int = 8) -> int:
    """``n`` rounded up to a multiple of ``a`` (the format aligns sections and records)."""
    return (n + a - 1) // a * a


class Sink(Protocol):
    """Where blocks are written: a binary file, or a :class:`_Writer`."""

    def write(self, data: Any, /) -> int: ...


def pad_to(f: Sink, pos: int, a: int = 8) -> int:
    """Write zeros from ``pos`` (the file's position) to the next multiple of ``a``; the new
    position."""
    pad = align_up(pos, a) - pos
    f.write(bytes(pad))
    return pos + pad


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
    a chunk found elsewhere is moved, see :func:`place_spools`).
    """

    block: Callable[[int], ProfileBlock]
    parallel: Mapper = serial
    on_groups: Callable[[Groups], Any] | None = None
    summary: Callable[[list[Any]], ProfileBlock] | None = None
    bound: Callable[[int], tuple[int, int]] | None = None


def block_size(n_values: int, n_ctxs: int) -> int:
    """Bytes a block takes in ``profile.db`` from an 8-aligned start to the next one: values,
    padding to 4, context index, padding to 8 (:func:`write_profile_block`)."""
    return align_up(align_up(PROFILE_VALUE.itemsize * n_values, 4)
                  + PROFILE_INDEX.itemsize * n_ctxs)


def value_source(exp: Experiment) -> ValueSource:
    """The experiment's own source when it carries one (``callpath prof``'s experiments
    compute their blocks on demand), else its stored blocks, written by this process."""
    src = getattr(exp, "value_source", None)
    return src if isinstance(src, ValueSource) else ValueSource(exp.values.__getitem__)


# ==== blocks in on-disk order ===========================================================


def sorted_block(blk: ProfileBlock, index: int) -> ProfileBlock:
    """The block in on-disk order (contexts ascending, metrics ascending within a context);
    blocks from readers and ``ProfileBlock.from_triples`` already are, and pass unchanged."""
    ctx = np.asarray(blk.ctx_ids, dtype=np.uint32)
    starts = np.asarray(blk.starts, dtype=np.uint64)
    met = np.asarray(blk.metric_ids, dtype=np.uint16)
    val = np.asarray(blk.values, dtype=np.float64)
    nv = len(val)
    if len(ctx) != len(starts) or len(met) != nv:
        raise CallpathError(f"profile {index}: value block arrays differ in length")
    if len(ctx) == 0:
        if nv:
            raise CallpathError(f"profile {index}: {nv} values but no context index")
        return ProfileBlock(ctx, starts, met, val)
    st = starts.astype(np.int64)
    if st[0] != 0 or np.any(np.diff(st) < 0) or st[-1] > nv:
        raise CallpathError(f"profile {index}: context start indices are not sorted within "
                            f"0..{nv}")
    if nv == 0:
        return ProfileBlock(ctx, starts, met, val)
    ok = len(ctx) < 2 or bool(np.all(ctx[1:] > ctx[:-1]))
    if ok:  # metrics ascending inside each context (a context boundary may go down)
        up = met[1:] > met[:-1]
        cut = st[1:]
        up[cut[(cut > 0) & (cut < nv)] - 1] = True
        ok = bool(up.all())
    if ok:
        return ProfileBlock(ctx, starts, met, val, blk._ctx_of_values)
    key = (blk.ctx_of_values().astype(np.uint64) << np.uint64(16)) | met.astype(np.uint64)
    order = np.argsort(key, kind="stable")
    key = key[order]
    if np.any(key[1:] == key[:-1]):
        raise CallpathError(f"profile {index}: a (context, metric) pair has two values")
    cs = (key >> np.uint64(16)).astype(np.uint32)
    uc, first = np.unique(cs, return_index=True)
    return ProfileBlock(uc, first.astype(np.uint64), met[order], val[order])


def _write(f: Sink, arr: npt.NDArray[Any]) -> None:
    """Write an array's bytes without an intermediate copy when it is contiguous."""
    a = np.ascontiguousarray(arr)
    if a.size:
        f.write(a.view(np.uint8).reshape(-1).data)


def write_profile_block(f: Sink, pos: int, blk: ProfileBlock) -> tuple[int, int, int]:
    """Write one block at ``pos`` (the file's position) as ``profile.db`` lays it out:
    padding to 8 bytes, values, padding to 4, context index. Returns pValues, pCtxIndices and
    the new position (positions relative to any 8-byte aligned origin)."""
    pos = pad_to(f, pos)
    vals = np.empty(len(blk.values), PROFILE_VALUE)
    vals["metricId"] = blk.metric_ids
    vals["value"] = blk.values
    p_values = pos
    _write(f, vals)
    pos = pad_to(f, pos + vals.nbytes, 4)
    idx = np.empty(len(blk.ctx_ids), PROFILE_INDEX)
    idx["ctxId"] = blk.ctx_ids
    idx["startIndex"] = blk.starts
    p_ctx = pos
    _write(f, idx)
    return p_values, p_ctx, pos + idx.nbytes


# ==== phase 1: spool the profiles =======================================================


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
class ContextLayout:
    """Where each context's block lies in ``cct.db`` (from the spools' :class:`PairCounts`)."""

    n_values: I64
    n_metrics: I64
    start: I64  # n_slots + 1 offsets from the first block

    @classmethod
    def of(cls, spools: list[Spool], n_slots: int) -> ContextLayout:
        ids = sorted({i for sp in spools for i in sp.pairs.ids})
        col = {m: j for j, m in enumerate(ids)}
        n_values = np.zeros(n_slots, dtype=np.int64)
        present = np.zeros((n_slots, len(ids)), dtype=bool)
        for sp in spools:
            pc = sp.pairs
            r = min(len(pc.values), n_slots)
            n_values[:r] += pc.values[:r]
            if pc.ids:
                cols = np.array([col[m] for m in pc.ids], dtype=np.int64)
                present[:r, cols] |= pc.present[:r]
        n_metrics = present.sum(axis=1).astype(np.int64)
        if np.any(n_metrics > 0xFFFF):
            raise CallpathError("a context has more than 65535 metrics")
        # block of a context: values (12 B each), metric indices (10 B each), padding to 4
        size = 12 * n_values + 10 * n_metrics + 2 * (n_metrics & 1)
        start = np.zeros(n_slots + 1, dtype=np.int64)
        np.cumsum(size, out=start[1:])
        return cls(n_values, n_metrics, start)


@dataclass
class _Job:
    source: ValueSource
    directory: Path  # for the temporary files
    transposed: npt.NDArray[np.bool_]  # per profile: its values go to cct.db
    bounds: I64  # context ids where buckets start (+ an open end)
    rows: int  # context ids expected (more are counted if they come)
    first: tuple[Path, int] | None  # profile.db and where the first chunk goes in it
    region: I64 | None = None  # per profile: where its block is predicted to start (+ end)


def bucket_bounds(n_slots: int, n_profiles: int, n_metric_ids: int) -> I64:
    """Context ranges of the buckets: equal ranges, as many as keep the worst case (every
    profile has every metric at every context) near :data:`VALUES_PER_BUCKET` values, at
    most :data:`MAX_BUCKETS`; the last range is open (contexts beyond ``n_slots``)."""
    worst = max(n_slots, 1) * max(n_profiles, 1) * max(n_metric_ids, 1)
    n = int(min(MAX_BUCKETS, max(1, -(-worst // VALUES_PER_BUCKET)), max(n_slots, 1)))
    b = np.linspace(0, n_slots, n + 1).round().astype(np.int64)
    b[-1] = 1 << 32
    return b


def spool_profiles(source: ValueSource, directory: Path, transposed: npt.NDArray[np.bool_],
                   bounds: I64, n_slots: int, first: tuple[Path, int] | None = None
                   ) -> list[Spool]:
    """Phase 1 over profiles ``1 ..``: spools in profile order. With ``first`` (an existing
    ``profile.db`` and an 8-aligned offset in it), the chunk of profile 1 is written there
    in place; the other chunks go to files in ``directory``."""
    job = STATE["job"] = _Job(source, directory, transposed, bounds, n_slots, first)
    try:
        with _shared_writes(source):
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
    f = (_Writer(os.open(path, os.O_RDWR), STATE["write_lock"], behind=STATE["behind"])
         if in_place else _Writer(_create(path), contextlib.nullcontext()))
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
                f = _Writer(_create(spool), contextlib.nullcontext())
                _copy_file(path, f.fd, 0, pos, origin)
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
            fd = _create(spool)
            try:
                _copy_file(sp.path, fd, 0, sp.size, sp.origin)
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


# ==== phase 2: transpose the buckets ====================================================


def transpose_buckets(source: ValueSource, spools: list[Spool], bounds: I64,
                      layout: ContextLayout, cct_db: Path, data_base: int,
                      profile_db: Path | None = None) -> list[Any]:
    """Phase 2: the ``cct.db`` blocks of every context written in place into ``cct_db``
    (blocks from ``data_base``, at the offsets of ``layout``), by pieces of adjacent buckets
    of up to :data:`VALUES_PER_BUCKET` values read back from the spools. What is read from a
    spool that is not in place is also written into ``profile_db`` at the spool's ``dest``.
    Returns what ``on_groups`` said of each piece, in context order."""
    nb = len(bounds) - 1
    n_slots = len(layout.n_values)
    b = bounds.copy()
    b[-1] = max(n_slots, int(b[-2]))
    counts = (np.sum([s.runs.sum(axis=0) for s in spools], axis=0) if spools
              else np.zeros(nb, dtype=np.int64))
    units: list[tuple[int, int]] = []
    unit_values: list[int] = []
    start, acc = 0, 0
    for k in range(nb):
        if k > start and acc + int(counts[k]) > VALUES_PER_BUCKET:
            units.append((start, k))
            unit_values.append(acc)
            start, acc = k, 0
        acc += int(counts[k])
    units.append((start, nb))
    unit_values.append(acc)
    if profile_db is None and any(not sp.in_place for sp in spools):
        raise CallpathError("spooled profiles need the profile.db they are copied into")
    # a piece costs per value and per context (encoding each context's metric index):
    # measured on bench/prof.py, 0.145 us a value and 2.2 us a context, so the pieces of
    # the first contexts (the interior of the tree, with many contexts of few values)
    # cost 20% more than as many pieces of leaves; equal shares of cost, not of pieces
    weights = [v + COST_PER_CONTEXT * (int(b[k1]) - int(b[k0]))
               for v, (k0, k1) in zip(unit_values, units, strict=True)]
    STATE["transpose"] = (source, spools, b, units, layout, cct_db, data_base, profile_db)
    try:
        with _shared_writes(source):
            got = source.parallel(_transpose_chunk, list(range(len(units))), weights=weights)
            return [g for part in got for g in part]
    finally:
        STATE.pop("transpose", None)


def _transpose_chunk(unit_ids: Sequence[int]) -> list[Any]:
    source: ValueSource
    spools: list[Spool]
    layout: ContextLayout
    source, spools, bounds, units, layout, cct_db, data_base, profile_db = STATE["transpose"]
    groups = []
    out = _Writer(os.open(cct_db, os.O_WRONLY), STATE["write_lock"], behind=STATE["behind"])
    spool_fds = [os.open(sp.path, os.O_RDONLY) for sp in spools]
    copy_fd = (os.open(profile_db, os.O_WRONLY) if any(not sp.in_place for sp in spools)
               else -1)
    try:
        for u in unit_ids:
            b0, b1 = units[int(u)]
            c0, c1 = int(bounds[b0]), min(int(bounds[b1]), len(layout.n_values))
            ctx, met, val, run_prof, run_len = _read_range(spools, spool_fds, b0, b1, copy_fd)
            t = _transpose(ctx, met, val, run_prof, run_len, c0, c1)
            del ctx, met, val
            buf, nv, nm = encode_contexts(t, c0, c1)
            if not (np.array_equal(nv, layout.n_values[c0:c1])
                    and np.array_equal(nm, layout.n_metrics[c0:c1])):
                raise CallpathError(f"contexts {c0}..{c1 - 1}: the transposed values do not "
                                    "match the counts taken while spooling")
            if source.on_groups is not None:
                groups.append(source.on_groups(t))
            del t
            out.seek(data_base + int(layout.start[c0]))
            _write(out, buf)
            out.flush()
    finally:
        out.close()
        for sfd in spool_fds:
            os.close(sfd)
        if copy_fd >= 0:
            os.close(copy_fd)
    return groups


def _read_range(spools: list[Spool], fds: list[int], b0: int, b1: int, copy_fd: int = -1
                ) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint16],
                           npt.NDArray[np.float64], I64, I64]:
    """The values of buckets ``b0 .. b1-1`` of every profile, read from the spools (two
    reads per profile: its context index and its values in the range), in profile order:
    context, metric and value of each, and the runs (profile, length). The bytes read from
    a spool that is not in place are written to ``copy_fd`` (profile.db) at their final
    place: the ranges of all the pieces together are every byte of every transposed block
    but padding."""
    ctx_parts, met_parts, val_parts, run_prof, run_len = [], [], [], [], []
    for sp, sfd in zip(spools, fds, strict=True):
        v0, v1 = sp.cut_val[:, b0], sp.cut_val[:, b1]
        i0, i1 = sp.cut_ctx[:, b0], sp.cut_ctx[:, b1]
        copy = not sp.in_place
        if copy and sp.dest < 0:
            raise CallpathError("a spool's place in profile.db is not known")
        for k in np.flatnonzero((v1 > v0) | ((i1 > i0) if copy else False)).tolist():
            nval, nidx = int(v1[k] - v0[k]), int(i1[k] - i0[k])
            at_idx = int(sp.p_ctxs[k]) + PROFILE_INDEX.itemsize * int(i0[k])
            at_val = int(sp.p_values[k]) + PROFILE_VALUE.itemsize * int(v0[k])
            raw_idx = _pread(sfd, PROFILE_INDEX.itemsize * nidx, sp.origin + at_idx)
            raw_val = _pread(sfd, PROFILE_VALUE.itemsize * nval, sp.origin + at_val)
            if copy:
                _pwrite_bytes(copy_fd, raw_idx, sp.dest + at_idx)
                _pwrite_bytes(copy_fd, raw_val, sp.dest + at_val)
            if not nval:
                continue
            idx = np.frombuffer(raw_idx, dtype=PROFILE_INDEX)
            vals = np.frombuffer(raw_val, dtype=PROFILE_VALUE)
            counts = np.diff(np.append(idx["startIndex"].astype(np.int64), int(v1[k])))
            ctx_parts.append(np.repeat(idx["ctxId"], counts))
            met_parts.append(vals["metricId"])
            val_parts.append(vals["value"])
            run_prof.append(int(sp.profiles[k]))
            run_len.append(nval)
    if not ctx_parts:
        return (np.zeros(0, np.uint32), np.zeros(0, np.uint16), np.zeros(0, np.float64),
                np.zeros(0, np.int64), np.zeros(0, np.int64))
    return (np.concatenate(ctx_parts), np.concatenate(met_parts), np.concatenate(val_parts),
            np.array(run_prof, dtype=np.int64), np.array(run_len, dtype=np.int64))


def _pread(fd: int, n: int, at: int) -> bytes:
    out = os.pread(fd, n, at)
    while len(out) < n:
        more = os.pread(fd, n - len(out), at + len(out))
        if not more:
            raise CallpathError("a spool file ended early")
        out += more
    return out


def _pwrite_bytes(fd: int, data: bytes | memoryview, at: int) -> None:
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], at + done)


def _transpose(ctx: npt.NDArray[np.uint32], met: npt.NDArray[np.uint16],
               val: npt.NDArray[np.float64], run_prof: I64, run_len: I64, c0: int, c1: int
               ) -> Groups:
    """Values of contexts ``c0 .. c1-1`` in runs (one per profile; a run is sorted by
    (context, metric) and has each pair once) → the pairs in (context, metric) order with
    their values in profile order. Where the range × its metrics is small enough for a
    dense count (always, unless metric ids are many), each record's place is its pair's
    start plus the number of earlier runs that have the pair: no sort, linear time.
    The runs of one profile can be split, but then they follow each other and hold
    different pairs, so counting stays right."""
    n = len(ctx)
    if n and (int(ctx.min()) < c0 or int(ctx.max()) >= c1):
        raise CallpathError(f"a value of a context outside {c0}..{c1 - 1} is in its range")
    top = int(met.max()) + 1 if n else 1
    if top <= 64:  # metric ids are few and small: they are their own columns
        mids = np.arange(top)
        col: npt.NDArray[Any] = met
    else:
        present = np.zeros(1 << 16, dtype=bool)
        present[met] = True
        mids = np.flatnonzero(present)
        col = (np.cumsum(present) - 1)[met]
    m = max(len(mids), 1)
    width = c1 - c0
    if width * m <= max(4 * n, 1 << 20):
        key = (ctx.astype(np.int64) - c0) * m
        key += col
        del col
        counts = np.bincount(key, minlength=width * m)
        start = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=start[1:])
        seen = start[:-1].copy()
        pos = np.empty(n, dtype=np.int64)
        out_prof = np.empty(n, dtype=np.uint32)
        ends = np.cumsum(run_len)
        for p, a, b in zip(run_prof.tolist(), (ends - run_len).tolist(), ends.tolist(),
                           strict=True):
            k = key[a:b]
            where = seen[k]
            pos[a:b] = where
            out_prof[where] = p
            seen[k] += 1
        del key, seen
        out_val = np.empty(n, dtype=np.float64)
        out_val[pos] = val
        nz = np.flatnonzero(counts)
        g_ctx = (nz // m + c0).astype(np.uint32)
        g_met = mids[nz % m].astype(np.uint16)
        first = start[nz]
    else:  # sparse metric ids: one stable sort (runs are in profile order)
        key64 = (ctx.astype(np.uint64) << np.uint64(16)) | met.astype(np.uint64)
        order = np.argsort(key64, kind="stable")
        key64 = key64[order]
        out_prof = np.repeat(run_prof.astype(np.uint32), run_len)[order]
        out_val = np.asarray(val)[order]
        new = np.ones(n, dtype=bool)
        new[1:] = key64[1:] != key64[:-1]
        first = np.flatnonzero(new)
        g_ctx = (key64[first] >> np.uint64(16)).astype(np.uint32)
        g_met = (key64[first] & np.uint64(0xFFFF)).astype(np.uint16)
    return Groups(g_ctx, g_met, np.append(first, n).astype(np.int64), out_prof, out_val)


def encode_contexts(g: Groups, c0: int, c1: int) -> tuple[npt.NDArray[np.uint8], I64, I64]:
    """``cct.db`` blocks of contexts ``c0 .. c1-1`` from their pairs: one buffer with whole
    records scattered into it (every block is a multiple of 4 bytes, so the buffer does not
    depend on where it lands), and the value and metric counts per context."""
    rel = g.ctx.astype(np.int64) - c0
    sizes = np.diff(g.starts)
    n_metrics = np.bincount(rel, minlength=c1 - c0).astype(np.int64)
    if np.any(n_metrics > 0xFFFF):
        raise CallpathError("a context has more than 65535 metrics")
    n_values = np.bincount(rel, weights=sizes, minlength=c1 - c0).astype(np.int64)
    # block of a context: values (12 B each), metric indices (10 B each), padding to 4 bytes
    block_size = 12 * n_values + 10 * n_metrics + 2 * (n_metrics & 1)
    starts = np.zeros(c1 - c0 + 1, dtype=np.int64)
    np.cumsum(block_size, out=starts[1:])
    total = int(starts[-1])
    buf = np.zeros(total, dtype=np.uint8)
    nv_all = len(g.values)
    if nv_all:
        ctx_first = np.zeros(c1 - c0 + 1, dtype=np.int64)  # first value of each context
        np.cumsum(n_values, out=ctx_first[1:])
        vals = np.empty(nv_all, CONTEXT_VALUE)
        vals["profIndex"] = g.prof
        vals["value"] = g.values
        # value j of context c lands at starts[c] + 12 * (j - ctx_first[c])
        dest = np.repeat(starts[:-1] - 12 * ctx_first[:-1], n_values)
        dest += 12 * np.arange(nv_all, dtype=np.int64)
        _records_at(buf, CONTEXT_VALUE.itemsize, 4)[dest // 4] = vals.view("V12")
        del vals, dest
        ng = len(g.ctx)
        grp_first = np.zeros(c1 - c0 + 1, dtype=np.int64)
        np.cumsum(n_metrics, out=grp_first[1:])
        idx = np.empty(ng, CONTEXT_INDEX)
        idx["metricId"] = g.metric
        idx["startIndex"] = g.starts[:-1] - np.repeat(ctx_first[:-1], n_metrics)
        p_idx = starts[:-1] + 12 * n_values
        dest = np.repeat(p_idx - 10 * grp_first[:-1], n_metrics)
        dest += 10 * np.arange(ng, dtype=np.int64)
        _records_at(buf, CONTEXT_INDEX.itemsize, 2)[dest // 2] = idx.view("V10")
    return buf, n_values, n_metrics


def _records_at(buf: npt.NDArray[np.uint8], size: int, step: int) -> npt.NDArray[Any]:
    """An (overlapping) view of ``buf`` as ``size``-byte records starting every ``step``
    bytes, so that records at any ``step``-aligned offset are stored by one scatter."""
    count = max((len(buf) - size) // step + 1, 0)
    return np.ndarray((count,), dtype=np.dtype(f"V{size}"), buffer=buf, strides=(step,))


# ==== phase 3: assembly =================================================================


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
                _copy_file(sp.path, fd, sp.dest + start, end - start, sp.origin + start)
    finally:
        if fd >= 0:
            os.close(fd)


def _copy_file(src: Path, fd: int, at: int, size: int, start: int = 0) -> None:
    """``size`` bytes of ``src`` from ``start`` to ``fd`` at ``at``: ``copy_file_range``,
    else reads and ``pwrite``."""
    sfd = os.open(src, os.O_RDONLY)
    try:
        done = 0
        with contextlib.suppress(OSError, AttributeError):
            while done < size:
                n = os.copy_file_range(sfd, fd, size - done, start + done, at + done)
                if n <= 0:
                    break
                done += n
        while done < size:
            chunk = os.pread(sfd, min(1 << 24, size - done), start + done)
            if not chunk:
                raise CallpathError(f"{src}: spool file ended early")
            view = memoryview(chunk)
            while len(view):
                n = os.pwrite(fd, view, at + done)
                view = view[n:]
                done += n
    finally:
        os.close(sfd)


def remove_spools(directory: Path) -> None:
    """Remove the spool directory and what is in it."""
    if not directory.exists():
        return
    for p in directory.iterdir():
        with contextlib.suppress(OSError):
            p.unlink()
    with contextlib.suppress(OSError):
        directory.rmdir()
