"""hpcviewer's derived-metric formula language: tokenizer, parser, vectorised evaluator.

A formula such as ``$1 / $0 * 1000`` or ``avg($0, $2) / @0`` is parsed once into a small tree
and evaluated over whole numpy columns (every node of a view at once), never with ``eval``.

The grammar follows hpcviewer's expression parser (graphbuilder's ``ExpressionTree``)::

    formula  := sum
    sum      := product (('+' | '-') product)*          left-associative
    product  := power (('*' | '/') power)*              left-associative
    power    := signed ('^' signed)*                    left-associative: 2^3^2 = 64
    signed   := ['+' | '-'] primary                     a sign binds to one term: -2^2 = 4
    primary  := NUMBER | '$'INT | '@'INT | NAME '(' [sum (',' sum)*] ')' | '(' sum ')'

``^`` is left-associative and a leading sign belongs to the term it precedes, because that is
what hpcviewer does (its parser builds ``(a^b)^c`` and pushes ``-x`` as a negated term before any
operator is applied). One deliberate extension: a sign may precede a parenthesised group
(``-($1 + $2)``), which hpcviewer rejects. See docs/derived-metrics.md for the function list.

Evaluation semantics: a missing metric value counts as 0; division by zero and every other
undefined result (``sqrt(-1)``, ``ln(0)``, overflow to infinity) give NaN, which renders as an
empty cell. Numpy floating-point warnings never escape.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.analysis.formula_functions import FUNCTIONS, arity_text, power
from callpath.errors import CallpathError

F64 = npt.NDArray[np.float64]
Value = F64 | float

MAX_DEPTH = 100  # nesting of parentheses and calls; deeper input is rejected, not recursed into


class FormulaError(CallpathError):
    """A formula that does not parse (or names something that does not exist)."""

    def __init__(self, formula: str, column: int | None, message: str) -> None:
        where = f"formula {formula!r}" + (f", column {column}" if column is not None else "")
        super().__init__(f"{where}: {message}")
        self.formula = formula
        self.column = column


# ---- tokens ----------------------------------------------------------------------------

NUM, REF, NAME, OP, LPAR, RPAR, COMMA, END = "number", "ref", "name", "op", "(", ")", ",", "end"


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    pos: int  # 0-based offset into the formula text

    def describe(self) -> str:
        return "the end of the formula" if self.kind == END else repr(self.text)


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


def _is_name_start(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z") or c == "_"


def tokenize(text: str) -> list[Token]:
    """Split a formula into tokens; ASCII only, so every column number is meaningful."""
    toks: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
        elif _is_digit(c) or (c == "." and i + 1 < n and _is_digit(text[i + 1])):
            j = i
            while j < n and _is_digit(text[j]):
                j += 1
            if j < n and text[j] == ".":
                j += 1
                while j < n and _is_digit(text[j]):
                    j += 1
            if j < n and text[j] in "eE":
                k = j + 1
                if k < n and text[k] in "+-":
                    k += 1
                if k >= n or not _is_digit(text[k]):
                    found = repr(text[k]) if k < n else "the end of the formula"
                    raise FormulaError(text, k + 1, "expected the digits of an exponent but "
                                                    f"found {found}")
                while k < n and _is_digit(text[k]):
                    k += 1
                j = k
            toks.append(Token(NUM, text[i:j], i))
            i = j
        elif c in "$@":
            j = i + 1
            while j < n and _is_digit(text[j]):
                j += 1
            if j == i + 1:
                found = repr(text[j]) if j < n else "the end of the formula"
                raise FormulaError(text, j + 1, f"expected a metric number after {c!r} but "
                                                f"found {found}")
            toks.append(Token(REF, text[i:j], i))
            i = j
        elif _is_name_start(c):
            j = i + 1
            while j < n and (_is_name_start(text[j]) or _is_digit(text[j])):
                j += 1
            toks.append(Token(NAME, text[i:j], i))
            i = j
        elif c in "+-*/^":
            toks.append(Token(OP, c, i))
            i += 1
        elif c in "(),":
            toks.append(Token({"(": LPAR, ")": RPAR, ",": COMMA}[c], c, i))
            i += 1
        else:
            raise FormulaError(text, i + 1, f"unexpected character {c!r}: expected a number, "
                                            "$n, @n, a function, an operator or a parenthesis")
    toks.append(Token(END, "", n))
    return toks


# ---- syntax tree -----------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Node:
    pos: int


@dataclass(frozen=True, eq=False)
class Num(Node):
    value: float


@dataclass(frozen=True, eq=False)
class Ref(Node):
    kind: str  # '$' = value at the node, '@' = aggregate (root) value
    index: int


@dataclass(frozen=True, eq=False)
class Neg(Node):
    operand: Node


@dataclass(frozen=True, eq=False)
class BinOp(Node):
    op: str
    left: Node
    right: Node


@dataclass(frozen=True, eq=False)
class Call(Node):
    name: str  # lower case
    args: tuple[Node, ...]


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = tokenize(text)
        self.i = 0
        self.depth = 0

    def peek(self) -> Token:
        return self.toks[self.i]

    def take(self) -> Token:
        t = self.toks[self.i]
        self.i += 1
        return t

    def fail(self, tok: Token, expected: str) -> FormulaError:
        return FormulaError(self.text, tok.pos + 1, f"expected {expected} but found "
                                                    f"{tok.describe()}")

    def parse(self) -> Node:
        if self.peek().kind == END:
            raise FormulaError(self.text, None, "the formula is empty")
        node = self.sum()
        tok = self.peek()
        if tok.kind != END:
            what = ("an operator or the end of the formula" if tok.kind != RPAR
                    else "an operator or the end of the formula (this ')' has no '(')")
            raise self.fail(tok, what)
        return node

    def sum(self) -> Node:
        node = self.product()
        while self.peek().kind == OP and self.peek().text in "+-":
            op = self.take()
            node = BinOp(op.pos, op.text, node, self.product())
        return node

    def product(self) -> Node:
        node = self.power()
        while self.peek().kind == OP and self.peek().text in "*/":
            op = self.take()
            node = BinOp(op.pos, op.text, node, self.power())
        return node

    def power(self) -> Node:
        node = self.signed()
        while self.peek().kind == OP and self.peek().text == "^":
            op = self.take()
            node = BinOp(op.pos, "^", node, self.signed())
        return node

    def signed(self) -> Node:
        tok = self.peek()
        if tok.kind == OP and tok.text in "+-":
            self.take()
            operand = self.primary()
            return Neg(tok.pos, operand) if tok.text == "-" else operand
        return self.primary()

    def primary(self) -> Node:
        tok = self.take()
        if tok.kind == NUM:
            value = float(tok.text)
            if not np.isfinite(value):
                raise FormulaError(self.text, tok.pos + 1, f"number {tok.text} is out of range "
                                                           "(expected at most about 1.8e308)")
            return Num(tok.pos, value)
        if tok.kind == REF:
            return Ref(tok.pos, tok.text[0], int(tok.text[1:]))
        if tok.kind == LPAR:
            self.enter(tok)
            node = self.sum()
            close = self.take()
            if close.kind != RPAR:
                raise self.fail(close, "an operator or ')' to close the '(' at column "
                                       f"{tok.pos + 1}")
            self.depth -= 1
            return node
        if tok.kind == NAME:
            return self.call(tok)
        raise self.fail(tok, "a number, $n, @n, a function call or '('")

    def call(self, name: Token) -> Node:
        low = name.text.lower()
        if low not in FUNCTIONS:
            if self.peek().kind != LPAR:
                raise FormulaError(self.text, name.pos + 1, f"unknown name {name.text!r}: "
                                   "expected $n, @n, a number or a function call such as pi()")
            raise FormulaError(self.text, name.pos + 1, f"unknown function {name.text!r}")
        lpar = self.take()
        if lpar.kind != LPAR:
            raise self.fail(lpar, f"'(' after the function name {name.text!r}")
        self.enter(lpar)
        args: list[Node] = []
        if self.peek().kind != RPAR:
            args.append(self.sum())
            while self.peek().kind == COMMA:
                self.take()
                args.append(self.sum())
        close = self.take()
        if close.kind != RPAR:
            raise self.fail(close, f"an operator, ',' or ')' in the call of {name.text}() "
                                   f"opened at column {lpar.pos + 1}")
        self.depth -= 1
        fn = FUNCTIONS[low]
        if not fn.accepts(len(args)):
            raise FormulaError(self.text, name.pos + 1, f"{name.text}() takes "
                               f"{arity_text(fn)} but is given {len(args)}")
        return Call(name.pos, low, tuple(args))

    def enter(self, tok: Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise FormulaError(self.text, tok.pos + 1, f"nested more than {MAX_DEPTH} levels "
                                                       "deep")


# ---- the formula -----------------------------------------------------------------------


@dataclass(frozen=True, eq=False, repr=False)
class Formula:
    """A parsed formula; evaluate it over whole columns with :meth:`evaluate`."""

    text: str
    root: Node

    def references(self) -> set[tuple[str, int]]:
        """The metric references, as ``('$', n)`` (value at the node) and ``('@', n)``."""
        out: set[tuple[str, int]] = set()
        stack: list[Node] = [self.root]
        while stack:
            node = stack.pop()
            if isinstance(node, Ref):
                out.add((node.kind, node.index))
            elif isinstance(node, Neg):
                stack.append(node.operand)
            elif isinstance(node, BinOp):
                stack.extend((node.left, node.right))
            elif isinstance(node, Call):
                stack.extend(node.args)
        return out

    def check_references(self, available: Container[int], what: str = "metric") -> None:
        """Raise :class:`FormulaError` at the first reference to a metric not in ``available``."""
        stack: list[Node] = [self.root]
        bad: list[Ref] = []
        while stack:
            node = stack.pop()
            if isinstance(node, Ref):
                if node.index not in available:
                    bad.append(node)
            elif isinstance(node, Neg):
                stack.append(node.operand)
            elif isinstance(node, BinOp):
                stack.extend((node.left, node.right))
            elif isinstance(node, Call):
                stack.extend(node.args)
        if bad:
            first = min(bad, key=lambda r: r.pos)
            raise FormulaError(self.text, first.pos + 1,
                               f"{first.kind}{first.index} names no {what} of this database")

    def evaluate(self, point: Callable[[int], npt.ArrayLike], aggregate: Callable[[int], float],
                 size: int) -> F64:
        """Values of the formula for ``size`` nodes at once.

        ``point(n)`` gives metric column ``n`` for every node (length ``size``), ``aggregate(n)``
        its value at the root. Missing values (NaN in the inputs) count as 0; undefined results
        are NaN. Each referenced column is fetched once."""
        cache: dict[tuple[str, int], Value] = {}

        def fetch(ref: Ref) -> Value:
            key = (ref.kind, ref.index)
            if key not in cache:
                if ref.kind == "$":
                    col = np.asarray(point(ref.index), dtype=np.float64)
                    if col.shape != (size,):
                        raise CallpathError(f"metric {ref.index} gave {col.shape} values for "
                                            f"a view of {size} nodes")
                    cache[key] = np.nan_to_num(col, nan=0.0, posinf=0.0, neginf=0.0)
                else:
                    v = float(aggregate(ref.index))
                    cache[key] = v if np.isfinite(v) else 0.0
            return cache[key]

        with np.errstate(all="ignore"):
            result = _eval(self.root, fetch, size)
            out = np.broadcast_to(np.asarray(result, dtype=np.float64), (size,)).copy()
            out[~np.isfinite(out)] = np.nan
        return out

    def evaluate_scalar(self, aggregate: Callable[[int], float]) -> float:
        """The formula applied to the aggregates: every ``$n`` and ``@n`` is the root value.

        This is the denominator of hpcviewer's "percent of the formula on the aggregates"."""
        return float(self.evaluate(lambda n: np.array([aggregate(n)]), aggregate, 1)[0])

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"parse({self.text!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Formula) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)


def parse(text: str) -> Formula:
    """Parse a formula; raises :class:`FormulaError` naming the column and the expectation."""
    if not isinstance(text, str):
        raise FormulaError(repr(text), None, "a formula must be a string")
    return Formula(text, _Parser(text).parse())


def _postfix(root: Node) -> list[Node]:
    """The tree in postfix order, built without recursion (long formulas are left-deep)."""
    out: list[Node] = []
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded or isinstance(node, Num | Ref):
            out.append(node)
            continue
        stack.append((node, True))
        if isinstance(node, Neg):
            stack.append((node.operand, False))
        elif isinstance(node, BinOp):
            stack.append((node.right, False))
            stack.append((node.left, False))
        elif isinstance(node, Call):
            stack.extend((a, False) for a in reversed(node.args))
    return out


def _finite(v: Value) -> Value:
    """Infinities (overflow, poles) become NaN at once, so that no later ``min``/``max`` or
    ``1/x`` turns an undefined intermediate into a plausible-looking number."""
    if isinstance(v, np.ndarray):
        return np.where(np.isinf(v), np.nan, v)
    return float("nan") if math.isinf(v) else float(v)


def _eval(root: Node, fetch: Callable[[Ref], Value], size: int) -> Value:
    values: list[Value] = []
    for node in _postfix(root):
        if isinstance(node, Num):
            values.append(node.value)
        elif isinstance(node, Ref):
            values.append(fetch(node))
        elif isinstance(node, Neg):
            values.append(-values.pop())
        elif isinstance(node, BinOp):
            b = values.pop()
            a = values.pop()
            if node.op == "+":
                values.append(_finite(a + b))
            elif node.op == "-":
                values.append(_finite(a - b))
            elif node.op == "*":
                values.append(_finite(a * b))
            elif node.op == "/":
                values.append(_finite(_divide(a, b)))
            else:
                values.append(_finite(power(a, b)))
        elif isinstance(node, Call):
            k = len(node.args)
            args = values[len(values) - k:] if k else []
            del values[len(values) - k:]
            values.append(_finite(FUNCTIONS[node.name].apply(args, size)))
    return values[0]


def _divide(a: Value, b: Value) -> Value:
    """``a / b`` with NaN (an empty cell) wherever ``b`` is 0, as hpcviewer shows nothing."""
    bb = np.asarray(b, dtype=np.float64)
    q = np.asarray(a, dtype=np.float64) / bb
    return np.where(bb == 0.0, np.nan, q)
