"""Thread names of a v4 database, kept beside it in ``DB/callpath/context-names.json``.

Why beside it: a v4 profile is named only by its identifier tuple, numeric ``(kind, logical
id, physical id)`` triples (profile.db's Profile Info); the only strings meta.db holds about
profiles are the names of identifier *kinds* (``THREAD``), one per kind, not per profile. A
name per thread (``worker_1``, ``arith``, a native thread's comm) therefore has no place in the
four files without breaking the format HPCToolkit's tools read; callpath keeps the names in
its own folder of the database (:mod:`callpath.formats.sidecar`), as it keeps derived metrics,
and applies them when the database is opened. HPCToolkit's viewer, which does not read the
file, shows the same contexts by their identifiers. The file is versioned JSON::

    {"format": "callpath-context-names", "version": 1,
     "contexts": [{"profile": 2, "ids": [[1, 8323328, 8323328], [3, 1, 1]],
                   "name": "worker_0"}, ...]}

Each entry carries the profile's identifier tuple, and a name is applied only where the
profile at that index still has it: a database rewritten by another tool (fewer or reordered
profiles) keeps its contexts unnamed rather than misnamed. The names only label contexts, so
an unreadable or malformed file is ignored (the database opens without them).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from callpath.errors import FormatError
from callpath.formats import sidecar
from callpath.model.contexts import ExecutionContext

FILE_FORMAT = "callpath-context-names"
VERSION = 1
RELPATH = sidecar.NAMES


def _key(ctx: ExecutionContext) -> list[list[int]]:
    return [[i.kind, i.logical_id, i.physical_id] for i in ctx.ids]


def names_document(profiles: list[ExecutionContext]) -> str | None:
    """The file's text for these profiles (in profile.db order: an entry's ``profile`` is
    the position), None when no profile has a name."""
    entries = [{"profile": k, "ids": _key(p), "name": p.name}
               for k, p in enumerate(profiles) if p.name and not p.is_summary]
    if not entries:
        return None
    # one context a line: thousands of threads stay a readable, diffable file
    body = ",\n  ".join(json.dumps(e, ensure_ascii=False) for e in entries)
    return (f'{{"format": "{FILE_FORMAT}", "version": {VERSION}, "contexts": [\n  {body}\n]}}'
            "\n")


def read_names(directory: Path, profiles: list[ExecutionContext]) -> list[ExecutionContext]:
    """``profiles`` with the names recorded beside the database applied (unchanged when the
    file is absent, unreadable or does not match)."""
    path = sidecar.path(directory, RELPATH)
    if not path.is_file():
        return profiles
    try:
        doc = sidecar.read_document(path, FILE_FORMAT, VERSION, "a context-names file")
    except FormatError:
        return profiles  # the names only label contexts: the database opens without them
    if not isinstance(doc.get("contexts"), list):
        return profiles
    out = list(profiles)
    for e in doc["contexts"]:
        if not isinstance(e, dict):
            continue
        i, ids, name = e.get("profile"), e.get("ids"), e.get("name")
        if not isinstance(i, int) or not isinstance(name, str) or not 0 < i < len(out) \
                or out[i].is_summary or ids != _key(out[i]):
            continue
        out[i] = dataclasses.replace(out[i], name=name)
    return out
