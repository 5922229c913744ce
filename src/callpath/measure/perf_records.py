"""Decode the raw perf_event records that ``callpath run`` streamed to ``raw.perf``.

The file is the concatenation of ring-buffer contents: whole records, 8-byte aligned. Only the
walk from record to record is a Python loop (a record's size says where the next starts);
sample fields are then gathered for all samples at once from a ``uint64`` view of the file,
and the user-stack copies are never copied out: the unwinder reads them in place through
word indices (``stack0``) into that view.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.errors import FormatError

REC_MMAP, REC_LOST, REC_COMM, REC_EXIT, REC_THROTTLE, REC_UNTHROTTLE, REC_FORK = 1, 2, 3, 4, 5, 6, 7
REC_SAMPLE, REC_MMAP2, REC_LOST_SAMPLES, REC_SWITCH = 9, 10, 13, 14
MISC_SWITCH_OUT, MISC_SWITCH_OUT_PREEMPT = 0x2000, 0x4000
MISC_COMM_EXEC = 0x2000
MISC_MMAP_BUILD_ID = 0x4000
_HDR = struct.Struct("<IHH")
TRAILER_WORDS = 4  # sample_id_all: pid/tid, time, cpu/res, identifier

U64 = npt.NDArray[np.uint64]


@dataclass
class Sideband:
    """A non-sample record: process and thread life, mappings, losses. Sorted by time."""

    kind: str
    time: int
    pid: int
    tid: int
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class Samples:
    time: U64
    pid: npt.NDArray[np.int64]
    tid: npt.NDArray[np.int64]
    cpu: npt.NDArray[np.int64]
    period: U64
    metric: npt.NDArray[np.int64]
    regs: U64            # (n, len(REGS_ORDER)) user registers at the sample, perf order
    has_regs: npt.NDArray[np.bool_]
    stack0: npt.NDArray[np.int64]   # word index of the stack copy's first word in ``words``
    stack_words: npt.NDArray[np.int64]  # valid words in the copy (dyn_size / 8)
    callchain0: npt.NDArray[np.int64]   # word index of the kernel call chain's first entry
    callchain_n: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.time)

    def take(self, sel: npt.NDArray[Any]) -> Samples:
        return Samples(*(getattr(self, f)[sel] for f in self.__dataclass_fields__))


@dataclass
class Switches:
    """PERF_RECORD_SWITCH records (``-e REALTIME``): a thread switched out of a CPU (``out``;
    ``preempt``: while runnable) or back in, in file order."""

    time: U64
    pid: npt.NDArray[np.int64]
    tid: npt.NDArray[np.int64]
    out: npt.NDArray[np.bool_]
    preempt: npt.NDArray[np.bool_]

    def __len__(self) -> int:
        return len(self.time)


@dataclass
class RawData:
    words: U64
    samples: Samples
    sideband: list[Sideband]
    lost: int
    bad_samples: int
    switches: Switches | None = None


def decode(path: Path, raw_info: dict[str, Any]) -> RawData:
    """Decode ``raw.perf`` written with the attributes in ``raw_info`` (measurement.json)."""
    nregs = len(raw_info["regs"])
    ids = {int(k): int(v) for k, v in raw_info["ids"].items()}
    size = path.stat().st_size if path.exists() else 0
    size -= size % 8
    if size == 0:
        words = np.zeros(0, dtype=np.uint64)
        buf: bytes | mmap.mmap = b""
    else:
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        words = np.frombuffer(buf, dtype=np.uint64, count=size // 8)
    sample_offsets: list[int] = []
    switch_offsets: list[int] = []
    side: list[Sideband] = []
    lost = 0
    bad = 0
    pos = 0
    unpack = _HDR.unpack_from
    while pos + 8 <= size:
        typ, misc, rsize = unpack(buf, pos)
        if rsize < 8 or rsize % 8 or pos + rsize > size:
            break  # a torn tail (killed mid-write): keep what came before
        if typ == REC_SAMPLE:
            sample_offsets.append(pos)
        elif typ == REC_SWITCH and rsize == 8 + 8 * TRAILER_WORDS:
            switch_offsets.append(pos)
        elif typ in (REC_MMAP2, REC_COMM, REC_FORK, REC_EXIT, REC_LOST, REC_THROTTLE,
                     REC_UNTHROTTLE, REC_LOST_SAMPLES):
            try:
                sb = _sideband(buf, pos, typ, misc, rsize)
            except (struct.error, IndexError, ValueError):
                bad += 1  # a record too short for its type: skip it
            else:
                if sb.kind in ("lost", "lost_samples"):
                    lost += int(sb.fields["lost"])
                side.append(sb)
        pos += rsize
    side.sort(key=lambda s: s.time)
    samples, bad_samples = _samples(words, np.asarray(sample_offsets, dtype=np.int64) // 8,
                                    nregs, ids)
    return RawData(words, samples, side, lost, bad + bad_samples,
                   _switches(words, np.asarray(switch_offsets, dtype=np.int64) // 8))


def _switches(w: U64, o: npt.NDArray[np.int64]) -> Switches:
    """Gather the switch records (header, then the sample_id trailer: pid/tid, time, ...)."""
    misc = (w[o] >> np.uint64(32)) & np.uint64(0xFFFF)
    pidtid = w[o + 1]
    return Switches(w[o + 2], (pidtid & np.uint64(0xFFFFFFFF)).astype(np.int64),
                    (pidtid >> np.uint64(32)).astype(np.int64),
                    (misc & np.uint64(MISC_SWITCH_OUT)) != 0,
                    (misc & np.uint64(MISC_SWITCH_OUT_PREEMPT)) != 0)


def _sideband(buf: Any, pos: int, typ: int, misc: int, rsize: int) -> Sideband:
    end = pos + rsize
    if rsize < 8 + 8 * TRAILER_WORDS:
        raise ValueError("record shorter than its sample_id trailer")
    tpid, ttid, ttime = struct.unpack_from("<IIQ", buf, end - 8 * TRAILER_WORDS)
    body = pos + 8
    if typ == REC_MMAP2:
        pid, tid, addr, length, pgoff = struct.unpack_from("<IIQQQ", buf, body)
        build_id = ""
        if misc & MISC_MMAP_BUILD_ID:
            n = buf[body + 32]
            build_id = bytes(buf[body + 36:body + 36 + n]).hex()
        prot, _flags = struct.unpack_from("<II", buf, body + 56)
        name_end = end - 8 * TRAILER_WORDS
        raw_name = bytes(buf[body + 64:name_end])
        name = raw_name.split(b"\0", 1)[0].decode("utf-8", "replace")
        return Sideband("mmap", ttime, pid, tid, {"addr": addr, "len": length, "pgoff": pgoff,
                                                  "build_id": build_id, "prot": prot,
                                                  "path": name})
    if typ == REC_COMM:
        pid, tid = struct.unpack_from("<II", buf, body)
        raw_comm = bytes(buf[body + 8:end - 8 * TRAILER_WORDS]).split(b"\0", 1)[0]
        return Sideband("exec" if misc & MISC_COMM_EXEC else "comm", ttime, pid, tid,
                        {"comm": raw_comm.decode("utf-8", "replace")})
    if typ in (REC_FORK, REC_EXIT):
        pid, ppid, tid, ptid, t = struct.unpack_from("<IIIIQ", buf, body)
        return Sideband("fork" if typ == REC_FORK else "exit", t, pid, tid,
                        {"ppid": ppid, "ptid": ptid})
    if typ == REC_LOST:
        _id, n = struct.unpack_from("<QQ", buf, body)
        return Sideband("lost", ttime, tpid, ttid, {"lost": n})
    if typ == REC_LOST_SAMPLES:
        (n,) = struct.unpack_from("<Q", buf, body)
        return Sideband("lost_samples", ttime, tpid, ttid, {"lost": n})
    t = struct.unpack_from("<Q", buf, body)[0]
    return Sideband("throttle" if typ == REC_THROTTLE else "unthrottle", t, tpid, ttid, {})


def _samples(w: U64, o: npt.NDArray[np.int64], nregs: int,
             ids: dict[int, int]) -> tuple[Samples, int]:
    """Gather the fields of all samples (layout fixed by ``perf.make_attr``'s sample_type)."""
    n = len(o)
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return Samples(z.astype(np.uint64), z, z, z, z.astype(np.uint64), z,
                       np.zeros((0, nregs), dtype=np.uint64), z.astype(bool), z, z, z, z), 0
    ident = w[o + 1]
    pidtid = w[o + 3]
    lim = len(w)
    cc = o + 7  # the call chain's length word
    nr = w[np.minimum(cc, lim - 1)].astype(np.int64)
    good = (nr >= 0) & (nr < 4096) & (cc + 1 + nr < lim)
    nr = np.where(good, nr, 0)
    abi_at = cc + 1 + nr
    abi = w[np.minimum(abi_at, lim - 1)]
    has_regs = good & (abi != 0)
    regs0 = abi_at + 1
    ridx = np.minimum(regs0[:, None] + np.arange(nregs), lim - 1)
    regs = np.where(has_regs[:, None], w[ridx], np.uint64(0))
    size_at = np.where(has_regs, regs0 + nregs, regs0)
    ssize = w[np.minimum(size_at, lim - 1)].astype(np.int64)
    stack0 = size_at + 1
    dyn_at = stack0 + ssize // 8
    ok = good & (ssize >= 0) & (dyn_at < lim)
    dyn = np.where(ok, w[np.clip(dyn_at, 0, lim - 1)].astype(np.int64), 0)  # ssize < 0: junk
    dyn = np.where(ssize > 0, np.minimum(dyn, ssize), 0)
    uid, inv = np.unique(ident, return_inverse=True)
    metric = np.array([ids.get(int(i), -1) for i in uid.tolist()],
                      dtype=np.int64)[inv.reshape(-1)]
    ok &= metric >= 0
    s = Samples(time=w[o + 4], pid=(pidtid & 0xFFFFFFFF).astype(np.int64),
                tid=(pidtid >> np.uint64(32)).astype(np.int64),
                cpu=(w[o + 5] & 0xFFFFFFFF).astype(np.int64), period=w[o + 6],
                metric=metric, regs=regs, has_regs=has_regs & ok, stack0=stack0,
                stack_words=dyn // 8, callchain0=cc + 1, callchain_n=nr)
    bad = int(np.count_nonzero(~ok))
    if bad:
        s = s.take(ok)
    return s, bad


def check_raw_info(path: Path, raw_info: Any) -> dict[str, Any]:
    if not isinstance(raw_info, dict) or not {"regs", "ids"} <= set(raw_info):
        raise FormatError(path, "expected a \"raw\" object with \"regs\" and \"ids\" (the "
                          "attributes of the recorded events)")
    return raw_info
