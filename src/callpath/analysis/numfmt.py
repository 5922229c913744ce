"""Display formats of metric values, as hpcviewer offers them for derived metrics.

Three formats, named by a short spec string so that they persist as plain text:

- ``"default"`` (also ``""`` or ``"scientific"``): scientific notation with three significant
  digits, ``1.23e+04`` (printf ``%.2e``), and zero as ``0`` (as measured columns print it);
- ``"percent"``: the value with two decimals and a percent sign, ``12.34%`` -- the value is
  taken to be a percentage already, as in hpcviewer (12.3415678 shows as ``12.34%``);
- a printf format such as ``"%6.2f"``, ``"%.3e"`` or ``"%d"``, with any literal text around it:
  exactly one numeric conversion (``d i u o x X e E f F g G``), optional flags ``#0- +``, width
  and precision (each at most 100), C length modifiers (``l``, ``ll``, ``h``...) accepted and
  ignored; ``%%`` is a literal percent sign. ``%s``, ``%n``, ``%c``, ``*`` widths and
  positional arguments are refused: a format is user input, and only numbers are printed.
  Integer conversions print the value rounded to the nearest integer.

A value that is not a finite number (an undefined derived value) renders as an empty string.
The optional annotation appends the value as a percentage of a reference (hpcviewer: the formula
applied to the aggregates): ``1.23e+04 45.67%``; with no usable reference (0 or NaN) the
annotation is left out rather than printing a meaningless number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from callpath.errors import CallpathError

DEFAULT = "default"
PERCENT = "percent"
INT_CONVERSIONS = "diuoxX"
FLOAT_CONVERSIONS = "eEfFgG"
LENGTH_MODIFIERS = ("hh", "ll", "h", "l", "L", "q", "j", "z", "t")
MAX_FIELD = 100


class NumberFormatError(CallpathError):
    """A display format that is not one of the accepted forms."""


@dataclass(frozen=True)
class ValueFormat:
    """A validated display format: ``spec`` as the user wrote it, ``pattern`` for ``%``."""

    spec: str
    pattern: str
    integer: bool = False

    def format(self, value: float) -> str:
        """One value as text; empty for NaN and infinities."""
        return self.format_column(np.array([value], dtype=np.float64))[0]

    def format_column(self, values: npt.ArrayLike, percent_of: float | None = None) -> list[str]:
        """Every value of a column as text, in order; see :func:`format_column`."""
        arr = np.asarray(values, dtype=np.float64).ravel()
        finite = np.isfinite(arr)
        shown = np.where(finite, arr, 0.0)
        items = np.rint(shown).astype(object) if self.integer else shown.tolist()
        if self.integer:
            items = [int(v) for v in items]
        pat = self.pattern
        out = [pat % v if ok else "" for v, ok in zip(items, finite.tolist(), strict=True)]
        # the default format prints zero as every measured column does, "0" and no
        # percentage (a comparison's delta column printed "0.00e+00" beside the base
        # column's "0"); a printf format the user chose prints exactly what it says
        plain = (arr == 0.0).tolist() if self.spec == DEFAULT else [False] * len(out)
        if self.spec == DEFAULT:
            out = ["0" if z else s for s, z in zip(out, plain, strict=True)]
        if percent_of is not None and np.isfinite(percent_of) and percent_of != 0.0:
            with np.errstate(all="ignore"):
                pct = (arr / percent_of * 100.0).tolist()
            out = [f"{s} {p:.2f}%" if ok and not z else s
                   for s, p, ok, z in zip(out, pct, finite.tolist(), plain, strict=True)]
        return out


def parse_format(spec: str | ValueFormat | None) -> ValueFormat:
    """Validate a display format spec (see the module docstring) into a :class:`ValueFormat`."""
    if isinstance(spec, ValueFormat):
        return spec
    if spec is None or spec.strip().lower() in ("", DEFAULT, "scientific"):
        return ValueFormat(DEFAULT, "%.2e")
    if spec.strip().lower() == PERCENT:
        return ValueFormat(PERCENT, "%.2f%%")
    if "%" not in spec:
        raise NumberFormatError(f"display format {spec!r}: expected 'default', 'percent' or a "
                                "printf format with one numeric conversion such as '%6.2f'")
    return _parse_printf(spec)


def _parse_printf(spec: str) -> ValueFormat:
    def bad(col: int, msg: str) -> NumberFormatError:
        return NumberFormatError(f"display format {spec!r}, column {col}: {msg}")

    out: list[str] = []
    conversions = 0
    integer = False
    i, n = 0, len(spec)
    while i < n:
        c = spec[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        start = i
        i += 1
        if i < n and spec[i] == "%":
            out.append("%%")
            i += 1
            continue
        j = i
        while j < n and spec[j] in "#0- +":
            j += 1
        flags = spec[i:j]
        k = j
        while k < n and spec[k].isascii() and spec[k].isdigit():
            k += 1
        width = spec[j:k]
        prec = ""
        if k < n and spec[k] == ".":
            m = k + 1
            while m < n and spec[m].isascii() and spec[m].isdigit():
                m += 1
            prec = spec[k:m]
            k = m
        if k < n and spec[k] in "*$',":
            raise bad(k + 1, f"{spec[k]!r} is not allowed in a conversion: expected flags "
                             "'#0- +', a width, a precision and one of d i u o x X e E f F g G")
        for mod in LENGTH_MODIFIERS:
            if spec.startswith(mod, k):
                k += len(mod)
                break
        if k >= n:
            raise bad(start + 1, "the conversion starting here is incomplete: expected one of "
                                 "d i u o x X e E f F g G")
        conv = spec[k]
        if conv not in INT_CONVERSIONS + FLOAT_CONVERSIONS:
            raise bad(k + 1, f"'%{conv}' is not a numeric conversion: expected one of "
                             "d i u o x X e E f F g G")
        if (width and int(width) > MAX_FIELD) or (len(prec) > 1 and int(prec[1:]) > MAX_FIELD):
            raise bad(start + 1, f"width and precision must be at most {MAX_FIELD}")
        conversions += 1
        integer = conv in INT_CONVERSIONS
        out.append("%" + flags + width + prec + ("d" if conv == "u" else conv))
        i = k + 1
    if conversions != 1:
        raise NumberFormatError(f"display format {spec!r}: has {conversions} numeric "
                                "conversions, expected exactly one (such as '%6.2f')")
    return ValueFormat(spec, "".join(out), integer)


def format_column(values: npt.ArrayLike, fmt: str | ValueFormat | None = DEFAULT,
                  percent_of: float | None = None) -> list[str]:
    """Render a column of values with a display format.

    ``percent_of``, when given, is the reference of the percent annotation (for a derived
    metric, its formula evaluated on the aggregates): each cell becomes ``value pct%``."""
    return parse_format(fmt).format_column(values, percent_of)
