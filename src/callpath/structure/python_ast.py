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
from callpath.structure.model import Kind, Structure, StructureBuilder


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
    run_end = np.concatenate([brk, [len(ln)]]).astype(np.int64)
    by_scope: dict[int, dict[int, list[tuple[int, int]]]] = {}
    if len(ln):
        for k0, lo, hi in zip(key[run_at].tolist(), ln[run_at].tolist(),
                              (ln[run_end - 1] + 1).tolist(), strict=True):
            by_scope.setdefault(k0 >> 32, {}).setdefault(k0 & 0xFFFFFFFF, []).append((lo, hi))

    b = StructureBuilder(p, None)
    fscope = b.add(Kind.FILE, 0, name=p)

    def emit(sc: PyScope, parent: int) -> None:
        if sc.kind == Kind.PROC:
            i = b.add(Kind.PROC, parent, name=sc.name, file=p, line=sc.line,
                      ranges=[(sc.line, sc.line + 1)])
        else:
            i = b.add(Kind.LOOP, parent, file=p, line=sc.line, ranges=[(sc.line, sc.line + 1)])
        for st, rs in sorted(by_scope.get(sc.ident, {}).items()):
            s = b.add(Kind.STMT, i, file=p, line=st, ranges=rs)
            for lo, hi in rs:
                b.map_range(lo, hi, s)
        for c in sc.children:
            emit(c, i)

    for pr in procs:
        emit(pr, fscope)
    return b.build()
