"""What the Lines tab keeps per database: the compressed overviews of line matrices and the
text of their source files, in the database's cache (:class:`~callpath.engine.database.
Database`), so that a click in the viewer reuses them instead of recomputing them. The
matrices and overviews themselves are :mod:`callpath.analysis.lines`."""

from __future__ import annotations

from dataclasses import dataclass

from callpath.analysis import lines as lm
from callpath.engine.database import Database


@dataclass(frozen=True)
class OverviewParams:
    skip: int
    bin: int
    reduce: str
    strip: int
    cbins: int
    top: bool  # the cbins highest contexts of each overview row instead of bins by max


def overview_of(db: Database, m: lm.LineMatrix, p: OverviewParams) -> lm.Overview:
    """The overview of ``m`` for ``p``, cached per database (a click on a ranked procedure
    only asks for new rectangles: the overview itself must not be recomputed)."""
    key = f"lines-overview:{id(m)}:{p}"
    hit = db.trace_cache.get(key)
    if not isinstance(hit, lm.Overview):
        for k in [k for k in db.trace_cache if k.startswith("lines-overview")][:-14]:
            del db.trace_cache[k]  # keep the last few overviews and their documents
        if p.top:
            hit = lm.overview(m, p.skip, p.bin, p.reduce, p.strip, top_contexts=p.cbins)
        else:
            hit = lm.overview(m, p.skip, p.bin, p.reduce, p.strip, context_bins=p.cbins)
        db.trace_cache[key] = hit
    return hit


def source_of_file(db: Database, m: lm.LineMatrix, f: int) -> list[str] | None:
    """The text of file ``f`` of the matrix, cached per database (None: unreadable)."""
    key = f"lines-source:{m.files[f]}"
    if key not in db.trace_cache:
        db.trace_cache[key] = lm.source_text(m, f)
    got = db.trace_cache[key]
    return got if isinstance(got, list) else None
