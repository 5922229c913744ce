"""The measurement directory's header (``measurement.json``) and the checks before a run:
the part of :mod:`callpath.formats.measdir` that needs no numpy, so that a launcher can
create a measurement and start the program before numpy's import (a Python program's first
line came 0.23 s after the command, now 0.15 s, medians of 9 here); measdir re-exports every
name."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from callpath.errors import CallpathError

FORMAT_NAME = "callpath-measurement"
VERSION = 1
HEADER_FILE = "measurement.json"
PROCESS_GLOB = "process-*.cpm"


@dataclass(frozen=True)
class MetricInfo:
    """One sampled quantity. ``value`` sums are in ``unit`` (``ns`` for CPU clocks, ``events``
    for counters); ``period`` is the sampling period (0 if sampled by frequency)."""

    name: str
    unit: str = "events"
    period: int = 0
    frequency: int = 0
    description: str = ""
    event: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "period": self.period,
                "frequency": self.frequency, "description": self.description,
                "event": self.event}

    @staticmethod
    def from_json(d: dict[str, Any]) -> MetricInfo:
        return MetricInfo(str(d["name"]), str(d.get("unit", "events")), int(d.get("period", 0)),
                          int(d.get("frequency", 0)), str(d.get("description", "")),
                          str(d.get("event", "")))


def check_new_directory(out: Path) -> None:
    """Refuse a measurement's ``-o`` that is a file or already holds a measurement or a
    database (raw data and process files would be mixed into it), before anything runs;
    shared by ``callpath run`` and the Python sampler's launcher."""
    if out.exists() and not out.is_dir():
        raise CallpathError(f"{out}: exists and is not a directory (expected a measurement "
                            "directory to create)")
    if out.is_dir() and ((out / HEADER_FILE).exists() or any(out.glob(PROCESS_GLOB))):
        raise CallpathError(f"{out}: already holds a measurement (expected a new or empty "
                            "directory; remove it or choose another -o)")
    if (out / "meta.db").exists() or (out / "experiment.xml").exists():
        raise CallpathError(f"{out}: holds a database (expected a new or empty directory; "
                            "choose another -o)")


def make_new_directory(out: Path) -> bool:
    """:func:`check_new_directory`, then create ``out`` (and its parents); whether it was
    created, so that a run that measures nothing can remove what it made. Shared by ``run``,
    ``run --pid`` and the attached Python sampler."""
    check_new_directory(out)
    try:
        created = not out.exists()
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CallpathError(f"{out}: cannot create the measurement directory "
                            f"({e.strerror})") from None
    return created


def write_header(directory: str | os.PathLike[str], metrics: Iterable[MetricInfo],
                 **fields: Any) -> Path:
    """Write (or rewrite) ``measurement.json`` atomically. ``fields`` are free-form additions
    (command, start time, status, summary, ...)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"format": FORMAT_NAME, "version": VERSION,
                           "host": socket.gethostname(), "node_id": host_id()}
    doc.update(fields)
    doc["metrics"] = [m.to_json() for m in metrics]
    tmp = d / f".{HEADER_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, d / HEADER_FILE)
    return d / HEADER_FILE


def host_id() -> int:
    """A 32-bit node identifier for NODE ids: gethostid(), as HPCToolkit uses."""
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        return int(libc.gethostid()) & 0xFFFFFFFF
    except (OSError, AttributeError):
        return 0


# The commands that start MPI ranks (what a user types before the program), and every program
# of a launch that is not a rank: those commands and the daemons and proxies they start.
# ``callpath run --native`` recognises the former; ``callpath prof`` leaves the latter out.
MPI_LAUNCHERS = frozenset({"mpirun", "mpiexec", "mpiexec.hydra", "orterun", "srun"})
LAUNCHER_PROGRAMS = MPI_LAUNCHERS | {"mpiexec.gforker", "hydra_pmi_proxy", "orted", "prterun",
                                     "prte", "prted", "aprun"}
