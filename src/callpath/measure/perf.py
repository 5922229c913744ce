"""The ``perf_event_open`` system call through ctypes, and the memory-mapped ring buffers.

Why ctypes and not the ``perf`` binary: the measurement must work wherever the kernel allows
perf_event, with nothing but Python installed. One event per CPU with its own ring buffer
(inherited events opened on all CPUs at once cannot be memory-mapped); further events of the
same CPU send their records into the first one's ring (``PERF_EVENT_IOC_SET_OUTPUT``), so there
is one ring per CPU whatever the number of metrics.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
from dataclasses import dataclass

from callpath.errors import CallpathError

SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
PERF_FLAG_FD_CLOEXEC = 1 << 3

# perf_event_attr.sample_type bits
SAMPLE_IP = 1 << 0
SAMPLE_TID = 1 << 1
SAMPLE_TIME = 1 << 2
SAMPLE_ADDR = 1 << 3
SAMPLE_READ = 1 << 4
SAMPLE_CALLCHAIN = 1 << 5
SAMPLE_ID = 1 << 6
SAMPLE_CPU = 1 << 7
SAMPLE_PERIOD = 1 << 8
SAMPLE_REGS_USER = 1 << 12
SAMPLE_STACK_USER = 1 << 13
SAMPLE_IDENTIFIER = 1 << 16

# perf_event_attr flag bits (the bitfield word)
F_DISABLED = 1 << 0
F_INHERIT = 1 << 1
F_EXCLUDE_KERNEL = 1 << 5
F_EXCLUDE_HV = 1 << 6
F_MMAP = 1 << 8
F_COMM = 1 << 9
F_FREQ = 1 << 10
F_ENABLE_ON_EXEC = 1 << 12
F_TASK = 1 << 13
F_SAMPLE_ID_ALL = 1 << 18
F_EXCLUDE_CALLCHAIN_KERNEL = 1 << 21
F_EXCLUDE_CALLCHAIN_USER = 1 << 22
F_MMAP2 = 1 << 23
F_COMM_EXEC = 1 << 24
F_USE_CLOCKID = 1 << 25
F_CONTEXT_SWITCH = 1 << 26
F_BUILD_ID = 1 << 34

CLOCK_MONOTONIC = 1

PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_SET_OUTPUT = 0x2405
PERF_EVENT_IOC_ID = 0x80082407

# x86-64 perf register numbers we ask for: AX BX CX DX SI DI BP SP IP, R8..R15 (no flags/segs)
X86_REGS = ["ax", "bx", "cx", "dx", "si", "di", "bp", "sp", "ip",
            "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"]
X86_REG_NUM = {"ax": 0, "bx": 1, "cx": 2, "dx": 3, "si": 4, "di": 5, "bp": 6, "sp": 7,
               "ip": 8, **{f"r{i}": 8 + i for i in range(8, 16)}}
REGS_MASK = sum(1 << X86_REG_NUM[r] for r in X86_REGS)
# In the sample, registers come in ascending perf number order.
REGS_ORDER = sorted(X86_REGS, key=lambda r: X86_REG_NUM[r])


class PerfEventAttr(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32), ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64), ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32), ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64), ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16), ("reserved2", ctypes.c_uint16),
        ("aux_sample_size", ctypes.c_uint32), ("reserved3", ctypes.c_uint32),
        ("sig_data", ctypes.c_uint64), ("config3", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.ioctl.restype = ctypes.c_int


def _nr() -> int:
    machine = os.uname().machine
    if machine not in SYS_PERF_EVENT_OPEN:
        raise CallpathError(f"callpath run supports x86-64 Linux; this machine is {machine}")
    return SYS_PERF_EVENT_OPEN[machine]


@dataclass(frozen=True)
class EventSpec:
    """What to open: perf type/config and either a period or a frequency."""

    name: str
    type: int
    config: int
    period: int = 0
    frequency: int = 0


class PerfOpenError(CallpathError):
    def __init__(self, name: str, err: int, reason: str) -> None:
        super().__init__(f"cannot open event {name}: {reason}")
        self.errno = err
        self.reason = reason


def explain(err: int, spec: EventSpec) -> str:
    """Turn an errno from perf_event_open into the reason a user can act on."""
    if err in (errno.ENOENT, errno.EOPNOTSUPP) and spec.type in (0, 3, 4):
        return ("no hardware performance counters (the PMU is not available, e.g. in a "
                "virtual machine)")
    if err == errno.ENOENT:
        return "the kernel does not know this event"
    if err in (errno.EACCES, errno.EPERM):
        return ("permission denied (see /proc/sys/kernel/perf_event_paranoid, or run as "
                "root / with CAP_PERFMON)")
    if err == errno.ENODEV:
        return "no such PMU on this machine"
    if err == errno.EINVAL:
        return "invalid attributes (the period/frequency may exceed " \
               "/proc/sys/kernel/perf_event_max_sample_rate)"
    if err == errno.ENOSYS:
        return "the kernel has no perf_event support"
    return os.strerror(err)


#: Bytes of user stack copied with each sample (perf's DWARF-mode default too). The copy is
#: the main cost callpath adds in the program: at 1 kHz on a CPU-bound program 16 KiB cost
#: 2.2% of its CPU time, 8 KiB 1.7%, 4 KiB 1.2%, against 1.1% for `perf record -g` (medians of
#: 7, bench/measure_native.py). Deeper stacks end as partial paths that the summary counts;
#: `callpath run --stack-size` raises it.
DEFAULT_STACK_SIZE = 8192


def make_attr(spec: EventSpec, *, sample: bool = True, stack_size: int = DEFAULT_STACK_SIZE,
              inherit: bool = True, exclude_kernel: bool = False,
              sideband: bool = False, switch_records: bool = False,
              user_callchain: bool = True) -> PerfEventAttr:
    """Attributes of a sampling event. ``sideband``: also report mmaps (with build-ids),
    comm/exec, fork and exit (asked of one event only, or records come twice).

    ``switch_records`` (``callpath run -e REALTIME``, on an event of their own): also a
    PERF_RECORD_SWITCH at every switch of a thread out of and back onto a CPU (40 bytes, about
    0.5 us each here; the out record says whether the thread was preempted), which give each
    thread's time off CPU exactly. ``SAMPLE_READ`` of the thread's clock in each sample would
    too, but with ``inherit`` it made every context switch of the program 4-5x dearer (Linux
    6.18, bench/offcpu.py). ``user_callchain`` False drops the frame-pointer call chain the
    kernel would walk (unused: CFI unwinding replaces it) for events whose rate a program
    controls, such as context switches.
    """
    a = PerfEventAttr()
    a.type = spec.type
    a.size = ctypes.sizeof(PerfEventAttr)
    a.config = spec.config
    flags = F_DISABLED | F_ENABLE_ON_EXEC | F_EXCLUDE_HV | F_EXCLUDE_CALLCHAIN_KERNEL
    if inherit:
        flags |= F_INHERIT
    if sideband:
        flags |= F_MMAP | F_MMAP2 | F_COMM | F_COMM_EXEC | F_TASK | F_BUILD_ID
    if exclude_kernel:
        flags |= F_EXCLUDE_KERNEL
    if spec.frequency:
        flags |= F_FREQ
        a.sample_period = spec.frequency
    else:
        a.sample_period = spec.period
    if sample:
        a.sample_type = (SAMPLE_IDENTIFIER | SAMPLE_IP | SAMPLE_TID | SAMPLE_TIME | SAMPLE_CPU
                         | SAMPLE_PERIOD | SAMPLE_CALLCHAIN | SAMPLE_REGS_USER
                         | SAMPLE_STACK_USER)
        a.sample_regs_user = REGS_MASK
        a.sample_stack_user = stack_size
        a.sample_max_stack = 127
        flags |= F_SAMPLE_ID_ALL | F_USE_CLOCKID
        a.clockid = CLOCK_MONOTONIC
        if switch_records:
            flags |= F_CONTEXT_SWITCH
        if not user_callchain:
            flags |= F_EXCLUDE_CALLCHAIN_USER
    a.flags = flags
    a.wakeup_events = 0
    return a


def perf_event_open(attr: PerfEventAttr, pid: int, cpu: int, group_fd: int = -1) -> int:
    fd = _libc.syscall(_nr(), ctypes.byref(attr), pid, cpu, group_fd, PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return int(fd)


def ioctl(fd: int, request: int, arg: int = 0) -> None:
    if _libc.ioctl(fd, ctypes.c_ulong(request), ctypes.c_ulong(arg)) < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def event_id(fd: int) -> int:
    out = ctypes.c_uint64(0)
    if _libc.ioctl(fd, ctypes.c_ulong(PERF_EVENT_IOC_ID), ctypes.byref(out)) < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return int(out.value)


def online_cpus() -> list[int]:
    """CPUs to open events on (``/sys/devices/system/cpu/online``, e.g. ``0-3,6``)."""
    try:
        with open("/sys/devices/system/cpu/online") as f:
            text = f.read().strip()
    except OSError:
        return list(range(os.cpu_count() or 1))
    cpus: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            cpus.extend(range(int(lo), int(hi) + 1))
        elif part:
            cpus.append(int(part))
    return cpus


_HEAD = struct.Struct("<Q")


class RingBuffer:
    """A perf_event ring buffer: 1 metadata page + 2^n data pages, read from the tail."""

    def __init__(self, fd: int, data_pages: int) -> None:
        self.fd = fd
        page = mmap.PAGESIZE
        self.size = data_pages * page
        self.map = mmap.mmap(fd, (data_pages + 1) * page, mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE)
        self.base = page
        self.mv = memoryview(self.map)

    def pending(self) -> tuple[int, list[memoryview]]:
        """The unread data (whole records) as one or two views into the ring, and the head
        to pass to ``consume`` once they have been used (no copy is made)."""
        head = _HEAD.unpack_from(self.map, 1024)[0]
        tail = _HEAD.unpack_from(self.map, 1032)[0]
        n = head - tail
        if n <= 0:
            return head, []
        start = tail % self.size
        if start + n <= self.size:
            return head, [self.mv[self.base + start:self.base + start + n]]
        first = self.size - start
        return head, [self.mv[self.base + start:self.base + self.size],
                      self.mv[self.base:self.base + n - first]]

    def consume(self, head: int) -> None:
        _HEAD.pack_into(self.map, 1032, head)

    def drain(self) -> bytes:
        """Everything between tail and head (whole records), copied; advance the tail."""
        head, views = self.pending()
        out = b"".join(bytes(v) for v in views)
        self.consume(head)
        return out

    def close(self) -> None:
        self.mv.release()
        self.map.close()
