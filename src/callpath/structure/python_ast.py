"""Structure of a Python source file from its ``ast``, in the same model as binaries.

A Python file becomes a pseudo load module whose "addresses" are line numbers: the module's
path is the ``.py`` file, one FILE scope holds one PROC per code object the interpreter will
report (``<module>`` for top-level code, and every function and method under its
``__qualname__``, e.g. ``Outer.method`` or ``f.<locals>.g``), loops (``for``, ``while``,
``async for`` and comprehensions) nest inside them, and a STMT per statement covers all the lines
of that statement (a sample reports the line being executed, which can be any line of a
multi-line statement). :meth:`Structure.lookup` on line numbers therefore answers "which
statement, loop and function is this line in", exactly as module offsets do for binaries.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from callpath.errors import FormatError
from callpath.structure.model import Kind, Structure


@dataclass
class PyScope:
    kind: Kind
    name: str
    line: int
    end: int
    children: list[PyScope] = field(default_factory=list)
    ident: int = -1


_FOR = re.compile(rb"\bfor\b")
_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.ListComp, ast.SetComp, ast.DictComp,
          ast.GeneratorExp)


def structure_of_python(path: str | os.PathLike[str]) -> Structure:
    """Functions, loops and statement lines of the Python file at ``path``."""
    p = str(path)
    try:
        with open(p, "rb") as f:
            source = f.read()
    except OSError as e:
        raise FormatError(p, f"cannot open: {e.strerror or e}") from None
    try:
        tree = ast.parse(source, filename=p)
    except (SyntaxError, ValueError) as e:
        line = getattr(e, "lineno", None)
        where = f" at line {line}" if line else ""
        raise FormatError(p, f"not valid Python{where}: {getattr(e, 'msg', e)}") from None
    nlines = source.count(b"\n") + 2
    scope_of = np.zeros(nlines + 1, dtype=np.int32)  # innermost scope per line (0 = <module>)
    stmt_of = np.zeros(nlines + 1, dtype=np.int32)  # first line of the statement per line
    scopes: list[PyScope] = []
    module = PyScope(Kind.PROC, "<module>", 1, nlines)
    module.ident = 0
    scopes.append(module)
    procs: list[PyScope] = [module]

    def paint(sc: PyScope) -> None:
        scope_of[sc.line:sc.end + 1] = sc.ident

    # Expressions hold no statement, function or class; the only scopes inside them are
    # comprehensions, whose lines always include the keyword "for". An expression whose lines
    # have no "for" (most of them) is not descended into: the walk over every expression node
    # was 60% of the time of a file (torch imports ~900 files). Words in strings and comments
    # only make the test pass where it need not, never the other way.
    newlines = np.flatnonzero(np.frombuffer(source, dtype=np.uint8) == 10)
    at = np.array([m.start() for m in _FOR.finditer(source)], dtype=np.int64)
    has_for = np.zeros(nlines + 1, dtype=np.int64)
    has_for[np.searchsorted(newlines, at, side="right") + 1] = 1
    for_before = np.cumsum(has_for).tolist()

    def visit(node: ast.AST, cur: PyScope, qual: str, in_func: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                lo = child.lineno
                hi = child.end_lineno or lo
                if for_before[min(hi, nlines)] == for_before[lo - 1]:
                    continue
            nxt, q = cur, qual
            if isinstance(child, ast.stmt):
                first = child.lineno
                end = child.end_lineno or first
                body = getattr(child, "body", None)
                if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                    end = max(first, body[0].lineno - 1)
                    deco = getattr(child, "decorator_list", [])
                    first = min([first] + [d.lineno for d in deco])
                stmt_of[first:end + 1] = first
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                if in_func:
                    q = f"{qual}.<locals>.{child.name}"
                else:
                    q = f"{qual}.{child.name}" if qual else child.name
                if isinstance(child, ast.ClassDef):
                    visit(child, cur, q, False)
                    continue
                sc = PyScope(Kind.PROC, q, child.lineno, child.end_lineno or child.lineno)
                sc.ident = len(scopes)
                scopes.append(sc)
                procs.append(sc)
                paint(sc)
                visit(child, sc, q, True)
                continue
            if isinstance(child, _LOOPS):
                sc = PyScope(Kind.LOOP, "", child.lineno, child.end_lineno or child.lineno)
                sc.ident = len(scopes)
                scopes.append(sc)
                cur.children.append(sc)
                paint(sc)
                nxt = sc
            visit(child, nxt, q, in_func)

    visit(tree, module, "", False)
    return build_python_structure(p, nlines, procs, scope_of, stmt_of)


def build_python_structure(p: str, nlines: int, procs: list[PyScope],
                           scope_of: npt.NDArray[np.int32], stmt_of: npt.NDArray[np.int32],
                           keep: npt.NDArray[np.int64] | None = None) -> Structure:
    """The structure of file ``p`` from its procedures (each holding its loop tree) and two
    line maps: the innermost scope (``ident``) and the first line of the statement of every
    line (0: no statement). Shared by the ``ast`` and the bytecode readers, so both build the
    same model from the same facts. ``keep``: only the statements holding these lines (the
    sampled ones), the procedures and loops all the same."""
    # Statements: the lines of one (innermost scope, statement's first line), in runs.
    ln = np.flatnonzero(stmt_of[1:nlines + 1]).astype(np.int64) + 1
    key = (scope_of[ln].astype(np.int64) << 32) | stmt_of[ln].astype(np.int64)
    if keep is not None:
        k = keep[(keep >= 1) & (keep <= nlines)]
        k = k[stmt_of[k] != 0]
        m = np.isin(key, (scope_of[k].astype(np.int64) << 32) | stmt_of[k].astype(np.int64))
        ln, key = ln[m], key[m]
    brk = np.flatnonzero((np.diff(ln) != 1) | (np.diff(key) != 0)) + 1
    run_at = np.concatenate([[0], brk]).astype(np.int64)
    run_lo = ln[run_at] if len(ln) else ln
    run_hi = ln[np.concatenate([brk, [len(ln)]]).astype(np.int64) - 1] + 1 if len(ln) else ln
    run_key = key[run_at] if len(ln) else key
    order = np.lexsort((run_lo, run_key))
    run_lo, run_hi, run_key = run_lo[order], run_hi[order], run_key[order]
    st_key, st_first = np.unique(run_key, return_index=True)  # statements, in (scope, line)
    st_runs = np.diff(np.concatenate([st_first, [len(run_key)]]))
    st_scope = (st_key >> 32).astype(np.int64)
    st_line = (st_key & 0xFFFFFFFF).astype(np.int64)

    # The procedures and loops in preorder, each followed by its statements.
    nodes: list[tuple[PyScope, int]] = []  # (scope, preorder index of its parent, -1: FILE)

    def walk(sc: PyScope, par: int) -> None:
        me = len(nodes)
        nodes.append((sc, par))
        for c in sc.children:
            walk(c, me)

    for pr in procs:
        walk(pr, -1)
    idents = np.array([sc.ident for sc, _ in nodes], dtype=np.int64)
    # statements per node: those of its ident (an ident's statements are contiguous)
    lo_st = np.searchsorted(st_scope, idents, side="left")
    n_st = np.searchsorted(st_scope, idents, side="right") - lo_st
    row = 2 + np.arange(len(nodes)) + np.concatenate([[0], np.cumsum(n_st)[:-1]])
    total = 2 + len(nodes) + int(n_st.sum())
    strings = [p]
    sid: dict[str, int] = {p: 0}
    kind = np.full(total, int(Kind.STMT), dtype=np.uint8)
    parent = np.zeros(total, dtype=np.int32)
    name = np.full(total, -1, dtype=np.int32)
    line = np.zeros(total, dtype=np.int32)
    file = np.zeros(total, dtype=np.int32)
    kind[0], parent[0], name[0], file[0] = int(Kind.ROOT), -1, 0, -1
    kind[1], parent[1], name[1], file[1] = int(Kind.FILE), 0, 0, -1
    node_rows = row.tolist()
    for (sc, par), r in zip(nodes, node_rows, strict=True):
        kind[r] = int(sc.kind)
        parent[r] = 1 if par < 0 else node_rows[par]
        if sc.kind == Kind.PROC:
            name[r] = sid.setdefault(sc.name, len(sid))
            if name[r] == len(strings):
                strings.append(sc.name)
        line[r] = sc.line
    # statement rows: after their node, in line order
    within = np.arange(int(n_st.sum())) - np.repeat(np.cumsum(n_st) - n_st, n_st)
    st_rows = np.repeat(row + 1, n_st) + within
    st_index = np.repeat(lo_st, n_st) + within  # each node's statements, in its block
    st_row_of = np.empty(len(st_key), dtype=np.int64)
    st_row_of[st_index] = st_rows
    parent[st_rows] = np.repeat(row, n_st)
    line[st_rows] = st_line[st_index]
    # ranges: [line, line + 1) for a procedure or loop, the runs of lines for a statement
    n_ranges = np.zeros(total, dtype=np.int64)
    n_ranges[row] = 1
    n_ranges[st_row_of] = st_runs
    rows_of_ranges = np.concatenate([row, np.repeat(st_row_of, st_runs)])
    lo_all = np.concatenate([line[row].astype(np.int64), run_lo])
    hi_all = np.concatenate([line[row].astype(np.int64) + 1, run_hi])
    o = np.lexsort((lo_all, rows_of_ranges))
    map_scope = np.repeat(st_row_of, st_runs).astype(np.int32)
    mo = np.lexsort((map_scope, run_hi, run_lo))
    return Structure(
        path=p, build_id=None, strings=strings, kind=kind, parent=parent, name=name,
        link_name=np.full(total, -1, dtype=np.int32), file=file, line=line,
        call_file=np.full(total, -1, dtype=np.int32),
        call_line=np.zeros(total, dtype=np.int32), target=np.zeros(total, dtype=np.uint64),
        range_ptr=np.concatenate([[0], np.cumsum(n_ranges)]).astype(np.int64),
        range_lo=lo_all[o].astype(np.uint64), range_hi=hi_all[o].astype(np.uint64),
        map_lo=run_lo[mo].astype(np.uint64), map_hi=run_hi[mo].astype(np.uint64),
        map_scope=map_scope[mo])
