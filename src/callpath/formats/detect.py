"""Format detection: pick the reader for whatever is at a path."""

from __future__ import annotations

import os
from pathlib import Path

from callpath.errors import CallpathError
from callpath.model import Experiment


def open_experiment(path: str | os.PathLike[str]) -> Experiment:
    """Open a database directory (or a file inside one) in any supported format."""
    p = Path(path)
    if not p.exists():
        raise CallpathError(f"{p}: no such file or directory (expected a database directory)")
    d = p if p.is_dir() else p.parent
    if (d / "meta.db").exists():
        from callpath.formats.v4.reader import read_v4

        return read_v4(d)
    if (d / "experiment.xml").exists():
        from callpath.formats.xml_experiment import read_xml_experiment

        return read_xml_experiment(d)
    raise CallpathError(f"{p}: not a performance database (expected meta.db or experiment.xml)")


# What a database directory consists of at its top level; anything in a subdirectory (src/,
# metrics/, callpath/) belongs to it too.
DATABASE_FILES = frozenset({"meta.db", "profile.db", "cct.db", "trace.db", "experiment.xml"})


def refuse_overwriting(output: str | os.PathLike[str], database: str | os.PathLike[str],
                       option: str = "-o") -> None:
    """Raise :class:`CallpathError` when writing ``output`` would replace the database being
    read (its directory) or one of its files: 'report --flame -o DB/meta.db' destroyed the
    very database it drew, and nothing can recover it. A new file beside the database's own
    (``DB/flame.svg``) is allowed."""
    out = Path(output).resolve()
    db = Path(database).resolve()
    if not db.is_dir():
        db = db.parent
    if out == db:
        raise CallpathError(f"{option} {output}: is the database being read ({database}); "
                            "expected a path outside it")
    if not out.exists() or not out.is_relative_to(db):
        return
    if out.parent != db or out.name in DATABASE_FILES or out.name.endswith(".metric-db"):
        raise CallpathError(f"{option} {output}: would overwrite a file of the database being "
                            f"read ({database}); expected a path outside it")
