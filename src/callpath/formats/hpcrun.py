"""Reader of HPCToolkit's measurement files: ``*.hpcrun`` (profile format 4.0) and ``*.hpctrace``.

Layout (HPCToolkit's ``hpcrun-fmt.h``; everything big-endian): a ``*.hpcrun`` file is a set of
sections located by a 112-byte footer at the end of the file (14 × u64: start/end of the header,
load map, CCT, metric table, identifier dictionary, sparse metrics, the footer start, and the
magic ``HPCRUNsm``). Strings are ``u32 length`` + bytes. A metric descriptor is name,
description, 16 flag bytes, ``u64 period``, formula, format, ``u16 is_frequency``,
``u16 is_multiplexed``, ``f64 threshold_mean``, ``u64 num_samples``. The CCT section is
``u64 count`` then fixed 19-byte nodes ``(i32 id, i32 parent, u16 lm_id, u64 ip, u8 flags)``;
the sparse metrics are the execution context's identifier tuple, then ``u64 n_values, u32
n_nodes``, the ``(u64 value bits, u16 metric id)`` pairs, and ``n_nodes + 1`` ``(u32 node id,
u64 start)`` rows (the last one is an end marker). Everything is decoded with numpy structured
dtypes, not per value, because a thread's profile can hold millions of nodes.

A ``*.hpctrace`` file is a 32-byte header (magic, version, endianness, u64 flags) then
``(u64 time ns, u32 cct node id)`` records.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from callpath.errors import FormatError

PROFILE_MAGIC = b"HPCRUN-profile____"
TRACE_MAGIC = b"HPCRUN-trace______"
FOOTER_MAGIC = 0x48504352554E736D  # "HPCRUNsm"
FOOTER_SIZE = 112

#: lm_id 0 marks placeholder nodes whose "ip" is an 8-character tag.
PLACEHOLDER_LM = 0
PRIMARY_ROOT = int.from_bytes(b"^Primary", "big")
PARTIAL_ROOT = int.from_bytes(b"^Partial", "big")
NO_ACTIVITY = int.from_bytes(b"NoActvty", "big")
FENCE_MAIN = int.from_bytes(b"| Main  ", "big")
FENCE_THREAD = int.from_bytes(b"| Thread", "big")
UNNORMALIZED_IP = int.from_bytes(b"*Unnorm ", "big")
#: CCT node flag: hpcrun unwound the frame's calling context
UNWOUND_FLAG = 1
#: trace header flag: a "call trace" whose samples name the procedure a frame enters
TRACE_CALL_FLAG = 1 << 2

CCT_NODE = np.dtype([("id", ">i4"), ("parent", ">i4"), ("lm", ">u2"), ("ip", ">u8"),
                     ("flags", "u1")])
VALUE = np.dtype([("bits", ">u8"), ("mid", ">u2")])
BLOCK = np.dtype([("node", ">u4"), ("start", ">u8")])
TRACE_REC = np.dtype([("time", ">u8"), ("node", ">u4")])


#: metric value formats (``MetricFlags_ValFmt_t``): the 8 value bytes are a u64 or a double
VALFMT_INT, VALFMT_REAL = 1, 2
#: metric kinds (``MetricFlags_Ty_t``) that mark the current (byte-wise) flag layout
TY_RAW, TY_FINAL = 1, 2


@dataclass
class HpcrunMetric:
    """One metric descriptor (``metric_desc_t``). ``period`` is the factor hpcprof multiplies
    every stored value by; ``is_frequency`` and the ``threshold_mean`` / ``num_samples`` /
    ``is_multiplexed`` statistics are what hpcrun's perf-event source records about its
    sampling, which hpcprof reads but does not apply to values (see
    :mod:`callpath.attribute.hpcrun_periods`)."""

    name: str
    description: str
    is_int: bool
    period: int
    value_format: int = VALFMT_REAL
    kind: int = TY_RAW
    show: int = 1
    show_percent: bool = True
    move2proc: bool = False
    formula: str = ""
    format: str = ""
    is_frequency: bool = False
    is_multiplexed: bool = False
    threshold_mean: float = 0.0
    num_samples: int = 0


def _metric_flags(flags: bytes) -> tuple[int, int, int, bool, bool]:
    """``(kind, value format, show, show percent, move2proc)`` of the 16 flag bytes, as
    ``hpcrun_fmt_metricDesc_fread`` reads them: one byte per field (ty, valTy, valFmt,
    move2proc, u16 partner, show, showPercent, then 8 unused bytes), unless the kind is neither
    raw nor final or the unused bytes are not zero, which marks the older convention: two
    big-endian u64 holding C bit-fields (ty:4, valTy:4, valFmt:4, partner:16, show:1,
    showPercent:1, from the low bits up; that convention has no move2proc)."""
    if flags[0] in (TY_RAW, TY_FINAL) and not any(flags[8:16]):
        return flags[0], flags[2], flags[6], bool(flags[7]), bool(flags[3])
    word = int.from_bytes(flags[:8], "big")
    return (word & 0xF, (word >> 8) & 0xF, (word >> 28) & 1, bool((word >> 29) & 1), False)


@dataclass
class HpcrunProfile:
    """One thread's profile. ``node_*`` arrays follow the file's node order (parents first);
    values are flat: ``value_node[i]`` (a CCT node id) has ``value[i]`` of metric ``value_mid[i]``
    (0-based into ``metrics``), as stored: before hpcprof's scaling by the metric's period
    (:func:`callpath.attribute.hpcrun_periods.scaled_values`)."""

    path: Path
    header: dict[str, str]
    modules: dict[int, str]
    metrics: list[HpcrunMetric]
    id_tuple: list[tuple[int, int, int]]  # (kind word, physical, logical)
    node_id: npt.NDArray[np.int64]
    node_parent: npt.NDArray[np.int64]
    node_lm: npt.NDArray[np.int64]
    node_ip: npt.NDArray[np.uint64]
    value_node: npt.NDArray[np.int64]
    value_mid: npt.NDArray[np.int64]
    value: npt.NDArray[np.float64]
    id_names: dict[int, str] = field(default_factory=dict)
    #: per node, hpcrun's "unwound" flag: False for a frame whose calling context hpcrun
    #: could not unwind (GPU PC samples: an instruction in a kernel, placed by hpcprof
    #: through the GPU binary's call graph)
    node_unwound: npt.NDArray[np.bool_] = field(default_factory=lambda: np.ones(0, bool))


class _Cursor:
    def __init__(self, data: bytes, path: Path, pos: int, end: int) -> None:
        self.data, self.path, self.pos, self.end = data, path, pos, end

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise FormatError(str(self.path), f"truncated {what}", self.pos)
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def u(self, fmt: str, what: str) -> int:
        size = struct.calcsize(">" + fmt)
        return int(struct.unpack(">" + fmt, self.take(size, what))[0])

    def string(self, what: str) -> str:
        n = self.u("I", what)
        return self.take(n, what).decode("utf-8", "replace")

    def array(self, dtype: np.dtype, count: int, what: str) -> npt.NDArray[np.void]:
        raw = self.take(dtype.itemsize * count, what)
        return np.frombuffer(raw, dtype=dtype, count=count)


def read_hpcrun(path: str | Path) -> HpcrunProfile:
    """Read one ``*.hpcrun`` file (format 4.0). Raises :class:`FormatError` naming the file and
    offset for anything that is not such a file or is cut short."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise FormatError(str(p), f"cannot read: {e.strerror}") from None
    if not data.startswith(PROFILE_MAGIC):
        raise FormatError(str(p), "not an hpcrun profile (expected magic 'HPCRUN-profile____')", 0)
    version = data[18:23]
    if version[:2] != b"04":
        raise FormatError(str(p), f"unsupported hpcrun format version {version!r} (expected 04.x)",
                          18)
    if len(data) < 24 + FOOTER_SIZE:
        raise FormatError(str(p), "truncated file (no footer)", len(data))
    foot = struct.unpack(">14Q", data[-FOOTER_SIZE:])
    if foot[13] != FOOTER_MAGIC:
        raise FormatError(str(p), "bad footer (expected magic 'HPCRUNsm')", len(data) - 8)
    hs, he, ls, le, cs, ce, ms, me, ds, de, ss, se = foot[:12]
    limit = len(data) - FOOTER_SIZE
    for lo, hi, what in ((hs, he, "header"), (ls, le, "load map"), (cs, ce, "cct"),
                         (ms, me, "metric table"), (ds, de, "identifier dictionary"),
                         (ss, se, "sparse metrics")):
        if not lo <= hi <= limit:
            raise FormatError(str(p), f"footer: {what} section [{lo}, {hi}) outside the file",
                              len(data) - FOOTER_SIZE)
    # header: magic, version, endianness, then name/value pairs
    c = _Cursor(data, p, hs + 24, he)
    header = {}
    for _ in range(c.u("I", "header")):
        k = c.string("header name")
        header[k] = c.string("header value")
    c = _Cursor(data, p, ls, le)
    modules = {}
    for _ in range(c.u("I", "load map")):
        lm = c.u("H", "load map entry")
        modules[lm] = c.string("load module name")
        c.u("Q", "load map flags")
    c = _Cursor(data, p, ms, me)
    metrics = []
    for _ in range(c.u("I", "metric table")):
        name = c.string("metric name")
        desc = c.string("metric description")
        at = c.pos
        kind, valfmt, show, show_pct, move2proc = _metric_flags(c.take(16, "metric flags"))
        if valfmt not in (VALFMT_INT, VALFMT_REAL):
            # hpcprof rejects the whole file ("Invalid metric value format")
            raise FormatError(str(p), f"metric {name!r}: value format {valfmt} is neither "
                              f"{VALFMT_INT} (integer) nor {VALFMT_REAL} (real)", at)
        period = c.u("Q", "metric period")
        formula = c.string("metric formula")
        fmt = c.string("metric format")
        is_freq, is_mux = c.u("H", "metric frequency flag"), c.u("H", "metric multiplex flag")
        mean = struct.unpack(">d", c.take(8, "metric threshold mean"))[0]
        n_samples = c.u("Q", "metric sample count")
        metrics.append(HpcrunMetric(name, desc, valfmt == VALFMT_INT, period, valfmt, kind,
                                    show, show_pct, move2proc, formula, fmt, is_freq != 0,
                                    is_mux != 0, float(mean), n_samples))
    c = _Cursor(data, p, ds, de)
    id_names = {}
    if de > ds:
        for _ in range(c.u("H", "identifier dictionary")):
            kind = c.u("H", "identifier kind")
            id_names[kind] = c.string("identifier name")
    c = _Cursor(data, p, cs, ce)
    n_nodes = c.u("Q", "cct")
    nodes = c.array(CCT_NODE, n_nodes, "cct nodes")
    c = _Cursor(data, p, ss, se)
    tup = []
    for _ in range(c.u("H", "identifier tuple")):
        kind = c.u("H", "identifier")
        phys = c.u("Q", "identifier")
        logical = c.u("Q", "identifier")
        tup.append((kind, phys, logical))
    n_vals = c.u("Q", "sparse metrics")
    n_nz = c.u("I", "sparse metrics")
    vals = c.array(VALUE, n_vals, "metric values")
    blocks = c.array(BLOCK, n_nz + 1, "metric value index")
    starts = blocks["start"].astype(np.int64)
    if n_nz and (np.any(np.diff(starts) < 0) or starts[-1] != n_vals):
        raise FormatError(str(p), "sparse metric index is not increasing or does not end at "
                          "the value count", ss)
    counts = np.diff(starts)
    value_node = np.repeat(blocks["node"][:-1].astype(np.int64), counts)
    mids = vals["mid"].astype(np.int64)
    if len(mids) and int(mids.max()) >= len(metrics):
        raise FormatError(str(p), f"metric id {int(mids.max())} not in the metric table of "
                          f"{len(metrics)}", ss)
    bits = vals["bits"].astype(np.uint64)
    as_float = bits.view(np.float64)
    is_int = np.array([m.is_int for m in metrics], dtype=bool)
    value = np.where(is_int[mids] if len(mids) else np.zeros(0, bool),
                     bits.astype(np.float64), as_float) if len(mids) else np.zeros(0)
    return HpcrunProfile(
        path=p, header=header, modules=modules, metrics=metrics, id_tuple=tup,
        node_id=nodes["id"].astype(np.int64), node_parent=nodes["parent"].astype(np.int64),
        node_lm=nodes["lm"].astype(np.int64), node_ip=nodes["ip"].astype(np.uint64),
        value_node=value_node, value_mid=mids, value=value.astype(np.float64),
        id_names=id_names, node_unwound=(nodes["flags"] & UNWOUND_FLAG) != 0)


@dataclass
class HpcTrace:
    path: Path
    flags: int
    times: npt.NDArray[np.uint64]
    nodes: npt.NDArray[np.int64]  # hpcrun CCT node ids (0: none)


def read_hpctrace(path: str | Path) -> HpcTrace:
    """Read one ``*.hpctrace`` file (version 01.01, no data-centric metric ids)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise FormatError(str(p), f"cannot read: {e.strerror}") from None
    if not data.startswith(TRACE_MAGIC) or len(data) < 32:
        raise FormatError(str(p), "not an hpcrun trace (expected magic 'HPCRUN-trace______')", 0)
    flags = struct.unpack(">Q", data[24:32])[0]
    if flags & 1:
        raise FormatError(str(p), "data-centric traces (metric ids) are not supported", 24)
    body = data[32:]
    n = len(body) // TRACE_REC.itemsize
    if n * TRACE_REC.itemsize != len(body):
        raise FormatError(str(p), "truncated trace record", 32 + n * TRACE_REC.itemsize)
    rec = np.frombuffer(body, dtype=TRACE_REC, count=n)
    return HpcTrace(p, int(flags), rec["time"].astype(np.uint64), rec["node"].astype(np.int64))
