"""Option value types shared by the commands: argparse reports their refusal as one line
(``callpath X: error: argument --bin: expected a positive number of lines, got '0'``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["int_range"]


def int_range(what: str, lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for an integer in ``lo..hi`` (no upper bound when ``hi`` is None);
    ``what`` names what was expected in the message."""
    def conv(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
        return v
    return conv
