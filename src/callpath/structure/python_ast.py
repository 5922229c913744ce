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

from callpath.errors import FormatError
from callpath.structure.model import Kind, Structure, StructureBuilder


@dataclass
class _Scope:
    kind: Kind
    name: str
    line: int
    end: int
    children: list[_Scope] = field(default_factory=list)
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
    scopes: list[_Scope] = []
    module = _Scope(Kind.PROC, "<module>", 1, nlines)
    module.ident = 0
    scopes.append(module)
    procs: list[_Scope] = [module]

    def paint(sc: _Scope) -> None:
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

    def visit(node: ast.AST, cur: _Scope, qual: str, in_func: bool) -> None:
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
                sc = _Scope(Kind.PROC, q, child.lineno, child.end_lineno or child.lineno)
                sc.ident = len(scopes)
                scopes.append(sc)
                procs.append(sc)
                paint(sc)
                visit(child, sc, q, True)
                continue
            if isinstance(child, _LOOPS):
                sc = _Scope(Kind.LOOP, "", child.lineno, child.end_lineno or child.lineno)
                sc.ident = len(scopes)
                scopes.append(sc)
                cur.children.append(sc)
                paint(sc)
                nxt = sc
            visit(child, nxt, q, in_func)

    visit(tree, module, "", False)
    # Statements: group lines by (innermost scope, statement's first line).
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for ln in range(1, nlines + 1):
        st = int(stmt_of[ln])
        if st == 0:
            continue
        rs = groups.setdefault((int(scope_of[ln]), st), [])
        if rs and rs[-1][1] == ln:
            rs[-1] = (rs[-1][0], ln + 1)
        else:
            rs.append((ln, ln + 1))
    by_scope: dict[int, list[tuple[int, list[tuple[int, int]]]]] = {}
    for (sc, st), rs in groups.items():
        by_scope.setdefault(sc, []).append((st, rs))

    b = StructureBuilder(p, None)
    fscope = b.add(Kind.FILE, 0, name=p)

    def emit(sc: _Scope, parent: int) -> None:
        if sc.kind == Kind.PROC:
            i = b.add(Kind.PROC, parent, name=sc.name, file=p, line=sc.line,
                      ranges=[(sc.line, sc.line + 1)])
        else:
            i = b.add(Kind.LOOP, parent, file=p, line=sc.line, ranges=[(sc.line, sc.line + 1)])
        for st, rs in sorted(by_scope.get(sc.ident, [])):
            s = b.add(Kind.STMT, i, file=p, line=st, ranges=rs)
            for lo, hi in rs:
                b.map_range(lo, hi, s)
        for c in sc.children:
            emit(c, i)

    for pr in procs:
        emit(pr, fscope)
    return b.build()
