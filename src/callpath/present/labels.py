"""Human-readable names of calling-context-tree nodes, as hpcviewer shows them.

Procedure activations reached by a call render as ``[line] » callee`` where ``line`` is the
call site's line in the caller; loops as ``loop at file:line``; statements as ``file:line``;
instructions as ``module+0xoffset``. Labels are computed for the nodes being shown only.
"""

from __future__ import annotations

import os

from callpath.model import Experiment, NodeKind, Relation

ROOT_LABEL = "<program root>"


def _base(path: str) -> str:
    return os.path.basename(path) or path


def function_name(exp: Experiment, node: int) -> str:
    """The procedure name of a function node, or a placeholder naming where it is."""
    cct = exp.cct
    f = int(cct.function[node])
    if f >= 0:
        fn = exp.functions[f]
        if fn.has_name and fn.name:
            return fn.name
        if fn.module >= 0:
            return f"<unknown procedure> {_base(exp.modules[fn.module].path)}+{fn.offset:#x}"
    m = int(cct.module[node])
    if m >= 0:
        return f"<unknown procedure> {_base(exp.modules[m].path)}+{int(cct.offset[node]):#x}"
    return "<unknown procedure>"


def source_location(exp: Experiment, node: int) -> str:
    cct = exp.cct
    fi = int(cct.file[node])
    name = _base(exp.files[fi].path) if fi >= 0 else "<unknown file>"
    return f"{name}:{int(cct.line[node])}"


def instruction_location(exp: Experiment, node: int) -> str:
    cct = exp.cct
    m = int(cct.module[node])
    mod = _base(exp.modules[m].path) if m >= 0 else "<unknown module>"
    return f"{mod}+{int(cct.offset[node]):#x}"


def node_name(exp: Experiment, node: int) -> str:
    """The bare name of a node (no call-site decoration)."""
    kind = int(exp.cct.kind[node])
    if kind == NodeKind.ROOT:
        return ROOT_LABEL
    if kind == NodeKind.ENTRY:
        return exp.cct.entry_names.get(node, "<entry>")
    if kind == NodeKind.FUNCTION:
        return function_name(exp, node)
    if kind == NodeKind.LOOP:
        return f"loop at {source_location(exp, node)}"
    if kind == NodeKind.LINE:
        return source_location(exp, node)
    return instruction_location(exp, node)


def node_label(exp: Experiment, node: int) -> str:
    """The label shown in a top-down tree: calls get ``[line] » `` in front of the callee."""
    cct = exp.cct
    name = node_name(exp, node)
    rel = int(cct.relation[node])
    if rel not in (Relation.CALL, Relation.INLINED_CALL):
        return name
    parent = int(cct.parent[node])
    prefix = "»"
    if parent >= 0 and int(cct.kind[parent]) in (NodeKind.LINE, NodeKind.LOOP) \
            and int(cct.file[parent]) >= 0:
        prefix = f"[{int(cct.line[parent])}] »"
    suffix = " [inlined]" if rel == Relation.INLINED_CALL else ""
    return f"{prefix} {name}{suffix}"
