"""Comparison databases: two (or more) runs compared and written as one v4 database with its
delta and ratio metrics saved beside it. ``callpath diff`` and ``callpath merge`` write one
from paths (:func:`write_comparison`); the viewer's Compare writes one from two databases it
has open (:func:`write_compared`). The comparison itself is :mod:`callpath.analysis.compare`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from callpath.analysis.compare import compare, database_tags
from callpath.analysis.derived import save_derived
from callpath.errors import CallpathError
from callpath.model import Experiment


def write_compared(inputs: Sequence[Experiment], tags: Sequence[str], out: str | os.PathLike[str],
                   *, diff: bool, holding: AbstractContextManager[object] | None = None) -> Path:
    """Compare ``inputs`` (tagged ``tags``), write the result at ``out`` and save its derived
    metrics beside it (as ``callpath report --save-derived`` does). ``holding`` is held
    while the inputs are read (the viewer's locks of the two databases), not while the
    result is written."""
    from callpath.formats.v4.writer import write_v4

    with holding if holding is not None else contextlib.nullcontext():
        exp, derived = compare(list(inputs), list(tags), diff=diff)
    write_v4(exp, out)
    save_derived(out, derived)
    return Path(out)


def write_comparison(paths: Sequence[str], out: str, *, diff: bool) -> Path:
    """Open the databases at ``paths``, compare them and write the result at ``out``
    (``base``/``new`` for a diff, else one tag per database)."""
    from callpath.formats.detect import open_experiment

    target = Path(out).resolve()
    for p in paths:
        if Path(p).resolve() == target:
            raise CallpathError(f"{out}: the output would overwrite the input database {p}")
    inputs = [open_experiment(p) for p in paths]
    tags = ["base", "new"] if diff else database_tags(paths)
    return write_compared(inputs, tags, out, diff=diff)
