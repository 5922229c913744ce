"""Display names of files and load modules: the base name, lengthened only where it is shared.

A tree labelled by base names alone is ambiguous as soon as two paths share one: a Python
program has a dozen ``__init__.py`` (pytest's ``config/__init__.py``, pluggy's, ...) and as
many ``core.py`` and ``main.py``, each its own row in the Flat view with its own cost. Each
path is shown with the fewest trailing components that no other path of the same base name
ends with (``config/__init__.py``, ``pluggy/__init__.py``), as editors label tabs; a path
whose base name is its own keeps it, so native programs read as before.

Computed once per experiment (a pass over the table, grouped by base name) and kept on it.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from callpath.model.experiment import Experiment

__all__ = ["file_names", "module_names", "unique_suffixes"]


def _parts(path: str) -> list[str]:
    return [p for p in path.split(os.sep) if p]


def unique_suffixes(paths: Sequence[str]) -> list[str]:
    """For each path, its shortest suffix of whole components that no other distinct path
    with the same base name shares (the path itself when one is a suffix of another)."""
    out = [os.path.basename(p) or p for p in paths]
    groups: dict[str, set[str]] = defaultdict(set)
    for p, b in zip(paths, out, strict=True):
        groups[b].add(p)
    chosen: dict[str, str] = {}
    for group in groups.values():
        if len(group) < 2:
            continue
        split = {p: _parts(p) for p in group}
        for p, parts in split.items():
            label = p
            for k in range(2, len(parts) + 1):
                tail = parts[-k:]
                if not any(q != p and qp[-k:] == tail for q, qp in split.items()):
                    label = "/".join(tail)
                    break
            chosen[p] = label
    return [chosen.get(p, b) for p, b in zip(paths, out, strict=True)]


def _kept(exp: Experiment, key: str, table: Sequence[Any]) -> list[str]:
    """The display names of ``table``'s paths, kept on the experiment under ``key`` and
    recomputed only when the table has grown (this runs once per node named)."""
    got: list[str] | None = exp.__dict__.get(key)
    if got is None or len(got) != len(table):
        got = exp.__dict__[key] = unique_suffixes([x.path for x in table])
    return got


def file_names(exp: Experiment) -> list[str]:
    """Display name of every entry of ``exp.files``."""
    return _kept(exp, "_short_file_names", exp.files)


def module_names(exp: Experiment) -> list[str]:
    """Display name of every entry of ``exp.modules``."""
    return _kept(exp, "_short_module_names", exp.modules)
