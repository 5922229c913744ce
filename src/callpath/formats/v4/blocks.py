"""``profile.db``'s value blocks in their on-disk form: the packed record layouts of both value
files, the sort into on-disk order, and the writing of one block.

Why a module of its own: these are the facts of the format that every phase of the streamed
writer (:mod:`~callpath.formats.v4.stream`) and the writer's assembly depend on, the block a
spooling worker writes, the sizes the bounds predict and the records the transpose reads
back, so they have one home that depends on nothing else of the writer.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.model.values import ProfileBlock

PROFILE_VALUE = np.dtype([("metricId", "<u2"), ("value", "<f8")])  # 10 bytes
PROFILE_INDEX = np.dtype([("ctxId", "<u4"), ("startIndex", "<u8")])  # 12 bytes
CONTEXT_VALUE = np.dtype([("profIndex", "<u4"), ("value", "<f8")])  # 12 bytes
CONTEXT_INDEX = np.dtype([("metricId", "<u2"), ("startIndex", "<u8")])  # 10 bytes


def align_up(n: int, a: int = 8) -> int:
    """``n`` rounded up to a multiple of ``a`` (the format aligns sections and records)."""
    return (n + a - 1) // a * a


class Sink(Protocol):
    """Where blocks are written: a binary file, or a
    :class:`~callpath.formats.v4.fileio.Writer`."""

    def write(self, data: Any, /) -> int: ...


def pad_to(f: Sink, pos: int, a: int = 8) -> int:
    """Write zeros from ``pos`` (the file's position) to the next multiple of ``a``; the new
    position."""
    pad = align_up(pos, a) - pos
    f.write(bytes(pad))
    return pos + pad


def block_size(n_values: int, n_ctxs: int) -> int:
    """Bytes a block takes in ``profile.db`` from an 8-aligned start to the next one: values,
    padding to 4, context index, padding to 8 (:func:`write_profile_block`)."""
    return align_up(align_up(PROFILE_VALUE.itemsize * n_values, 4)
                  + PROFILE_INDEX.itemsize * n_ctxs)


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


def write_array(f: Sink, arr: npt.NDArray[Any]) -> None:
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
    write_array(f, vals)
    pos = pad_to(f, pos + vals.nbytes, 4)
    idx = np.empty(len(blk.ctx_ids), PROFILE_INDEX)
    idx["ctxId"] = blk.ctx_ids
    idx["startIndex"] = blk.starts
    p_ctx = pos
    write_array(f, idx)
    return p_values, p_ctx, pos + idx.nbytes


