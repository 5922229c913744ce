"""The sampler's clock and the process facts it asks libc for: a POSIX interval timer that
signals one thread, ``gethostid()``, and the MPI rank a launcher exported.

Runs inside the measured program, loaded by path by ``sampler.py`` (standard library only, no
import of the ``callpath`` package or of the other modules beside it). Why a module of its own:
this is the part that talks to the C library through ``ctypes`` (``timer_create`` with
``SIGEV_THREAD_ID``, falling back to ``setitimer``), apart from the sampling it drives.
"""

from __future__ import annotations

import _thread
import os
import signal
import struct
from typing import Any

_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def mpi_rank(env: Any = None) -> int | None:
    """The MPI rank that the launcher (Open MPI, MPICH/PMI, PMIx, Slurm) exported, if any."""
    env = os.environ if env is None else env
    for var in _RANK_VARS:
        value = env.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return None


def _libc() -> Any:
    try:
        import ctypes
        return ctypes, ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return None, None


def host_id() -> int:
    """gethostid(), the NODE identifier (as ``measdir.host_id``)."""
    _ct, lib = _libc()
    try:
        return int(lib.gethostid()) & 0xFFFFFFFF if lib is not None else 0
    except AttributeError:
        return 0


class Timer:
    """A POSIX interval timer on CLOCK_MONOTONIC that signals one thread (ctypes, Linux).

    Falls back to ``setitimer(ITIMER_REAL)`` (SIGALRM to the process) where ``timer_create`` with
    ``SIGEV_THREAD_ID`` is unavailable.
    """

    CLOCK_MONOTONIC = 1
    SIGEV_THREAD_ID = 4

    def __init__(self, signo: int) -> None:
        self.signo = signo
        self._id: Any = None
        self._ct, self._lib = _libc()
        if self._lib is not None:
            ct = self._ct
            try:
                self._lib.timer_create.argtypes = [ct.c_int, ct.c_void_p, ct.c_void_p]
                self._lib.timer_settime.argtypes = [ct.c_void_p, ct.c_int, ct.c_void_p,
                                                    ct.c_void_p]
                self._lib.timer_delete.argtypes = [ct.c_void_p]
            except AttributeError:
                self._lib = None

    def start(self, period_ns: int, handler: Any) -> str:
        """Arm the timer for the calling thread (whose handler of ``signo`` must already be
        ``handler``); returns the mechanism used."""
        self.stop()
        if self._lib is not None and self.signo != signal.SIGALRM:
            ct = self._ct
            # struct sigevent: sigval (8), signo (4), notify (4), union holding the tid (48)
            sev = ct.create_string_buffer(struct.pack(
                "<QiiI44x", 0, self.signo, self.SIGEV_THREAD_ID, _thread.get_native_id()), 64)
            tid = ct.c_void_p()
            if self._lib.timer_create(self.CLOCK_MONOTONIC, sev, ct.byref(tid)) == 0:
                sec, nsec = divmod(period_ns, 1_000_000_000)
                spec = ct.create_string_buffer(struct.pack("<qqqq", sec, nsec, sec, nsec), 32)
                if self._lib.timer_settime(tid, 0, spec, None) == 0:
                    self._id = tid
                    return "timer_create(CLOCK_MONOTONIC, SIGEV_THREAD_ID)"
                self._lib.timer_delete(tid)
        self.signo = signal.SIGALRM
        self._id = "itimer"
        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, period_ns / 1e9, period_ns / 1e9)
        return "setitimer(ITIMER_REAL)"

    def stop(self) -> None:
        if self._id is None:
            return
        if self._id == "itimer":
            signal.setitimer(signal.ITIMER_REAL, 0, 0)
        else:
            self._lib.timer_delete(self._id)
        self._id = None

    def forget(self) -> None:
        """After fork: the child has no timers (POSIX), so there is nothing to delete."""
        self._id = None
