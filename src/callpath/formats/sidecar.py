"""The files callpath keeps in a database's own folder, ``DB/callpath/``, and in the user's
configuration directory: where each lives, the one atomic writer and the one versioned reader.

HPCToolkit's four files have no place for what callpath adds to a database, so it keeps its
own folder beside them (HPCToolkit's tools ignore it):

- ``context-names.json``: thread names (:mod:`callpath.formats.v4.names`, written with the
  database by :mod:`callpath.formats.v4.writer`);
- ``derived-metrics.json``: the derived metrics a user saved (:mod:`callpath.analysis.derived`);
- ``notes.json``: the viewer's notes (:mod:`callpath.engine.notes`).

Each is versioned JSON, ``{"format": NAME, "version": N, ...}``, read by
:func:`read_document` and written by :func:`write_atomically`, so that a crash never leaves
half a file and a file of another kind or version is refused with one line. What does not
belong to one database (the filter set, derived metrics of a read-only database) lives under
:func:`config_dir`.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from callpath.errors import FormatError

#: The folder inside a database directory, and its files (relative to the database).
FOLDER = Path("callpath")
NAMES = FOLDER / "context-names.json"
DERIVED = FOLDER / "derived-metrics.json"
NOTES = FOLDER / "notes.json"


def path(dbdir: str | os.PathLike[str], relpath: Path) -> Path:
    """One of the files above, inside the database directory ``dbdir``."""
    return Path(dbdir) / relpath


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/callpath`` (``~/.config/callpath`` when the variable is unset).

    Read from the environment at every call, not cached: tests and long-lived processes
    (a notebook) may change ``XDG_CONFIG_HOME`` between two calls."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "callpath"


def write_atomically(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` through a synced temporary file renamed over it, so that
    a crash leaves the old file or the new one, never half of one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_document(source: Path, file_format: str, version: int, what: str) -> dict[str, Any]:
    """The JSON object of one of callpath's own files, checked to be ``file_format`` at
    ``version``; any defect (unreadable, not UTF-8, not JSON, another kind of file, another
    version) is a one-line :class:`FormatError` naming the file. ``what`` names the kind in
    that line ("a derived-metrics file")."""
    try:
        raw = source.read_bytes()
    except OSError as e:
        raise FormatError(source, f"cannot read: {e.strerror}") from e
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise FormatError(source, f"not UTF-8 text (byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise FormatError(source, f"not valid JSON (line {e.lineno}, column {e.colno}): "
                                  f"{e.msg}") from e
    if not isinstance(doc, dict) or doc.get("format") != file_format:
        raise FormatError(source, f"not {what}: expected an object with "
                                  f"\"format\": \"{file_format}\"")
    found = doc.get("version")
    if found != version:
        raise FormatError(source, f"unsupported version {found!r}: expected {version}")
    return doc

