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
