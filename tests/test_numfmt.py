"""Display formats of metric values: scientific, percent, printf, empty cells, annotation."""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callpath.analysis.numfmt import NumberFormatError, format_column, parse_format
from callpath.errors import CallpathError


def test_default_is_scientific_with_three_significant_digits() -> None:
    v = np.array([12345.678, 0.000123456, -98765.4, 1.0, 0.0, 9.999e99])
    assert format_column(v) == ["1.23e+04", "1.23e-04", "-9.88e+04", "1.00e+00", "0",
                                "1.00e+100"]
    # zero reads as in measured columns (a delta column printed 0.00e+00), -0.0 too; a
    # printf format prints exactly what it says
    assert format_column([-0.0]) == ["0"]
    assert format_column([0.0], "%.2e") == ["0.00e+00"]
    assert format_column(v, "scientific") == format_column(v, None) == format_column(v, "")


def test_percent_has_two_decimals_and_takes_the_value_as_a_percentage() -> None:
    assert format_column([12.3415678, 100.0, 0.005], "percent") == ["12.34%", "100.00%", "0.01%"]
    assert format_column([12.3415678], "Percent") == ["12.34%"]


@pytest.mark.parametrize(("spec", "value", "expected"), [
    ("%6.2f", 3.14159, "  3.14"),
    ("%.3e", 12345.678, "1.235e+04"),
    ("%d", 41.6, "42"),
    ("%5d", -3.2, "   -3"),
    ("%x", 255.0, "ff"),
    ("%#o", 8.0, "0o10"),
    ("%-8.1f|", 2.25, "2.2     |"),
    ("%+.1f", 2.0, "+2.0"),
    ("%08.2f", -1.5, "-0001.50"),
    ("%g", 0.0001, "0.0001"),
    ("%G", 1e-10, "1E-10"),
    ("%ld", 7.0, "7"),
    ("%lf", 7.0, "7.000000"),
    ("%u", 7.0, "7"),
    ("time %.1f ms", 3.25, "time 3.2 ms"),
    ("%.1f%%", 45.67, "45.7%"),
    ("%% %d %%", 5.0, "% 5 %"),
])
def test_custom_printf_formats(spec: str, value: float, expected: str) -> None:
    assert format_column([value], spec) == [expected]
    assert parse_format(spec).format(value) == expected


def _libc_snprintf() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


@pytest.mark.parametrize("spec", ["%6.2f", "%.3e", "%g", "%+010.4f", "%-12.5E", "%.0f", "%#.3g",
                                  "%d", "%08d", "%x", "%-6X", "%o"])
def test_printf_formats_agree_with_the_c_library(spec: str) -> None:
    libc = _libc_snprintf()
    if libc is None:
        pytest.skip("no C library found to compare printf output with")
    buf = ctypes.create_string_buffer(256)
    fmt = parse_format(spec)
    for v in (0.0, 1.0, 3.14159, 12345.678, 0.000123, 99.5, 1e15, 7.0):
        if fmt.integer:
            c_spec = spec[:-1] + "l" + spec[-1]  # a C long, as Python's ints are not truncated
            libc.snprintf(buf, 256, c_spec.encode(), ctypes.c_long(round(v)))
        else:
            libc.snprintf(buf, 256, spec.encode(), ctypes.c_double(v))
        assert fmt.format(v) == buf.value.decode(), (spec, v)


@pytest.mark.parametrize("fmt", ["default", "percent", "%6.2f", "%d"])
def test_nan_and_infinities_are_empty_cells(fmt: str) -> None:
    out = format_column(np.array([np.nan, np.inf, -np.inf, 1.0]), fmt)
    assert out[:3] == ["", "", ""]
    assert out[3] != ""


def test_percent_annotation() -> None:
    v = np.array([12345.678, 27000.0, 0.0, np.nan])
    assert format_column(v, percent_of=27000.0) == ["1.23e+04 45.72%", "2.70e+04 100.00%",
                                                     "0", ""]
    assert format_column([5.0], "%.1f", percent_of=-10.0) == ["5.0 -50.00%"]


@pytest.mark.parametrize("reference", [0.0, float("nan"), float("inf")])
def test_percent_annotation_without_a_usable_reference_is_left_out(reference: float) -> None:
    assert format_column([1.0, 2.0], percent_of=reference) == ["1.00e+00", "2.00e+00"]


def test_large_column() -> None:
    v = np.linspace(0, 1e6, 100_001)
    out = format_column(v, "%.1f")
    assert len(out) == v.size
    assert out[-1] == "1000000.0" and out[0] == "0.0"


@pytest.mark.parametrize(("spec", "fragment"), [
    ("%s", "column 2: '%s' is not a numeric conversion"),
    ("%n", "'%n' is not a numeric conversion"),
    ("%c", "'%c' is not a numeric conversion"),
    ("%r", "'%r' is not a numeric conversion"),
    ("%a", "'%a' is not a numeric conversion"),
    ("%10s", "column 4: '%s' is not a numeric conversion"),
    ("%*d", "column 2: '*' is not allowed"),
    ("%.*f", "column 3: '*' is not allowed"),
    ("%1$d", "column 3: '$' is not allowed"),
    ("%,d", "',' is not allowed"),
    ("%d and %f", "has 2 numeric conversions, expected exactly one"),
    ("100%%", "has 0 numeric conversions"),
    ("%", "column 1: the conversion starting here is incomplete"),
    ("value %5.", "column 7: the conversion starting here is incomplete"),
    ("%1000d", "width and precision must be at most 100"),
    ("%.200f", "width and precision must be at most 100"),
    ("fixed", "expected 'default', 'percent' or a printf format"),
])
def test_invalid_formats_are_clear_errors(spec: str, fragment: str) -> None:
    with pytest.raises(NumberFormatError) as exc:
        parse_format(spec)
    msg = str(exc.value)
    assert msg.startswith(f"display format {spec!r}")
    assert fragment in msg
    assert "\n" not in msg
    assert isinstance(exc.value, CallpathError)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="%0123456789.-+ #*$,lhLqjztdiouxXeEfFgGsncpra%%abc ", max_size=12),
       st.floats(allow_nan=True, allow_infinity=True))
def test_random_formats_fail_cleanly_or_format(spec: str, value: float) -> None:
    try:
        fmt = parse_format(spec)
    except NumberFormatError:
        return
    text = fmt.format(value)
    assert isinstance(text, str)
    if not math.isfinite(value):
        assert text == ""
