"""Positional file I/O shared by the phases of the streamed writer: the batched ``pwrite``
writer (behind a thread when several processes write one file), the lock that takes turns on a
shared file, and the exact ``pread``/``pwrite``/copy loops.

Why a module of its own: spooling (:mod:`~callpath.formats.v4.spool`) and the transpose
(:mod:`~callpath.formats.v4.transpose`) both write into files that other forked workers write
too, and both read and copy spooled bytes; the rules for doing so safely (who holds the lock,
how many batches may wait, what a short read means) are the same and live here once.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from callpath.errors import CallpathError
from callpath.formats.v4.stream import STATE, ValueSource, serial


def write_lock() -> Any:
    """One lock for the writes of all workers into one file (created before they fork).

    ext4 holds a file's inode lock through each buffered ``write``, so two processes writing
    one file take turns anyway, and the one waiting spins on that lock in the kernel, burning
    its CPU; waiting on this lock instead sleeps."""
    import multiprocessing
    try:
        return multiprocessing.get_context("fork").Lock()
    except (ValueError, OSError):
        return contextlib.nullcontext()


@contextlib.contextmanager
def shared_writes(source: ValueSource) -> Iterator[None]:
    """While a phase maps its chunks: the write lock of the file they share, and whether
    each process writes from a thread of its own (see :class:`Writer`: when several write)."""
    STATE["write_lock"] = write_lock()
    STATE["behind"] = source.parallel is not serial
    try:
        yield
    finally:
        STATE.pop("write_lock", None)
        STATE.pop("behind", None)


class Writer:
    """Positional writes into one file descriptor (owned: ``close`` closes it), taking
    ``lock`` around each batch: the write lock when the file is shared with other workers.

    ``write`` queues buffers that nothing modifies afterwards (every block and piece is made
    anew) at the current position; ``flush`` writes what was queued since the last one as
    one batch. With ``behind`` (one of several processes writing), a thread of the process
    does the batches, so that it computes its next block or piece while the last one is
    copied into the page cache (the other worker's writes to the same file come between);
    at most two batches wait (bounded memory). ``close`` writes what is left, waits, and
    raises the first error."""

    def __init__(self, fd: int, lock: Any, behind: bool = False) -> None:
        self.fd = fd
        self.lock = lock
        self.at = 0
        self.pending: list[tuple[int, memoryview]] = []
        self.error: BaseException | None = None
        self.jobs: queue.Queue[list[tuple[int, memoryview]] | None] | None = None
        self.thread: threading.Thread | None = None
        if behind:
            self.jobs = queue.Queue(maxsize=2)
            self.thread = threading.Thread(target=self._run, daemon=True)
            self.thread.start()

    def seek(self, at: int) -> None:
        self.at = at

    def write(self, data: bytes | memoryview) -> int:
        view = memoryview(data).cast("B")
        self.pending.append((self.at, view))
        self.at += len(view)
        return len(view)

    def flush(self) -> None:
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        if self.jobs is not None:
            self.jobs.put(batch)
        else:
            self._write(batch)

    def _write(self, batch: list[tuple[int, memoryview]]) -> None:
        with self.lock:
            for at, view in batch:
                pwrite_all(self.fd, view, at)

    def _run(self) -> None:
        assert self.jobs is not None
        while (batch := self.jobs.get()) is not None:
            if self.error is not None:
                continue
            try:
                self._write(batch)
            except BaseException as e:  # raised again by close()
                self.error = e

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self.jobs is not None and self.thread is not None:
                self.jobs.put(None)
                self.thread.join()
            os.close(self.fd)
        if self.error is not None:
            raise self.error


def create_file(path: Path) -> int:
    """A new (or emptied) file for writing, as ``open(path, "wb")``; reading too, as the
    spool a chunk moves to is read back by the transpose."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)


def pread_exact(fd: int, n: int, at: int) -> bytes:
    out = os.pread(fd, n, at)
    while len(out) < n:
        more = os.pread(fd, n - len(out), at + len(out))
        if not more:
            raise CallpathError("a spool file ended early")
        out += more
    return out


def pwrite_all(fd: int, data: bytes | memoryview, at: int) -> None:
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], at + done)


def copy_file(src: Path, fd: int, at: int, size: int, start: int = 0) -> None:
    """``size`` bytes of ``src`` from ``start`` to ``fd`` at ``at``: ``copy_file_range``,
    else reads and ``pwrite``."""
    sfd = os.open(src, os.O_RDONLY)
    try:
        done = 0
        with contextlib.suppress(OSError, AttributeError):
            while done < size:
                n = os.copy_file_range(sfd, fd, size - done, start + done, at + done)
                if n <= 0:
                    break
                done += n
        while done < size:
            chunk = os.pread(sfd, min(1 << 24, size - done), start + done)
            if not chunk:
                raise CallpathError(f"{src}: spool file ended early")
            view = memoryview(chunk)
            while len(view):
                n = os.pwrite(fd, view, at + done)
                view = view[n:]
                done += n
    finally:
        os.close(sfd)
