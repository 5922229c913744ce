"""Comparing two structures column by column (tests of parallel and batched building)."""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from callpath.structure.model import Structure


def assert_identical(a: Structure, b: Structure) -> None:
    """Every field of ``a`` equals ``b``'s: arrays in dtype and value, the rest by ``==``."""
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        else:
            assert x == y, f.name
