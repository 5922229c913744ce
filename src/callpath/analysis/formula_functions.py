"""The functions of the derived-metric formula language, vectorised over numpy columns.

The names, arities and meanings are hpcviewer's (graphbuilder's default function map plus
hpcviewer's ``stdev``): ``lg`` is log base 2, ``log(x)`` log base 10 and ``log(x, b)`` log base
``b``; ``round`` rounds halves up like Java's ``Math.round``; ``fact`` and ``combin`` truncate
their arguments to integers first. Where hpcviewer would return a meaningless number for an
undefined input (``fact(-3)``, ``combin(2, 5)`` with a negative ``n``) the result here is NaN,
an empty cell. Each argument may be a scalar or a column; results broadcast.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
Value = F64 | float

FACT_MAX = 170  # 171! overflows a double
COMBIN_K_MAX = 1100  # C(n, k) with min(k, n-k) above this overflows a double


@dataclass(frozen=True)
class Function:
    name: str
    min_args: int
    max_args: int | None  # None: any number
    impl: Callable[[list[Value], int], Value]
    doc: str

    def accepts(self, n: int) -> bool:
        return n >= self.min_args and (self.max_args is None or n <= self.max_args)

    def apply(self, args: list[Value], size: int) -> Value:
        return self.impl(args, size)


def arity_text(fn: Function) -> str:
    if fn.max_args is None:
        return f"at least {fn.min_args} argument" + ("s" if fn.min_args != 1 else "")
    if fn.min_args == fn.max_args:
        n = fn.min_args
        return "no arguments" if n == 0 else f"{n} argument" + ("s" if n != 1 else "")
    return f"{fn.min_args} to {fn.max_args} arguments"


def _arr(v: Value) -> F64:
    return np.asarray(v, dtype=np.float64)


def power(a: Value, b: Value) -> F64:
    """``a ^ b`` with an empty cell wherever either operand is empty: IEEE ``pow`` gives
    ``1 ^ NaN = NaN ^ 0 = 1``, which would turn an undefined value (``0 / 0``) into a
    plausible-looking number."""
    aa, bb = _arr(a), _arr(b)
    with np.errstate(all="ignore"):
        out = np.power(aa, bb)
    return np.where(np.isnan(aa) | np.isnan(bb), np.nan, out)


def _stack(args: Sequence[Value], size: int) -> F64:
    """Arguments as a (k, size) or (k,) array, scalars broadcast."""
    arrays = [_arr(a) for a in args]
    if any(a.ndim for a in arrays):
        return np.stack([np.broadcast_to(a, (size,)) for a in arrays])
    return np.array(arrays, dtype=np.float64)


def _unary(f: Callable[[F64], F64]) -> Callable[[list[Value], int], Value]:
    return lambda args, size: f(_arr(args[0]))


def _round_half_up(x: F64) -> F64:
    return np.floor(x + 0.5)


def _fact(args: list[Value], size: int) -> Value:
    n = np.trunc(_arr(args[0]))
    out = np.ones_like(n)
    top = int(np.nanmax(np.where(n <= FACT_MAX, n, 0), initial=0))
    for i in range(2, top + 1):
        out = np.where(n >= i, out * i, out)
    out = np.where(n > FACT_MAX, np.inf, out)
    return np.where((n < 0) | np.isnan(n), np.nan, out)


def _combin(args: list[Value], size: int) -> Value:
    n = np.trunc(_arr(args[0]))
    r = np.trunc(_arr(args[1]))
    n, r = np.broadcast_arrays(n, r)
    k = np.minimum(r, n - r)
    ok = np.isfinite(n) & np.isfinite(r) & (n >= 0)
    in_range = ok & (r >= 0) & (r <= n)
    k = np.where(in_range, k, 0)
    top = int(np.max(np.where(k <= COMBIN_K_MAX, k, 0), initial=0))
    out = np.ones(n.shape, dtype=np.float64)
    for i in range(1, top + 1):
        out = np.where(k >= i, out * (n - k + i) / i, out)
    out = np.round(out)  # the running products are exact ratios; remove rounding drift
    out = np.where(k > COMBIN_K_MAX, np.inf, out)
    out = np.where(in_range, out, 0.0)
    return np.where(ok, out, np.nan)


def _log(args: list[Value], size: int) -> Value:
    x = _arr(args[0])
    if len(args) == 1:
        return np.log10(x)
    base = np.log(_arr(args[1]))
    return np.where(base == 0.0, np.nan, np.log(x) / base)


def _mod(args: list[Value], size: int) -> Value:
    y = _arr(args[1])
    return np.where(y == 0.0, np.nan, np.fmod(_arr(args[0]), y))


def _stdev(args: list[Value], size: int) -> Value:
    s = _stack(args, size)
    if s.shape[0] < 2:
        return np.full(s.shape[1:], np.nan) if s.ndim > 1 else float("nan")
    return np.asarray(np.std(s, axis=0, ddof=1), dtype=np.float64)


def _rand(args: list[Value], size: int) -> Value:
    return np.random.default_rng().random(size)


def _table() -> dict[str, Function]:
    fns: list[Function] = [
        # any number of arguments (at least one)
        Function("min", 1, None, lambda a, s: np.min(_stack(a, s), axis=0), "smallest argument"),
        Function("max", 1, None, lambda a, s: np.max(_stack(a, s), axis=0), "largest argument"),
        Function("sum", 1, None, lambda a, s: np.sum(_stack(a, s), axis=0), "sum of arguments"),
        Function("avg", 1, None, lambda a, s: np.mean(_stack(a, s), axis=0),
                 "mean of arguments"),
        Function("stdev", 1, None, _stdev, "sample standard deviation (n-1) of arguments"),
        # no arguments
        Function("pi", 0, 0, lambda a, s: float(np.pi), "3.14159..."),
        Function("e", 0, 0, lambda a, s: float(np.e), "2.71828..."),
        Function("rand", 0, 0, _rand, "uniform random number in [0, 1), one per node"),
        # one argument
        Function("sin", 1, 1, _unary(np.sin), "sine (radians)"),
        Function("cos", 1, 1, _unary(np.cos), "cosine (radians)"),
        Function("tan", 1, 1, _unary(np.tan), "tangent (radians)"),
        Function("asin", 1, 1, _unary(np.arcsin), "arc sine"),
        Function("acos", 1, 1, _unary(np.arccos), "arc cosine"),
        Function("atan", 1, 1, _unary(np.arctan), "arc tangent"),
        Function("sinh", 1, 1, _unary(np.sinh), "hyperbolic sine"),
        Function("cosh", 1, 1, _unary(np.cosh), "hyperbolic cosine"),
        Function("tanh", 1, 1, _unary(np.tanh), "hyperbolic tangent"),
        Function("asinh", 1, 1, _unary(np.arcsinh), "inverse hyperbolic sine"),
        Function("acosh", 1, 1, _unary(np.arccosh), "inverse hyperbolic cosine"),
        Function("atanh", 1, 1, _unary(np.arctanh), "inverse hyperbolic tangent"),
        Function("sqrt", 1, 1, _unary(np.sqrt), "square root"),
        Function("abs", 1, 1, _unary(np.abs), "absolute value"),
        Function("ceil", 1, 1, _unary(np.ceil), "smallest integer not below x"),
        Function("floor", 1, 1, _unary(np.floor), "largest integer not above x"),
        Function("exp", 1, 1, _unary(np.exp), "e to the power x"),
        Function("ln", 1, 1, _unary(np.log), "natural logarithm"),
        Function("lg", 1, 1, _unary(np.log2), "logarithm base 2"),
        Function("sign", 1, 1, _unary(np.sign), "1, 0 or -1"),
        Function("round", 1, 1, _unary(_round_half_up), "nearest integer, halves up"),
        Function("fact", 1, 1, _fact, "factorial of trunc(n)"),
        # two arguments (log takes one or two)
        Function("log", 1, 2, _log, "log(x): base 10; log(x, b): base b"),
        Function("pow", 2, 2, lambda a, s: power(a[0], a[1]), "x to the power y"),
        Function("mod", 2, 2, _mod, "remainder of x / y, with the sign of x"),
        Function("combin", 2, 2, _combin, "binomial coefficient C(trunc(n), trunc(r))"),
    ]
    return {f.name: f for f in fns}


FUNCTIONS: dict[str, Function] = _table()
