"""The list of execution contexts (``callpath report --contexts``). The views themselves are
rendered by :mod:`callpath.present.viewreport`."""

from __future__ import annotations

from typing import TextIO

from callpath.model import Experiment


def render_contexts(exp: Experiment, out: TextIO) -> None:
    """The execution contexts, one per line: profile index, short and full label."""
    out.write(f"{'profile':>7}  {'short':<10}  identifiers\n")
    for p in exp.profiles:
        if p.is_summary:
            short, label = "summary", "(summary of all contexts)"
        else:
            short, label = p.short_label(exp.id_names), p.label(exp.id_names)
        out.write(f"{p.index:>7}  {short:<10}  {label}\n")
    out.write(f"{len(exp.contexts)} execution contexts\n")
