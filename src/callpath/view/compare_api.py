"""Comparing two databases the viewer has open (``POST /api/compare``).

The comparison is built exactly as ``callpath diff`` builds it (:mod:`callpath.analysis.compare`),
written as a v4 database into a temporary folder of the server (removed when the server
stops) with its delta and ratio metrics saved beside it, and opened as one more database: a
new tab whose every view has the base, new, delta and ratio columns, and whose flame graph is
coloured by the delta. Comparing the same pair again returns the tab already made.

What has been made is remembered per server (per list of databases), never per process: a
process that starts several servers (the tests, a notebook) would otherwise answer the
second server's comparison of databases 0 and 1 with the first server's tab id, which on the
second server is some other database.

Body: ``{"base": ID, "new": ID}``. Answer: the new database's entry of ``/api/databases``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from callpath.engine.database import Database
from callpath.errors import CallpathError
from callpath.view import api

Params = Mapping[str, str]

_tmp: list[Path] = []


def _cleanup() -> None:
    for p in _tmp:
        shutil.rmtree(p, ignore_errors=True)


atexit.register(_cleanup)


def _parse(body: bytes, n: int) -> tuple[int, int]:
    try:
        doc = json.loads(body.decode("utf-8") or "null")
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CallpathError("compare: expected a JSON body {\"base\": ID, \"new\": ID}") from None
    if not isinstance(doc, dict):
        raise CallpathError("compare: expected a JSON body {\"base\": ID, \"new\": ID}")
    ids = []
    for name in ("base", "new"):
        v = doc.get(name)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n:
            raise CallpathError(f"compare: {name!r} must be a database id 0..{n - 1}")
        ids.append(v)
    if ids[0] == ids[1]:
        raise CallpathError("compare: base and new must be two different databases")
    return ids[0], ids[1]


@contextlib.contextmanager
def _both(a: Database, b: Database) -> Iterator[None]:
    """Both databases' locks, for as long as the comparison reads them."""
    with a.lock, b.lock:
        yield


class Comparisons:
    """The comparisons one server has made: (base id, new id) -> the id of its tab in that
    server's list of databases."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.made: dict[tuple[int, int], int] = {}


def compare_databases(dbs: list[Database], base: int, new: int,
                      made: Comparisons) -> dict[str, Any]:
    """Build (or find, in ``made``) the comparison of two open databases; returns its
    database entry."""
    from callpath.engine.comparison import write_compared
    from callpath.engine.database import open_databases

    with made.lock:
        done = made.made.get((base, new))
        if done is None:
            a, b = dbs[base], dbs[new]
            folder = Path(tempfile.mkdtemp(prefix="callpath-compare-"))
            _tmp.append(folder)
            # base → new: the tab reads in the order of the runs ("NEW vs BASE" read backwards)
            out = folder / f"{a.name} → {b.name}"
            write_compared([a.exp, b.exp], ["base", "new"], out, diff=True,
                           holding=_both(a, b))
            (db,) = open_databases([str(out)], warm=False)
            db.id = len(dbs)
            dbs.append(db)
            done = made.made[(base, new)] = db.id
    entry = api.databases([dbs[done]])[0]
    entry["compare"] = {"base": base, "new": new}
    warning = metrics_warning([m.name for m in dbs[base].exp.metrics],
                              [m.name for m in dbs[new].exp.metrics])
    if warning:
        entry["warning"] = warning
    return entry


def metrics_warning(base: list[str], new: list[str]) -> str | None:
    """What the user must know when the two databases' metrics differ by name (cpu-clock
    in one, CPUTIME in the other): the comparison pairs metrics by name, so each side's
    column of the other's metric is zero everywhere ("[new] = 0" looked like a result)."""
    only_base = [n for n in base if n not in new]
    only_new = [n for n in new if n not in base]
    if not only_base and not only_new:
        return None
    common = [n for n in base if n in new]
    head = ("the two databases have no metric in common" if not common else
            "some metrics are in one database only")
    def names(ns: list[str]) -> str:
        return ", ".join(ns[:4]) + (" …" if len(ns) > 4 else "")

    parts = []
    if only_base:
        parts.append(f"only in base: {names(only_base)}")
    if only_new:
        parts.append(f"only in new: {names(only_new)}")
    return (f"compare: {head} ({'; '.join(parts)}); metrics are paired by name, so the other "
            "side of these columns is zero")


def handler(dbs: list[Database]) -> Callable[[Params, bytes], Any]:
    """The ``POST /api/compare`` handler, bound to the server's list of databases (which it
    extends) and to the comparisons made on them; registered in :mod:`callpath.view.app`
    like every other API route."""
    made = Comparisons()

    def compare(params: Params, body: bytes) -> Any:
        base, new = _parse(body, len(dbs))
        return compare_databases(dbs, base, new, made)

    return compare
