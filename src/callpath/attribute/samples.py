"""The samples of each execution context, kept on disk while the reduction runs.

Every thread's attributed samples (context, metric, value per sample) are needed twice after
the tree is merged: for the summary and for the thread's own profile block. Held in memory
they grow with contexts × call paths (250 MB for the 256 threads of ``bench/prof.py``), so
each partial reduction appends them to a file in a spill directory as it produces them, and
they are read back (``pread``: no memory map, so they never count in the resident set) one
thread at a time. Forked workers inherit the open descriptors; the files are unlinked as
soon as the process that merges the partials has opened them. Under MPI, rank 0 spills the
samples that the other ranks send into its own file as they arrive.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

#: spill files opened by this process (path -> descriptor); inherited by forked workers
_OPEN: dict[str, int] = {}


@dataclass
class Samples:
    """One thread's samples: in memory (``data``), or ``n`` rows at ``offset`` of a spill
    file (anchors, then metrics, then values, 8 bytes each)."""

    n: int
    data: tuple[I64, I64, F64] | None = None
    path: str = ""
    offset: int = 0

    @classmethod
    def of(cls, anchor: I64, metric: I64, value: F64) -> Samples:
        return cls(len(anchor), (anchor.astype(np.int64, copy=False),
                                 metric.astype(np.int64, copy=False),
                                 value.astype(np.float64, copy=False)))

    def arrays(self) -> tuple[I64, I64, F64]:
        """Anchor, metric and value of every sample (read from the spill file if spilled)."""
        if self.data is not None:
            return self.data
        if self.n == 0:
            return (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64))
        fd = _OPEN.get(self.path)
        if fd is None:
            fd = open_spill(self.path)
        raw = os.pread(fd, 24 * self.n, self.offset)
        if len(raw) != 24 * self.n:
            raise OSError(f"{self.path}: spill file ended early")
        a = np.frombuffer(raw, dtype=np.int64, count=self.n)
        m = np.frombuffer(raw, dtype=np.int64, count=self.n, offset=8 * self.n)
        v = np.frombuffer(raw, dtype=np.float64, count=self.n, offset=16 * self.n)
        return a, m, v


def spill(directory: str | None, anchor: I64, metric: I64, value: F64) -> Samples:
    """Append a thread's samples to this process's spill file in ``directory`` (held in
    memory when there is no spill directory)."""
    if directory is None:
        return Samples.of(anchor, metric, value)
    path = os.path.join(directory, f"samples-{os.getpid()}.bin")
    n = len(anchor)
    with open(path, "ab") as f:
        offset = f.tell()
        for arr, dt in ((anchor, np.int64), (metric, np.int64), (value, np.float64)):
            f.write(np.ascontiguousarray(arr, dtype=dt).tobytes())
    return Samples(n, None, path, offset)


def open_spill(path: str) -> int:
    """Open a spill file for reading and unlink it (the descriptor keeps it)."""
    fd = os.open(path, os.O_RDONLY)
    _OPEN[path] = fd
    with contextlib.suppress(OSError):
        os.unlink(path)
    return fd


def adopt(samples: list[Samples]) -> None:
    """Open every spill file these samples live in (this process will read them)."""
    for s in samples:
        if s.data is None and s.n and s.path not in _OPEN:
            open_spill(s.path)


def release(samples: list[Samples]) -> None:
    """Close the spill files of these samples (they are gone once closed)."""
    for path in {s.path for s in samples if s.data is None}:
        fd = _OPEN.pop(path, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def spill_directory() -> str:
    """A fresh directory for one reduction's spill files (in ``$TMPDIR``)."""
    return tempfile.mkdtemp(prefix="callpath-prof-")


def remove_directory(directory: str) -> None:
    """Remove a spill directory (files still open stay readable until closed)."""
    shutil.rmtree(Path(directory), ignore_errors=True)
