"""Derived metrics and their persistence next to the database they were defined on.

hpcviewer remembers the derived metrics a user defines; callpath saves them with the database,
in ``<DBDIR>/callpath/derived-metrics.json``, so that they reappear whenever the database is
reopened (by the CLI, a notebook or the viewer). The file is versioned JSON::

    {"format": "callpath-derived-metrics", "version": 1, "database": "/abs/path/db.d",
     "metrics": [{"name": "IPC", "formula": "$1/$0", "format": "%.2f", "percent": false}]}

and is written atomically (a temporary file in the same folder, then ``os.replace``), so a
crash never leaves half a file. A database on read-only storage (someone else's, a shared
archive) cannot hold the file; then it goes to
``$XDG_CONFIG_HOME/callpath/derived/<hash>.json`` (``~/.config`` when the variable is unset),
where ``<hash>`` is the first 16 hex digits of the SHA-256 of the database's absolute, resolved
path. When both files exist, the newer one wins.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from callpath.analysis.formula import Formula, parse
from callpath.analysis.numfmt import DEFAULT, ValueFormat, parse_format
from callpath.errors import CallpathError, FormatError
from callpath.formats import sidecar

FILE_FORMAT = "callpath-derived-metrics"
VERSION = 1
DB_RELPATH = sidecar.DERIVED


@dataclass(frozen=True)
class DerivedMetric:
    """A user-defined metric: a name, a formula over metric columns, and how to show it."""

    name: str
    formula: str
    format: str = DEFAULT
    percent: bool = False  # annotate each value with its percent of the formula on aggregates

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise CallpathError(f"derived metric {self.name!r}: the name must not be empty")
        parse(self.formula)
        parse_format(self.format)

    @property
    def parsed(self) -> Formula:
        return parse(self.formula)

    @property
    def value_format(self) -> ValueFormat:
        return parse_format(self.format)

    @classmethod
    def from_assignment(cls, text: str, format: str = DEFAULT,
                        percent: bool = False) -> DerivedMetric:
        """``"NAME=FORMULA"`` (the CLI's ``--derived``) to a metric."""
        name, sep, formula = text.partition("=")
        if not sep or not name.strip():
            raise CallpathError(f"derived metric {text!r}: expected NAME=FORMULA, "
                                "e.g. 'IPC=$1/$0'")
        return cls(name.strip(), formula.strip(), format, percent)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "formula": self.formula, "format": self.format,
                "percent": self.percent}


# ---- where the file lives ----------------------------------------------------------------


def db_store_path(dbdir: str | os.PathLike[str]) -> Path:
    """The file inside the database directory."""
    return sidecar.path(dbdir, DB_RELPATH)


def fallback_store_path(dbdir: str | os.PathLike[str]) -> Path:
    """The per-user file used when the database directory is not writable."""
    key = hashlib.sha256(str(Path(dbdir).resolve()).encode()).hexdigest()[:16]
    return sidecar.config_dir() / "derived" / f"{key}.json"


# ---- save --------------------------------------------------------------------------------


def save_derived(dbdir: str | os.PathLike[str], metrics: Iterable[DerivedMetric]) -> Path:
    """Save the derived metrics of a database; returns the file written.

    Tries ``<DBDIR>/callpath/derived-metrics.json`` first and falls back to the per-user file
    when the database directory cannot be written."""
    db = Path(dbdir)
    if not db.is_dir():
        raise CallpathError(f"{db}: not a database directory (cannot save derived metrics)")
    items = list(metrics)
    seen: set[str] = set()
    for m in items:
        if m.name in seen:
            raise CallpathError(f"derived metric {m.name!r} is defined twice: names must be "
                                "unique")
        seen.add(m.name)
    doc = {"format": FILE_FORMAT, "version": VERSION, "database": str(db.resolve()),
           "metrics": [m.to_json() for m in items]}
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    target = db_store_path(db)
    try:
        sidecar.write_atomically(target, text)
        return target
    except OSError as first:
        fallback = fallback_store_path(db)
        try:
            sidecar.write_atomically(fallback, text)
        except OSError as second:
            raise CallpathError(f"cannot save derived metrics: {target}: {first.strerror}; "
                                f"{fallback}: {second.strerror}") from second
        return fallback


# ---- load --------------------------------------------------------------------------------


def load_derived(dbdir: str | os.PathLike[str]) -> list[DerivedMetric]:
    """The derived metrics saved for a database (empty when none were saved)."""
    candidates = [p for p in (db_store_path(dbdir), fallback_store_path(dbdir)) if p.is_file()]
    if not candidates:
        return []
    newest = max(candidates, key=lambda p: p.stat().st_mtime_ns)
    return read_store(newest)


def read_store(path: Path) -> list[DerivedMetric]:
    """Read and validate one derived-metrics file; any defect is a one-line FormatError."""
    doc = sidecar.read_document(path, FILE_FORMAT, VERSION, "a derived-metrics file")
    entries = doc.get("metrics")
    if not isinstance(entries, list):
        raise FormatError(path, "\"metrics\" must be a list")
    out: list[DerivedMetric] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise FormatError(path, f"metrics[{i}] must be an object")
        name, formula = entry.get("name"), entry.get("formula")
        fmt, percent = entry.get("format", DEFAULT), entry.get("percent", False)
        if not isinstance(name, str) or not isinstance(formula, str):
            raise FormatError(path, f"metrics[{i}] needs string \"name\" and \"formula\"")
        if not isinstance(fmt, str) or not isinstance(percent, bool):
            raise FormatError(path, f"metrics[{i}] ({name!r}): \"format\" must be a string "
                                    "and \"percent\" true or false")
        try:
            out.append(DerivedMetric(name, formula, fmt, percent))
        except CallpathError as err:
            raise FormatError(path, f"metrics[{i}]: {err}") from err
    return out
