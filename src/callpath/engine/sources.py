"""Which source files a database lets the viewer show, and reading them.

Only files recorded in the database are ever served, and the client never names a path: it
names a node, and the server looks the node's file up in the database's file table. A copied
source (the database's own ``src/`` copy) is served when its resolved path stays inside the
database directory (a symlink out of it is refused); otherwise the recorded absolute path is
served when it is a readable regular file.
"""

from __future__ import annotations

import os
from pathlib import Path

from callpath.errors import CallpathError
from callpath.model import Experiment

MAX_SOURCE_BYTES = 16 << 20


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def resolve_source(dbdir: Path, recorded: str, copied: bool) -> Path | None:
    """The file to read for a recorded source path, or None when there is none."""
    if not recorded or "\x00" in recorded:
        return None
    root = dbdir.resolve()
    p = Path(recorded)
    if copied or not p.is_absolute():
        if p.is_absolute():
            p = Path(*p.parts[1:])
        cand = (root / p).resolve()
        if not _inside(cand, root):
            return None
    else:
        cand = p.resolve()
    if cand.is_file() and os.access(cand, os.R_OK):
        return cand
    return None


class Servable:
    """Recorded path -> the file to read (None: cannot be shown), resolved on first use:
    a database can record thousands of files and a page shows a few."""

    def __init__(self, dbdir: Path, exp: Experiment) -> None:
        self.dbdir = dbdir
        self._entries: dict[str, list[bool]] = {}
        for f in exp.files:  # a path recorded twice: the copy is tried first
            self._entries.setdefault(f.path, []).append(f.copied)
        self._hit: dict[str, Path | None] = {}

    def get(self, recorded: str | None) -> Path | None:
        if not recorded or recorded not in self._entries:
            return None
        if recorded not in self._hit:
            found = None
            for copied in sorted(self._entries[recorded], reverse=True):
                found = resolve_source(self.dbdir, recorded, copied)
                if found is not None:
                    break
            self._hit[recorded] = found
        return self._hit[recorded]


def read_lines(path: Path, display: str) -> list[str]:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_SOURCE_BYTES + 1)
    except OSError as e:
        raise CallpathError(f"source file {display}: not readable ({e.strerror})") from None
    if len(data) > MAX_SOURCE_BYTES:
        raise CallpathError(f"source file {display}: larger than {MAX_SOURCE_BYTES >> 20} MiB")
    return data.decode("utf-8", errors="replace").splitlines()
