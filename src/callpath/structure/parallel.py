"""``fork_map``: one function over a few work items in forked processes, results by pipe.

The analysis of one large module shares big read-only inputs (decoded line tables, inlining
records, section bytes) between its parts; ``fork`` hands them to the children for free
(copy-on-write), where ``multiprocessing`` would pickle them. It also works inside a
``multiprocessing`` pool worker, whose daemonic processes may not start a pool of their own.

Results come back as pickle protocol 5 with the large buffers (numpy arrays) out of band,
each read from the pipe straight into the memory the parent's array then uses: one copy of a
child's result in the parent, not three (the bytes read, the pickle's arrays, and what the
caller makes of them). Half of libtorch_cpu.so's structure is ~250 MB.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import pickle
import signal
import struct
from collections.abc import Callable
from typing import Any, TypeVar

from callpath.errors import CallpathError

T = TypeVar("T")
R = TypeVar("R")


def fork_map(fn: Callable[[T], R], items: list[T]) -> list[R]:
    """``[fn(x) for x in items]``, every item but the last in a forked child.

    A child that raises sends the message back and the parent raises it: a
    :class:`CallpathError` as such, anything else as a RuntimeError naming it; a child killed
    by a signal (the out-of-memory killer, a user's ``kill``) is a :class:`CallpathError`
    naming the signal. When the parent's own item raises, the children are killed, not waited
    for. Falls back to running in this process if ``fork`` fails.
    """
    children: list[tuple[int, int]] = []  # (pid, read end)
    # The cyclic garbage collector writes into every object it scans: in a child that copies
    # each page of the parent's objects (libtorch_cpu.so's procedure table and line data).
    # Frozen, the objects that exist at the fork are never scanned, in the children or here.
    frozen = len(items) > 1 and not gc.get_freeze_count()
    if frozen:
        gc.freeze()
    try:
        return _fork_map(fn, items, children)
    finally:
        if frozen:
            gc.unfreeze()


def _fork_map(fn: Callable[[T], R], items: list[T], children: list[tuple[int, int]]
              ) -> list[R]:
    for x in items[:-1]:
        try:
            r, w = os.pipe()
            pid = os.fork()
        except OSError:
            break
        if pid == 0:  # child: never returns into the caller's code
            status = 0
            try:
                os.close(r)
                bufs: list[pickle.PickleBuffer | None] = []
                try:
                    payload = pickle.dumps(("ok", fn(x)), protocol=5,
                                           buffer_callback=bufs.append)
                except CallpathError as e:
                    payload, bufs = pickle.dumps(("user", str(e))), []
                except BaseException as e:
                    payload, bufs = pickle.dumps(("bug", f"{type(e).__name__}: {e}")), []
                sizes = [b.raw().nbytes for b in bufs if b is not None]
                with os.fdopen(w, "wb") as f:
                    f.write(struct.pack(f"<{len(sizes) + 2}Q", len(payload), len(sizes),
                                        *sizes))
                    f.write(payload)
                    del payload
                    for k, b in enumerate(bufs):
                        assert b is not None
                        with b.raw() as raw:
                            f.write(raw)
                        # the array goes as soon as it is sent, and its memory back to the
                        # system: the parent's copy grows as this one shrinks
                        b.release()
                        bufs[k] = b = None
                        _trim()
            except BaseException:
                status = 1
            finally:
                os._exit(status)
        os.close(w)
        children.append((pid, r))
    done = len(children)
    ok = False
    try:
        tail = [fn(x) for x in items[done:]]
        ok = True
    finally:
        got: list[tuple[str, object]] = []
        for pid, r in children:
            if not ok:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with os.fdopen(r, "rb") as f:
                res = _receive(f) if ok else None
            _, status = os.waitpid(pid, 0)
            if res is not None:
                got.append(res)
            elif os.WIFSIGNALED(status):
                got.append(("killed", os.WTERMSIG(status)))
            else:
                got.append(("bug", "a worker process died"))
    out: list[R] = []
    for kind, value in got:
        if kind == "user":
            raise CallpathError(str(value))
        if kind == "killed":
            sig = int(value)  # type: ignore[call-overload]
            raise CallpathError(f"a worker process was killed by signal {sig} "
                                f"({signal.Signals(sig).name}; out of memory?)")
        if kind != "ok":
            raise RuntimeError(f"parallel work failed: {value}")
        out.append(value)  # type: ignore[arg-type]
    return out + tail


def _receive(f: io.BufferedReader) -> tuple[str, object] | None:
    """A child's result from its pipe (header, pickle, out-of-band buffers; see the module
    docstring), or None where the child died before writing all of it."""
    head = _read_exact(f, 16)
    if head is None:
        return None
    size, nbuf = struct.unpack("<2Q", head)
    sizes = _read_exact(f, 8 * nbuf)
    payload = _read_exact(f, size)
    if sizes is None or payload is None:
        return None
    bufs: list[bytearray] = []
    for n in struct.unpack(f"<{nbuf}Q", sizes):
        buf = bytearray(n)
        view = memoryview(buf)
        at = 0
        while at < n:
            k = f.readinto(view[at:])
            if not k:
                return None
            at += k
        bufs.append(buf)
    got: tuple[str, object] = pickle.loads(payload, buffers=bufs)
    return got


def _read_exact(f: io.BufferedReader, n: int) -> bytes | None:
    data = f.read(n)
    return data if len(data) == n else None


def _trim() -> None:
    """Give freed heap memory back to the system (glibc's ``malloc_trim``; nothing elsewhere):
    arrays under glibc's mmap threshold (which rises to 32 MiB as large blocks are freed)
    live on the heap, whose freed pages a process otherwise keeps."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


_malloc_trim: Any = None
