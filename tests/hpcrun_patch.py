"""Rewrites fields of real ``*.hpcrun`` files in place, byte-exactly, for tests of how values
are read: the metric descriptors' flags, period and perf-event fields, and the value words.

It walks the layout of HPCToolkit's ``hpcrun-fmt.h`` on its own (footer, metric table, sparse
metrics) rather than through callpath's reader, so that a misreading there cannot hide here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FOOTER = 112


@dataclass
class Descriptor:
    name: str
    flags_at: int  # 16 flag bytes
    period_at: int  # u64
    freq_at: int  # u16 is_frequency, u16 is_multiplexed, f64 threshold_mean, u64 num_samples


def _string(data: bytes, pos: int) -> tuple[str, int]:
    n = struct.unpack_from(">I", data, pos)[0]
    return data[pos + 4:pos + 4 + n].decode(), pos + 4 + n


def descriptors(data: bytes) -> list[Descriptor]:
    foot = struct.unpack(">14Q", data[-FOOTER:])
    pos = foot[6]
    out = []
    count = struct.unpack_from(">I", data, pos)[0]
    pos += 4
    for _ in range(count):
        name, pos = _string(data, pos)
        _, pos = _string(data, pos)
        flags_at = pos
        period_at = pos + 16
        pos = period_at + 8
        _, pos = _string(data, pos)  # formula
        _, pos = _string(data, pos)  # format
        out.append(Descriptor(name, flags_at, period_at, pos))
        pos += 2 + 2 + 8 + 8
    assert pos == foot[7], "metric table does not end where the footer says"
    return out


def value_words(data: bytes) -> tuple[int, int]:
    """(offset, count) of the ``(u64 bits, u16 metric id)`` pairs of the sparse metrics."""
    foot = struct.unpack(">14Q", data[-FOOTER:])
    pos = foot[10]
    n_ids = struct.unpack_from(">H", data, pos)[0]
    pos += 2 + n_ids * (2 + 8 + 8)
    n_vals = struct.unpack_from(">Q", data, pos)[0]
    return pos + 8 + 4, n_vals


def patch(path: Path, *, period: int | None = None, frequency: int | None = None,
          multiplexed: int | None = None, threshold_mean: float | None = None,
          num_samples: int | None = None, flags: bytes | None = None,
          values_to_int_scale: float | None = None) -> None:
    """Rewrite every metric descriptor of ``path`` (these files have one metric); with
    ``values_to_int_scale``, every stored double ``v`` becomes the u64 ``round(v * scale)``."""
    data = bytearray(path.read_bytes())
    for d in descriptors(bytes(data)):
        if flags is not None:
            assert len(flags) == 16
            data[d.flags_at:d.flags_at + 16] = flags
        if period is not None:
            struct.pack_into(">Q", data, d.period_at, period)
        if frequency is not None:
            struct.pack_into(">H", data, d.freq_at, frequency)
        if multiplexed is not None:
            struct.pack_into(">H", data, d.freq_at + 2, multiplexed)
        if threshold_mean is not None:
            struct.pack_into(">d", data, d.freq_at + 4, threshold_mean)
        if num_samples is not None:
            struct.pack_into(">Q", data, d.freq_at + 12, num_samples)
    if values_to_int_scale is not None:
        at, n = value_words(bytes(data))
        pairs = np.frombuffer(bytes(data[at:at + 10 * n]),
                              dtype=np.dtype([("bits", ">u8"), ("mid", ">u2")])).copy()
        as_real = pairs["bits"].astype(np.uint64).view(np.float64)
        pairs["bits"] = np.rint(as_real * values_to_int_scale).astype(np.uint64)
        data[at:at + 10 * n] = pairs.tobytes()
    path.write_bytes(bytes(data))


def new_flags(value_format: int, kind: int = 1, show: int = 1, show_percent: int = 1) -> bytes:
    """The 16 flag bytes as hpcrun writes them now: one byte per field."""
    return bytes([kind, 0, value_format, 0, 0, 0, show, show_percent]) + bytes(8)


def old_flags(value_format: int, kind: int = 1, show: int = 1, show_percent: int = 1) -> bytes:
    """The older non-portable convention hpcprof still reads: two big-endian u64 of C
    bit-fields (ty:4, valTy:4, valFmt:4, partner:16, show:1, showPercent:1 from the low bits).
    Its first byte (the high bits of the first word) is 0, which is neither the raw nor the
    final kind: that is how hpcprof tells the conventions apart."""
    word = kind | (value_format << 8) | (show << 28) | (show_percent << 29)
    return struct.pack(">QQ", word, 0)
