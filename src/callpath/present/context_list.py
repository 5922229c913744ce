"""The list of execution contexts (``callpath report --contexts``). The views themselves are
rendered by :mod:`callpath.present.viewreport`."""

from __future__ import annotations

from typing import TextIO

from callpath.model import Experiment
from callpath.model.contexts import node_texts


def render_contexts(exp: Experiment, out: TextIO) -> None:
    """The execution contexts, one per line: profile index, short and full label. Every
    identifier is listed, a NODE's host id in hex (``NODE 0x7f0100``, not ``NODE 8323328``)."""
    out.write(f"{'profile':>7}  {'short':<10}  identifiers\n")
    nodes = node_texts(exp.profiles, exp.id_names, omit_single=False)
    for p in exp.profiles:
        if p.is_summary:
            short, label = "summary", "(summary of all contexts)"
        else:
            short, label = p.short_label(exp.id_names), p.label(exp.id_names, nodes)
        out.write(f"{p.index:>7}  {short:<10}  {label}\n")
    out.write(f"{len(exp.contexts)} execution contexts\n")
