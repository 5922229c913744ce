"""``profile.db``, ``cct.db`` and ``trace.db``: the fixed parts of the three files of values
(headers, profile infos and identifier tuples, the context index, trace headers, footers)
around the blocks that the streamed phases write (:mod:`~callpath.formats.v4.stream`), and the
trace lines themselves.

Why a module of its own: these are the writer's last steps, each a header computed from counts
known by then (the spools' sizes, the context layout, the trace lengths) and written at its
place in a file the phases have already filled; they share the framing of
:mod:`~callpath.formats.v4.framing` and nothing with ``meta.db``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError
from callpath.formats.v4 import spool, transpose
from callpath.formats.v4.blocks import align_up, pad_to, write_array, write_profile_block
from callpath.formats.v4.framing import Section, cstruct, file_header, footer
from callpath.model.experiment import Experiment
from callpath.model.values import ProfileBlock, Traces

# Packed (unaligned) value structures: exactly the on-disk byte layout.
TRACE_ELEM = np.dtype([("timestamp", "<u8"), ("ctxId", "<u4")])  # 12 bytes

PROFILE_INFO = cstruct([("nValues", "<u8", 0), ("pValues", "<u8", 8), ("nCtxs", "<u4", 0x10),
                        ("pCtxIndices", "<u8", 0x18), ("pIdTuple", "<u8", 0x20),
                        ("flags", "<u4", 0x28)], 0x30)
IDENTIFIER = cstruct([("kind", "u1", 0), ("flags", "<u2", 2), ("logicalId", "<u4", 4),
                      ("physicalId", "<u8", 8)], 0x10)
CONTEXT_INFO = cstruct([("nValues", "<u8", 0), ("pValues", "<u8", 8), ("nMetrics", "<u2", 0x10),
                        ("pMetricIndices", "<u8", 0x18)], 0x20)
TRACE_HEADER = cstruct([("profIndex", "<u4", 0), ("pStart", "<u8", 8), ("pEnd", "<u8", 0x10)],
                       0x18)


# ==== profile.db ========================================================================


@dataclass
class ProfileHead:
    """``profile.db``'s fixed-size part, known before any block: the header, the profile
    info array and the identifier tuples; the blocks start at ``data_base``."""

    p_infos: int
    p_array: int
    infos_size: int
    info: npt.NDArray[Any]
    tuples: Section

    @property
    def data_base(self) -> int:
        return align_up(self.tuples.pos)

    @classmethod
    def of(cls, exp: Experiment) -> ProfileHead:
        profiles = exp.profiles
        n = len(profiles)
        header_size = 0x10 + 16 * 2
        p_infos = align_up(header_size)
        p_array = align_up(p_infos + 0x0D)
        infos_size = p_array + n * PROFILE_INFO.itemsize - p_infos
        # identifier tuples: every profile but the canonical summary one, in profile order
        tuples = Section(align_up(p_infos + infos_size))
        info = np.zeros(n, PROFILE_INFO)
        for i, p in enumerate(profiles):
            info[i]["flags"] = (p.flags & ~1) | int(p.is_summary)
            if i == 0:
                continue
            tuples.align()
            if len(p.ids) > 0xFFFF:
                raise CallpathError(f"profile {i}: identifier tuple too long")
            info[i]["pIdTuple"] = tuples.put(len(p.ids).to_bytes(2, "little") + bytes(6))
            ids = np.zeros(len(p.ids), IDENTIFIER)
            for k, ident in enumerate(p.ids):
                if not (0 <= ident.kind <= 0xFF and 0 <= ident.logical_id <= 0xFFFFFFFF
                        and 0 <= ident.physical_id < 1 << 64 and 0 <= ident.flags <= 0xFFFF):
                    raise CallpathError(f"profile {i}: identifier {ident} out of v4 range")
                ids[k] = (ident.kind, ident.flags, ident.logical_id, ident.physical_id)
            tuples.put(ids)
        return cls(p_infos, p_array, infos_size, info, tuples)


def fill_infos(head: ProfileHead, spools: list[spool.Spool]) -> None:
    """The info of the profiles in the spools, which have their places
    (:func:`spool.place_spools`)."""
    info = head.info
    for sp in spools:
        at = sp.profiles
        info["nValues"][at] = sp.n_values
        info["pValues"][at] = sp.p_values + sp.dest
        info["nCtxs"][at] = sp.n_ctxs
        info["pCtxIndices"][at] = sp.p_ctxs + sp.dest


def write_profile_db(f: BinaryIO, head: ProfileHead, summary: ProfileBlock, pos: int
                      ) -> None:
    """Finish ``profile.db`` (the other profiles' blocks are in place up to ``pos``): the
    summary block behind them, the footer, the headers."""
    if len(summary.ctx_ids) > 0xFFFFFFFF:
        raise CallpathError("profile 0: too many contexts for v4")
    f.seek(pos)
    p_values, p_ctx, pos = write_profile_block(f, pos, summary)
    info = head.info
    info[0]["nValues"], info[0]["pValues"] = len(summary.values), p_values
    info[0]["nCtxs"], info[0]["pCtxIndices"] = len(summary.ctx_ids), p_ctx
    f.write(footer(b"prof", pos))
    f.seek(0)
    tuples = head.tuples
    f.write(file_header(b"prof", [(head.infos_size, head.p_infos),
                                   (tuples.size, tuples.base)]))
    f.seek(head.p_infos)
    f.write(head.p_array.to_bytes(8, "little") + len(info).to_bytes(4, "little")
            + bytes([PROFILE_INFO.itemsize]))
    f.seek(head.p_array)
    f.write(info.tobytes())
    f.seek(tuples.base)
    f.write(bytes(tuples.buf))


# ==== cct.db ============================================================================


def write_cct_db(f: BinaryIO, layout: transpose.ContextLayout) -> int:
    """The header, the context index and the footer, the file sized for the blocks, which
    the transposing workers write in place (:func:`transpose.transpose_buckets`). Returns the
    offset of the first block."""
    n_slots = len(layout.n_values)
    header_size = 0x10 + 16
    p_section = align_up(header_size)
    p_array = align_up(p_section + 0x0D)
    section_size = p_array + n_slots * CONTEXT_INFO.itemsize - p_section
    data_base = align_up(p_section + section_size)
    info = np.zeros(n_slots, CONTEXT_INFO)
    info["nValues"] = layout.n_values
    info["pValues"] = layout.start[:-1] + data_base
    info["nMetrics"] = layout.n_metrics
    info["pMetricIndices"] = layout.start[:-1] + data_base + 12 * layout.n_values
    end = data_base + int(layout.start[-1])
    f.seek(end)
    f.write(footer(b"ctxt", end))
    f.seek(0)
    f.write(file_header(b"ctxt", [(section_size, p_section)]))
    f.seek(p_section)
    f.write(p_array.to_bytes(8, "little") + n_slots.to_bytes(4, "little")
            + bytes([CONTEXT_INFO.itemsize]))
    f.seek(p_array)
    write_array(f, info)
    return data_base


# ==== trace.db ==========================================================================


def write_trace_db(f: BinaryIO, traces: Traces, n_profiles: int) -> None:
    header_size = 0x10 + 16
    p_section = align_up(header_size)
    p_array = p_section + 0x20
    n = len(traces.lines)
    section_size = p_array + n * TRACE_HEADER.itemsize - p_section
    heads = np.zeros(n, TRACE_HEADER)
    pos = align_up(p_section + section_size)
    f.seek(pos)
    for k, line in enumerate(traces.lines):
        ts = np.asarray(line.timestamps, dtype=np.uint64)
        cs = np.asarray(line.ctx_ids, dtype=np.uint32)
        if len(ts) != len(cs):
            raise CallpathError(f"trace {k}: {len(ts)} timestamps but {len(cs)} contexts")
        if len(ts) > 1 and np.any(ts[1:] < ts[:-1]):
            raise CallpathError(f"trace {k}: timestamps are not in increasing order")
        if not 0 <= line.prof_index < n_profiles:
            raise CallpathError(f"trace {k}: profile index {line.prof_index} does not exist")
        pos = pad_to(f, pos)
        el = np.empty(len(ts), TRACE_ELEM)
        el["timestamp"] = ts
        el["ctxId"] = cs
        heads[k] = (line.prof_index, pos, pos + el.nbytes)
        write_array(f, el)
        pos += el.nbytes
    f.write(footer(b"trce", pos))
    f.seek(0)
    f.write(file_header(b"trce", [(section_size, p_section)]))
    f.seek(p_section)
    if n > 0xFFFFFFFF:
        raise CallpathError("too many traces for v4")
    head = np.zeros(1, cstruct([("pTraces", "<u8", 0), ("nTraces", "<u4", 8),
                                ("szTrace", "u1", 0xC), ("minTimestamp", "<u8", 0x10),
                                ("maxTimestamp", "<u8", 0x18)], 0x20))
    head["pTraces"] = p_array if n else 0
    head["nTraces"] = n
    head["szTrace"] = TRACE_HEADER.itemsize
    head["minTimestamp"] = traces.min_timestamp
    head["maxTimestamp"] = traces.max_timestamp
    f.write(head.tobytes())
    f.write(heads.tobytes())
