"""Protocol buffers wire format, written and read with numpy (for pprof's ``profile.proto``).

Why our own and not the ``protobuf`` runtime: a pprof profile is a handful of message types
made of integers, and its bulk (10^6 samples, each a packed list of location ids and of values)
can be laid out for all messages at once with numpy, as the v4 writer lays out its records;
building 10^6 message objects through the runtime would cost seconds and add a compiled
dependency to callpath. The tests read what we write with pprof itself (``go tool pprof``),
the format's own consumer.

Writing works on :class:`Ragged` byte arrays: one byte string per message, all in one buffer.
Reading (:func:`fields`) walks one message's fields in Python; packed integer arrays, the bulk
of a profile, are decoded vectorised (:func:`unpack_varints`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.errors import FormatError

U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

VARINT, I64_WIRE, LEN, I32_WIRE = 0, 1, 2, 5


@dataclass
class Ragged:
    """``n`` byte strings: string ``i`` is ``data[offsets[i]:offsets[i+1]]``."""

    data: U8
    offsets: I64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> I64:
        return np.diff(self.offsets)

    def tobytes(self) -> bytes:
        return self.data.tobytes()

    @classmethod
    def of_bytes(cls, items: list[bytes]) -> Ragged:
        lens = np.fromiter((len(b) for b in items), dtype=np.int64, count=len(items))
        off = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum(lens, out=off[1:])
        return cls(np.frombuffer(b"".join(items), dtype=np.uint8).copy(), off)


def _offsets(lens: I64) -> I64:
    off = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    return off


_THRESHOLDS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)


def varint_lengths(v: U64) -> I64:
    """Bytes of each value's varint (1..10): one more per threshold 2^7k it reaches."""
    lens: I64 = np.searchsorted(_THRESHOLDS, v, side="right").astype(np.int64) + 1
    return lens


def varints(values: npt.ArrayLike) -> Ragged:
    """One varint per value (negative int64 values as their two's complement, as protobuf
    encodes int64). Byte ``k`` is written for the values that still have one (a shrinking
    set: most values of a profile take one or two bytes)."""
    v = np.asarray(values).astype(np.int64).view(np.uint64)
    lens = varint_lengths(v)
    off = _offsets(lens)
    out = np.empty(int(off[-1]), dtype=np.uint8)
    act = np.arange(len(v), dtype=np.int64)
    rest = v.copy()
    k = 0
    while len(act):
        more = lens[act] > k + 1
        out[off[act] + k] = ((rest[act] & np.uint64(0x7F)).astype(np.uint8)
                             | (more.astype(np.uint8) << np.uint8(7)))
        act = act[more]
        rest[act] >>= np.uint64(7)
        k += 1
    return Ragged(out, off)


def _key(field: int, wire: int) -> bytes:
    return varints([field << 3 | wire]).tobytes()


def concat(parts: list[Ragged]) -> Ragged:
    """Element-wise concatenation: string ``i`` of the result is the strings ``i`` of every
    part in order (all parts hold the same number of strings)."""
    n = len(parts[0])
    lens = np.zeros(n, dtype=np.int64)
    for p in parts:
        lens += p.lengths()
    off = _offsets(lens)
    out = np.empty(int(off[-1]), dtype=np.uint8)
    cursor = off[:-1].copy()
    for p in parts:
        pl = p.lengths()
        total = int(pl.sum())
        if total:
            # element i's bytes are contiguous in p.data from p.offsets[i]: byte j of the
            # part's data goes to j + (cursor[i] - (p.offsets[i] - p.offsets[0]))
            shift = cursor - (p.offsets[:-1] - p.offsets[0])
            dest = np.arange(total, dtype=np.int64)
            dest += np.repeat(shift, pl)
            out[dest] = p.data[p.offsets[0]:p.offsets[0] + total]
        cursor += pl
    return Ragged(out, off)


def constant(b: bytes, n: int) -> Ragged:
    data = np.tile(np.frombuffer(b, dtype=np.uint8), n)
    return Ragged(data, np.arange(n + 1, dtype=np.int64) * len(b))


def scalar_field(field: int, values: npt.ArrayLike, *, skip_zero: bool = True) -> Ragged:
    """Field ``field`` (varint) in each message; zeros are left out (the proto3 default)."""
    v = np.asarray(values).astype(np.int64)
    enc = concat([constant(_key(field, VARINT), len(v)), varints(v)])
    if not skip_zero:
        return enc
    keep_len = np.where(v != 0, enc.lengths(), 0)
    return select(enc, keep_len)


def select(r: Ragged, new_lens: I64) -> Ragged:
    """Keep the first ``new_lens[i]`` bytes of each string (0 drops it)."""
    total = int(new_lens.sum())
    src = np.repeat(r.offsets[:-1], new_lens) + (np.arange(total, dtype=np.int64)
                                                - np.repeat(_offsets(new_lens)[:-1], new_lens))
    return Ragged(r.data[src], _offsets(new_lens))


def len_field(field: int, payload: Ragged) -> Ragged:
    """Field ``field`` (length-delimited) holding each message's payload."""
    n = len(payload)
    return concat([constant(_key(field, LEN), n), varints(payload.lengths()), payload])


def packed(values: npt.ArrayLike, counts: I64) -> Ragged:
    """Each message's packed varint array: ``counts[i]`` consecutive values each."""
    enc = varints(values)
    per = np.add.reduceat(enc.lengths(), _offsets(counts)[:-1]) if len(enc) else \
        np.zeros(len(counts), dtype=np.int64)
    per = np.where(counts > 0, per, 0)  # reduceat repeats a value at empty groups
    return Ragged(enc.data, _offsets(per))


def strings(items: list[str]) -> Ragged:
    return Ragged.of_bytes([s.encode("utf-8", "surrogateescape") for s in items])


# ---- reading ------------------------------------------------------------------------------


def read_varint(buf: bytes, pos: int, what: object) -> tuple[int, int]:
    result = 0
    shift = 0
    n = len(buf)
    while True:
        if pos >= n:
            raise FormatError(what, "truncated protobuf varint", pos)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise FormatError(what, "protobuf varint longer than 10 bytes", pos)


def fields(buf: bytes, what: object, start: int = 0, end: int | None = None
           ) -> Iterator[tuple[int, int, int | bytes]]:
    """(field, wire type, value) of one message: an int for varints and fixed-size fields,
    the bytes of length-delimited ones."""
    pos = start
    stop = len(buf) if end is None else end
    while pos < stop:
        key, pos = read_varint(buf, pos, what)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise FormatError(what, "protobuf field number 0", pos)
        if wire == VARINT:
            val, pos = read_varint(buf, pos, what)
            yield field, wire, val
        elif wire == LEN:
            ln, pos = read_varint(buf, pos, what)
            if pos + ln > stop:
                raise FormatError(what, f"protobuf field {field} runs past the end of its "
                                  f"message ({ln} bytes)", pos)
            yield field, wire, buf[pos:pos + ln]
            pos += ln
        elif wire in (I64_WIRE, I32_WIRE):
            size = 8 if wire == I64_WIRE else 4
            if pos + size > stop:
                raise FormatError(what, "truncated protobuf fixed-size field", pos)
            yield field, wire, int.from_bytes(buf[pos:pos + size], "little")
            pos += size
        else:
            raise FormatError(what, f"protobuf wire type {wire} is not one of 0, 1, 2, 5", pos)


def unpack_varints(data: bytes, what: object) -> U64:
    """A packed array of varints, decoded vectorised."""
    b = np.frombuffer(data, dtype=np.uint8)
    if not len(b):
        return np.zeros(0, dtype=np.uint64)
    ends = np.flatnonzero(b < 0x80)
    if not len(ends) or ends[-1] != len(b) - 1:
        raise FormatError(what, "truncated packed protobuf varints")
    starts = np.concatenate([[0], ends[:-1] + 1])
    lens = ends - starts + 1
    if int(lens.max()) > 10:
        raise FormatError(what, "protobuf varint longer than 10 bytes")
    shift = (np.arange(len(b)) - np.repeat(starts, lens)).astype(np.uint64) * np.uint64(7)
    parts = (b & 0x7F).astype(np.uint64) << shift
    out: U64 = np.add.reduceat(parts, starts)  # the groups' bits are disjoint: sum == or
    return out


def varint_list(data: bytes, what: object, *, signed: bool = False) -> list[int]:
    """A packed array of varints as Python ints: a plain loop for the short arrays of one
    message (numpy's per-call cost is ~20x a sample's few bytes), :func:`unpack_varints`
    for long ones. ``signed``: int64 two's complement."""
    if len(data) > 256:
        arr = unpack_varints(data, what)
        return (arr.astype(np.int64) if signed else arr).tolist()  # type: ignore[no-any-return]
    out: list[int] = []
    val = shift = 0
    for b in data:
        val |= (b & 0x7F) << shift
        if b < 0x80:
            out.append(val - (1 << 64) if signed and val >= 1 << 63 else val)
            val = shift = 0
        else:
            shift += 7
            if shift > 63:
                raise FormatError(what, "protobuf varint longer than 10 bytes")
    if shift:
        raise FormatError(what, "truncated packed protobuf varints")
    return out
