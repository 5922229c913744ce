"""``metrics/default.yaml`` for a database of HPCToolkit measurements, as hpcprof writes it.

hpcviewer reads which metrics to show, how, and under which description from this file, not
from ``meta.db``. hpcrun's metric descriptors say it: the description, the ``show`` flag
(hidden by default, invisible: an accumulator only formulas use, inclusive or exclusive
only) and, for kernel properties such as ``GKER:OCC_THR``, a formula over other metrics
(``100*(#46/#47)``: ``#n`` is the n-th descriptor) that hpcprof turns into a derived root of
this file instead of a metric. One root per descriptor in hpcrun's order, invisible ones
left out; a measured metric's root has a ``Sum`` variant (inclusive: the ``execution``
scope, exclusive: ``lex_aware`` as ``custom`` and ``function`` as ``standard``), a formula's
root one unnamed variant with the formula in each of its scopes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from callpath.errors import CallpathError
from callpath.formats.hpcrun import HpcrunMetric
from callpath.model.gpu_names import SHOW_EXCLUSIVE, SHOW_HIDE, SHOW_INCLUSIVE, SHOW_INVISIBLE

#: a formula's tree: a number, a descriptor index (``("#", n)``) or (operator, arguments)
Expr = float | tuple[str, list["Expr"]] | tuple[str, int]

_TOKEN = re.compile(r"\s*(?:(\d+\.?\d*(?:[eE][-+]?\d+)?)|#(\d+)|\$(\d+)|([A-Za-z_]\w*)|(.))")
_BINARY = {"+": (1, "+"), "-": (1, "-"), "*": (2, "*"), "/": (2, "/"), "^": (3, "^")}
_FUNCTIONS = {"min", "max", "sqrt", "log", "ln", "floor", "ceil"}


def parse_formula(text: str) -> Expr:
    """hpcrun's formula syntax: numbers, ``#n`` (or ``$n``) metric references, ``+ - * /
    ^`` with the usual precedence (``^`` right-associative), unary minus, parentheses and
    the functions ``min max sqrt log ln floor ceil``."""
    toks: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            break
        pos = m.end()
        num, ref, ref2, name, sym = m.groups()
        if num is not None:
            toks.append(("num", num))
        elif ref is not None or ref2 is not None:
            toks.append(("ref", ref if ref is not None else ref2))
        elif name is not None:
            toks.append(("name", name))
        elif sym is not None and not sym.isspace():
            toks.append(("sym", sym))
    at = [0]

    def peek() -> tuple[str, str] | None:
        return toks[at[0]] if at[0] < len(toks) else None

    def take(sym: str) -> None:
        if peek() != ("sym", sym):
            raise CallpathError(f"metric formula {text!r}: expected {sym!r}")
        at[0] += 1

    def primary() -> Expr:
        t = peek()
        if t is None:
            raise CallpathError(f"metric formula {text!r} ends too early")
        at[0] += 1
        kind, val = t
        if kind == "num":
            return float(val)
        if kind == "ref":
            return ("#", int(val))
        if kind == "name" and val in _FUNCTIONS:
            take("(")
            args = [expr(0)]
            while peek() == ("sym", ","):
                at[0] += 1
                args.append(expr(0))
            take(")")
            return (val, args)
        if t == ("sym", "("):
            e = expr(0)
            take(")")
            return e
        if t == ("sym", "-"):
            return ("neg", [expr(3)])
        raise CallpathError(f"metric formula {text!r}: unexpected {val!r}")

    def expr(min_prec: int) -> Expr:
        left = primary()
        while True:
            t = peek()
            if t is None or t[0] != "sym" or t[1] not in _BINARY:
                return left
            prec, op = _BINARY[t[1]]
            if prec < min_prec:
                return left
            at[0] += 1
            right = expr(prec if op == "^" else prec + 1)
            left = (op, [left, right])

    out = expr(0)
    if at[0] != len(toks):
        raise CallpathError(f"metric formula {text!r}: unexpected {toks[at[0]][1]!r}")
    return out


def _anchor(k: int, scope: str) -> str:
    return f"m{k}-sum-{scope}"


def _flow(e: Expr, refs: dict[int, int], scope: str) -> str:
    """A formula as hpcprof's flow YAML: ``{op: [args]}``, aliases for metrics."""
    if isinstance(e, float):
        return repr(int(e)) if e.is_integer() else repr(e)
    op, args = e
    if op == "#":
        assert isinstance(args, int)
        if args not in refs:
            raise CallpathError(f"a metric formula refers to metric #{args}, which is not "
                                "a measured metric")
        return "*" + _anchor(refs[args], scope)
    assert isinstance(args, list)
    key = "-" if op == "neg" else op
    return "{" + json.dumps(key) + ": [" + ", ".join(_flow(a, refs, scope) for a in args) + "]}"


def metrics_yaml(descriptors: Sequence[HpcrunMetric], measured: Sequence[str]) -> str:
    """hpcprof's ``metrics/default.yaml`` for hpcrun's ``descriptors`` (one file's table),
    the database's metrics being ``measured`` (names, in the database's order)."""
    index = {n: k for k, n in enumerate(measured)}
    refs = {d: index[m.name] for d, m in enumerate(descriptors) if m.name in index}
    scopes_of: dict[int, tuple[str, ...]] = {}
    for m in descriptors:
        if m.name in index:
            scopes_of[index[m.name]] = _scopes(m.show)
    inputs: list[str] = []
    for k, name in enumerate(measured):
        for scope in scopes_of.get(k, ("execution", "lex_aware", "function")):
            inputs += [f"  - &{_anchor(k, scope)}", f"    metric: {json.dumps(name)}",
                       f"    scope: {scope}", "    formula: $$", "    combine: sum"]
    roots: list[str] = []
    for d, m in enumerate(descriptors):
        if m.show == SHOW_INVISIBLE or (not m.formula and m.name not in index):
            continue
        scopes = _scopes(m.show)
        roots += [f"  - name: {json.dumps(m.name)}",
                  f"    description: {json.dumps(m.description)}"]
        if m.show == SHOW_HIDE:
            roots.append("    visible by default: false")
        tree: Expr = parse_formula(m.formula) if m.formula else ("#", d)
        if m.formula and m.format:
            roots.append(f"    format: {json.dumps(m.format)}")
        variant = '""' if m.formula else "Sum"

        def term(scope: str, tree: Expr = tree) -> str:
            return _flow(tree, refs, scope)

        render = "[number, percent]" if m.show_percent else "[number]"
        roots += ["    variants:", f"      {variant}:", f"        render: {render}",
                  "        formula:"]
        if "execution" in scopes:
            roots += ["          inclusive:", f"            standard: {term('execution')}"]
        if "function" in scopes:
            roots += ["          exclusive:", f"            custom: {term('lex_aware')}",
                      f"            standard: {term('function')}"]
    lines = ["version: 0"]
    lines += ["inputs:", *inputs] if inputs else ["inputs: []"]
    lines += ["roots:", *roots] if roots else ["roots: []"]
    return "\n".join(lines) + "\n"


def _scopes(show: int) -> tuple[str, ...]:
    """The summed scopes hpcprof keeps for a descriptor's ``show`` flag."""
    if show == SHOW_INCLUSIVE:
        return ("execution",)
    if show == SHOW_EXCLUSIVE:
        return ("lex_aware", "function")
    return ("execution", "lex_aware", "function")
