"""Structure built beside the ``--native`` merge, for ``callpath profile``.

After the program, ``profile --native`` merges the native stacks (one core) and then reads the
structure of what the samples touched. Two parts of that structure are known before the merge
ends, and a child process builds each into the caches ``prof`` reads, on the other core:

- the Python sources the samples name, from the start of the merge (the merge rewrites only
  the native part of each path; a warm run of a PyTorch loop meets ~60–160 sources no earlier
  run sampled, ~4–11 ms each);
- the native procedures of the unwound frames, once the stacks are unwound (a warm run meets
  a few hundred procedures of libpython, libtorch_cpu and libc that no earlier run did:
  ~1 s of analysis, the rest of the merge ~0.9 s).

When the merge ends, each child is told to stop: the Python child after its current source,
the native one after its current module when that ends within :data:`FINISH_S`, else at once
(a module can take seconds on a cold cache; a killed analysis leaves no partial entry, since
entries are renamed into place, but its work is lost). What a child did not build, ``prof``
builds as it always did, so a child that fails or is slow costs nothing but its CPU. A child's
frames include the interpreter's own that the merge then elides: their structure is cached
and never read.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: how long a child may take to stop once told (the Python one finishes its source: ms from
#: bytecode, up to a second through ``ast``); then it is killed
GRACE_S = 10.0
#: how long the native child may go on with the module it is analysing when the merge ends
#: (a warm run's modules take 0.1-0.5 s, libpython's the longest): stopped in the middle,
#: its work is lost and ``prof`` analyses that module again from the start; a module that
#: takes longer (a cold cache's libtorch_cpu) is left to ``prof``, beside the others
FINISH_S = 0.6


class _Stop(BaseException):
    """Raised in the native child by SIGTERM: the merge has ended."""


class Ahead:
    """The children of one merge; :meth:`stop` ends and reaps them."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.children: list[tuple[int, int, bool]] = []  # pid, pipe write end, native?
        #: read end of a pipe whose write end only the Python child holds: it reads as
        #: closed once that child has exited (two children and the merge on two cores would
        #: slow the merge, which is the longest of the three)
        self._python_done: int | None = None

    def _fork(self, work: Callable[[Callable[[], bool]], Any], native: bool,
              keep: int | None = None) -> None:
        parent = os.getpid()
        try:
            r, w = os.pipe()
            pid = os.fork()
        except OSError:
            if keep is not None:
                os.close(keep)
            return
        if pid == 0:  # the child: never returns into the caller
            code = 0
            try:
                os.close(w)
                if native:
                    signal.signal(signal.SIGTERM, _raise_stop)
                _die_with_parent(parent)

                def stop() -> bool:
                    return bool(select.select([r], [], [], 0)[0])

                work(stop)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(r)
        if keep is not None:
            os.close(keep)
        self.children.append((pid, w, native))

    def python_sources(self) -> None:
        """Start the child that caches the sampled Python sources' structure."""
        units = sorted(self.out_dir.glob("process-*.cpm"))
        if not units:
            return
        # imported before the fork: a child importing while another thread of this process
        # held the import lock would wait for it forever
        from callpath.structure.ondemand import cache_python_sources

        try:
            done_r, done_w = os.pipe()
        except OSError:
            return
        self._python_done = done_r
        self._fork(lambda stop: cache_python_sources(units, stop), native=False, keep=done_w)

    def native_frames(self, modules: Sequence[Any], module: Any, address: Any,
                      exact: Any) -> None:
        """Start the child that analyses the procedures of unwound frames (``module`` indices
        into the process's ``modules``, link-time ``address``, ``exact`` for sampled pcs),
        module after module, the costliest first. One such child per merge: a program of
        several processes has its first merged process's frames analysed ahead (they share
        most modules with the others), the rest by ``prof``."""
        if any(native for _pid, _w, native in self.children):
            return
        # imported before the fork (as above), with what the analysis imports
        import callpath.structure.binary
        import callpath.structure.elf  # noqa: F401
        from callpath.structure.ondemand import frame_requests, request_cost, structure_for

        reqs = frame_requests(modules, module, address, exact, self.out_dir)
        reqs.sort(key=lambda r: -request_cost(r))

        after = self._python_done

        def work(stop: Callable[[], bool]) -> None:
            if after is not None:  # the Python child first (or until the merge ends)
                while not select.select([after], [], [], 0.01)[0]:
                    if stop():
                        return
            for r in reqs:
                if stop():
                    return
                structure_for(r, 1)

        if reqs:
            self._fork(work, native=True)

    def stop(self, finish_s: float = FINISH_S) -> None:
        """Tell every child to stop, and wait for each: the Python child after its current
        source, the native one after its current module if that ends within ``finish_s``,
        else at once (killed after :data:`GRACE_S`)."""
        for _pid, w, _native in self.children:
            os.close(w)
        for pid, _w, native in self.children:
            if native and not _exited(pid, time.monotonic() + finish_s):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for pid, _w, _native in self.children:
            if not _exited(pid, deadline):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        self.children = []
        if self._python_done is not None:
            os.close(self._python_done)
            self._python_done = None


def _exited(pid: int, until: float) -> bool:
    """Whether child ``pid`` has exited (reaped here) by the monotonic time ``until``."""
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if done:
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(0.002)


def _raise_stop(_signum: int, _frame: Any) -> None:
    raise _Stop


PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGTERM when the merge's process dies (killed, not stopping the child itself), so
    that no analysis outlives it (Linux prctl; elsewhere the child runs to its end)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before the request
        raise _Stop


def spare_core() -> bool:
    """Whether a core is free for a child beside the merge now: the machine's runnable
    threads (``/proc/loadavg``'s fourth field, this process included), the median of five
    reads 2 ms apart, leave one. The load average would not do: the measured program's
    threads ran until a moment ago and weigh on it for a minute. ``CALLPATH_STRUCTURE_AHEAD``
    set to ``on`` or ``off`` decides instead."""
    env = os.environ.get("CALLPATH_STRUCTURE_AHEAD", "").lower()
    if env in ("on", "off"):
        return env == "on"
    cores = os.cpu_count() or 1
    if cores < 2:
        return False
    seen = []
    for k in range(5):
        try:
            with open("/proc/loadavg") as f:
                seen.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return True
        if k < 4:
            time.sleep(0.002)
    seen.sort()
    return cores - (seen[2] - 1) >= 2
