"""The derived-metric formula language: grammar, functions, errors, vectorised evaluation."""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callpath.analysis.formula import FormulaError, parse
from callpath.analysis.formula_functions import FUNCTIONS
from callpath.errors import CallpathError


def scalar(text: str, agg: dict[int, float] | None = None) -> float:
    values = agg or {}
    return parse(text).evaluate_scalar(lambda n: values.get(n, 0.0))


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-300)


# ---- grammar -------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("1+2*3", 7.0),
    ("(1+2)*3", 9.0),
    ("8-4-2", 2.0),            # left association
    ("8/4/2", 1.0),
    ("2^3^2", 64.0),           # hpcviewer: ^ is left-associative too, (2^3)^2
    ("2*3^2", 18.0),           # ^ binds tighter than *
    ("2^3*2", 16.0),
    ("-2^2", 4.0),             # a sign belongs to its term: (-2)^2
    ("3-2^2", -1.0),           # binary minus, then a power
    ("3*-2", -6.0),            # a sign on a term after an operator
    ("2^-1", 0.5),
    ("+3", 3.0),
    ("-(1+2)*3", -9.0),        # extension: a sign on a parenthesised group
    ("1.5e3+2E-1", 1500.2),
    (".5+1.", 1.5),
    ("1e+2", 100.0),
    ("  7 \t*\n2 ", 14.0),
    ("10-2*3+4/2^2", 5.0),
])
def test_precedence_and_association(text: str, expected: float) -> None:
    assert scalar(text) == pytest.approx(expected)


def test_references_and_aggregates() -> None:
    f = parse("$1 / $0 * 100 + @0 - @12")
    assert f.references() == {("$", 1), ("$", 0), ("@", 0), ("@", 12)}
    cols = {0: np.array([2.0, 4.0, 0.0]), 1: np.array([1.0, 1.0, 5.0])}
    out = f.evaluate(lambda n: cols[n], lambda n: {0: 10.0, 12: 3.0}[n], 3)
    assert out[0] == pytest.approx(57.0)
    assert out[1] == pytest.approx(32.0)
    assert np.isnan(out[2])  # division by zero: an empty cell


def test_missing_values_count_as_zero() -> None:
    f = parse("$0 + $1 + @2")
    out = f.evaluate(lambda n: np.array([np.nan, 1.0]) if n == 0 else np.array([2.0, np.nan]),
                     lambda n: float("nan"), 2)
    assert out.tolist() == [2.0, 1.0]


def test_evaluate_scalar_uses_the_aggregates_everywhere() -> None:
    assert scalar("$1/$0", {0: 4.0, 1: 10.0}) == 2.5
    assert scalar("$1/@0", {0: 4.0, 1: 10.0}) == 2.5
    assert math.isnan(scalar("$1/$0", {1: 10.0}))


def test_case_insensitive_function_names() -> None:
    assert scalar("SQRT(16) + Abs(-1) + pI()") == pytest.approx(5.0 + math.pi)


def test_check_references() -> None:
    f = parse("$0 + $7 * @9")
    f.check_references(range(10))
    with pytest.raises(FormulaError, match=r"column 6: \$7 names no metric"):
        f.check_references({0, 9})


def test_constant_formula_broadcasts() -> None:
    out = parse("2*pi()").evaluate(lambda n: np.zeros(4), lambda n: 0.0, 4)
    assert out.shape == (4,)
    assert np.allclose(out, 2 * math.pi)


def test_point_column_of_the_wrong_length_is_reported() -> None:
    with pytest.raises(CallpathError, match="metric 0 gave"):
        parse("$0").evaluate(lambda n: np.zeros(3), lambda n: 0.0, 4)


# ---- functions -----------------------------------------------------------------------------

def _round_java(x: float) -> float:
    return float(math.floor(x + 0.5))


FUNCTION_CASES: list[tuple[str, float]] = [
    ("min(3, -1, 2)", -1.0), ("min(5)", 5.0),
    ("max(3, -1, 2)", 3.0), ("max(5)", 5.0),
    ("sum(1, 2, 3, 4)", 10.0), ("sum(7)", 7.0),
    ("avg(1, 2, 3, 4)", 2.5), ("avg(7)", 7.0),
    ("stdev(2, 4, 4, 4, 5, 5, 7, 9)", statistics.stdev([2, 4, 4, 4, 5, 5, 7, 9])),
    ("stdev(1, 2)", statistics.stdev([1, 2])),
    ("pi()", math.pi), ("e()", math.e),
    ("sin(0.5)", math.sin(0.5)), ("cos(0.5)", math.cos(0.5)), ("tan(0.5)", math.tan(0.5)),
    ("asin(0.5)", math.asin(0.5)), ("acos(0.5)", math.acos(0.5)), ("atan(2)", math.atan(2)),
    ("sinh(1.5)", math.sinh(1.5)), ("cosh(1.5)", math.cosh(1.5)), ("tanh(1.5)", math.tanh(1.5)),
    ("asinh(2)", math.asinh(2)), ("acosh(2)", math.acosh(2)), ("atanh(0.5)", math.atanh(0.5)),
    ("sqrt(2)", math.sqrt(2)), ("abs(-3.5)", 3.5),
    ("ceil(2.1)", 3.0), ("ceil(-2.1)", -2.0), ("floor(2.9)", 2.0), ("floor(-2.1)", -3.0),
    ("exp(2)", math.exp(2)), ("ln(10)", math.log(10)),
    ("lg(1024)", 10.0), ("lg(10)", math.log2(10)),
    ("log(1000)", 3.0), ("log(81, 3)", math.log(81, 3)), ("log(2, 10)", math.log10(2)),
    ("sign(-4)", -1.0), ("sign(0)", 0.0), ("sign(0.1)", 1.0),
    ("round(2.5)", _round_java(2.5)), ("round(-2.5)", _round_java(-2.5)),
    ("round(2.4999)", 2.0), ("round(-0.6)", -1.0),
    ("fact(0)", 1.0), ("fact(1)", 1.0), ("fact(10)", float(math.factorial(10))),
    ("fact(5.9)", 120.0), ("fact(170)", float(math.factorial(170))),
    ("pow(2, 10)", 1024.0), ("pow(9, 0.5)", 3.0),
    ("mod(7, 3)", math.fmod(7, 3)), ("mod(-7, 3)", math.fmod(-7, 3)),
    ("mod(7.5, 2)", math.fmod(7.5, 2)),
    ("combin(10, 3)", float(math.comb(10, 3))), ("combin(52, 5)", float(math.comb(52, 5))),
    ("combin(60, 30)", float(math.comb(60, 30))), ("combin(3, 5)", 0.0),
    ("combin(5, 0)", 1.0), ("combin(6.7, 2.9)", float(math.comb(6, 2))),
]


@pytest.mark.parametrize(("text", "expected"), FUNCTION_CASES)
def test_functions(text: str, expected: float) -> None:
    assert scalar(text) == pytest.approx(expected, rel=1e-12)


def test_every_function_is_tested() -> None:
    tested = {t.split("(")[0] for t, _ in FUNCTION_CASES}
    assert tested | {"rand"} == set(FUNCTIONS)  # rand: test_rand_gives_one_value_per_node


def test_rand_gives_one_value_per_node_in_range() -> None:
    out = parse("rand()").evaluate(lambda n: np.zeros(1000), lambda n: 0.0, 1000)
    assert ((out >= 0) & (out < 1)).all()
    assert len(np.unique(out)) > 900


ARITY_CASES = [
    ("pi(1)", "pi() takes no arguments but is given 1"),
    ("rand(1, 2)", "rand() takes no arguments but is given 2"),
    ("sin()", "sin() takes 1 argument but is given 0"),
    ("SQRT(1, 2)", "SQRT() takes 1 argument but is given 2"),
    ("pow(2)", "pow() takes 2 arguments but is given 1"),
    ("combin(1, 2, 3)", "combin() takes 2 arguments but is given 3"),
    ("mod(1)", "mod() takes 2 arguments but is given 1"),
    ("log()", "log() takes 1 to 2 arguments but is given 0"),
    ("log(1, 2, 3)", "log() takes 1 to 2 arguments but is given 3"),
    ("max()", "max() takes at least 1 argument but is given 0"),
    ("stdev()", "stdev() takes at least 1 argument but is given 0"),
]


@pytest.mark.parametrize(("text", "message"), ARITY_CASES)
def test_wrong_arity_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(FormulaError) as exc:
        parse(text)
    assert str(exc.value) == f"formula {text!r}, column 1: {message}"


@pytest.mark.parametrize("text", [
    "1/0", "0/0", "$0/$1", "sqrt(-1)", "ln(0)", "ln(-1)", "log(-5)", "lg(0)", "log(8, 1)",
    "acos(2)", "asin(-3)", "atanh(1)", "acosh(0.5)", "mod(5, 0)", "fact(-1)", "exp(1000)",
    "pow(-8, 1/3)", "(-2)^0.5", "10^400", "fact(171)", "combin(-3, 2)", "stdev(4)",
    "1/0 + 5", "max(1, 1/0)", "abs(sqrt(-1))", "1 ^ (0/0)", "(0/0) ^ 0", "pow(1, 0/0)",
    "(($0 ^ $0) ^ ($0 / $0))",
])
def test_undefined_results_are_empty_cells_without_warnings(text: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        value = scalar(text)
        column = parse(text).evaluate(lambda n: np.array([1.0, 0.0, -1.0]), lambda n: 0.0, 3)
    assert math.isnan(value)
    assert column.dtype == np.float64 and column.shape == (3,)
    assert not np.isinf(column).any()


# ---- errors with positions -----------------------------------------------------------------

ERROR_CASES = [
    ("", None, "the formula is empty"),
    ("   ", None, "the formula is empty"),
    ("1+", 3, "expected a number, $n, @n, a function call or '(' but found the end"),
    ("(1+2", 5, "expected an operator or ')' to close the '(' at column 1"),
    ("1+2)", 4, "this ')' has no '('"),
    ("2 3", 3, "expected an operator or the end of the formula but found '3'"),
    ("$0 $1", 4, "but found '$1'"),
    ("2x", 2, "but found 'x'"),
    ("1e", 3, "expected the digits of an exponent"),
    ("1e+x", 4, "expected the digits of an exponent but found 'x'"),
    ("$", 2, "expected a metric number after '$'"),
    ("@a", 2, "expected a metric number after '@' but found 'a'"),
    ("3 # 4", 3, "unexpected character '#'"),
    ("foo(1)", 1, "unknown function 'foo'"),
    ("1 + x", 5, "unknown name 'x'"),
    ("pi", 3, "expected '(' after the function name 'pi'"),
    ("max(1, )", 8, "expected a number"),
    ("max(1 2)", 7, "expected an operator, ',' or ')' in the call of max() opened at column 4"),
    ("--1", 2, "but found '-'"),
    ("2*/3", 3, "but found '/'"),
    ("1e999", 1, "out of range"),
    ("(" * 150 + "1" + ")" * 150, 101, "nested more than 100 levels"),
    ("1,2", 2, "but found ','"),
    ("sin(1))", 7, "this ')' has no '('"),
    ("$1²", 3, "unexpected character '²'"),
]


@pytest.mark.parametrize(("text", "column", "fragment"), ERROR_CASES)
def test_errors_name_formula_column_and_expectation(text: str, column: int | None,
                                                    fragment: str) -> None:
    with pytest.raises(FormulaError) as exc:
        parse(text)
    err = exc.value
    msg = str(err)
    assert "\n" not in msg
    assert msg.startswith(f"formula {text!r}")
    assert err.column == column
    if column is not None:
        assert f", column {column}:" in msg
    assert fragment in msg


def test_formula_error_is_a_callpath_error() -> None:
    assert issubclass(FormulaError, CallpathError)


def test_long_flat_formulas_do_not_recurse() -> None:
    text = "+".join(["$0"] * 5000)
    out = parse(text).evaluate(lambda n: np.ones(2), lambda n: 0.0, 2)
    assert out.tolist() == [5000.0, 5000.0]


# ---- fuzzing -------------------------------------------------------------------------------

FORMULA_CHARS = "0123456789.eE+-*/^(),$@ \tabcdfgilmnopqrstuvxAMSZ_#\n²é"


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(alphabet=FORMULA_CHARS, max_size=40), st.text(max_size=30)))
def test_random_strings_raise_only_formula_errors(text: str) -> None:
    try:
        f = parse(text)
    except FormulaError as err:
        assert "\n" not in str(err)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = f.evaluate(lambda n: np.array([0.0, 1.5, -2.0]), lambda n: 3.0, 3)
        f.evaluate_scalar(lambda n: 2.0)
    assert out.shape == (3,)


# Random expression trees, rendered fully parenthesised and evaluated per element with Python's
# own float arithmetic: an independent reference for the vectorised evaluator.

Ref = Callable[[list[float]], float]


class _Undefined(Exception):
    pass


def _guard(fn: Callable[[], float]) -> float:
    """Python's result, with every undefined intermediate (error, complex, infinity) raised."""
    try:
        v = fn()
    except (ZeroDivisionError, ValueError, OverflowError) as e:
        raise _Undefined from e
    if isinstance(v, complex) or math.isinf(v):
        raise _Undefined
    return float(v)


def _div(a: float, b: float) -> float:
    if b == 0:
        raise _Undefined
    return _guard(lambda: a / b)


def _pow(a: float, b: float) -> float:
    return _guard(lambda: a ** b)


LEAVES = st.one_of(
    st.integers(0, 3).map(lambda n: (f"${n}", lambda row, n=n: row[n])),
    st.integers(0, 3).map(lambda n: (f"@{n}", lambda row, n=n: 10.0 * (n + 1))),
    st.floats(0.0, 1e3, allow_nan=False).map(lambda x: (repr(x), lambda row, x=x: x)),
)

UNARY = {
    "sqrt": lambda a: _guard(lambda: math.sqrt(a)),
    "abs": abs,
    "ln": lambda a: _guard(lambda: math.log(a)),
    "exp": lambda a: _guard(lambda: math.exp(a)),
    "floor": lambda a: float(math.floor(a)),
    "sign": lambda a: float((a > 0) - (a < 0)),
}
BINARY: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: _guard(lambda: a + b), "-": lambda a, b: _guard(lambda: a - b),
    "*": lambda a, b: _guard(lambda: a * b), "/": _div, "^": _pow}
NARY: dict[str, Callable[[list[float]], float]] = {
    "min": min, "max": max, "sum": math.fsum, "avg": lambda v: math.fsum(v) / len(v)}


def _extend(children: st.SearchStrategy[tuple[str, Ref]]) -> st.SearchStrategy[tuple[str, Ref]]:
    def binary(op: str, a: tuple[str, Ref], b: tuple[str, Ref]) -> tuple[str, Ref]:
        return (f"({a[0]} {op} {b[0]})", lambda row: BINARY[op](a[1](row), b[1](row)))

    def unary(name: str, a: tuple[str, Ref]) -> tuple[str, Ref]:
        return (f"{name}({a[0]})", lambda row: _guard(lambda: UNARY[name](a[1](row))))

    def neg(a: tuple[str, Ref]) -> tuple[str, Ref]:
        return (f"-({a[0]})", lambda row: -a[1](row))

    def nary(name: str, args: list[tuple[str, Ref]]) -> tuple[str, Ref]:
        text = f"{name}({', '.join(a[0] for a in args)})"
        return (text, lambda row: _guard(lambda: NARY[name]([a[1](row) for a in args])))

    return st.one_of(
        st.builds(binary, st.sampled_from(sorted(BINARY)), children, children),
        st.builds(unary, st.sampled_from(sorted(UNARY)), children),
        st.builds(neg, children),
        st.builds(nary, st.sampled_from(sorted(NARY)), st.lists(children, min_size=1,
                                                                  max_size=3)),
    )


EXPRESSIONS = st.recursive(LEAVES, _extend, max_leaves=12)


@settings(max_examples=200, deadline=None)
@given(EXPRESSIONS, st.lists(st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=4,
                                      max_size=4), min_size=1, max_size=20))
def test_vectorised_evaluation_matches_a_per_element_reference(
        expr: tuple[str, Ref], rows: list[list[float]]) -> None:
    text, ref = expr
    table = np.array(rows, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = parse(text).evaluate(lambda n: table[:, n], lambda n: 10.0 * (n + 1), len(rows))
    for i, row in enumerate(rows):
        try:
            want = ref(row)
            if not math.isfinite(want):
                want = math.nan
        except _Undefined:
            want = math.nan
        # sums may cancel (1 + 1e-227 - 1): numpy adds in order, the reference exactly, so
        # allow an absolute error at the scale of the operands
        scale = max([1.0, *(abs(x) for x in row if math.isfinite(x))])
        assert same(float(got[i]), want) or math.isclose(
            float(got[i]), want, rel_tol=1e-12, abs_tol=1e-12 * scale), (text, row, got[i], want)
