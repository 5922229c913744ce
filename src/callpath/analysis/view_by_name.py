"""Choosing a view by name: the one entry point notebooks, the CLI and the server use."""

from __future__ import annotations

from callpath.analysis.bottomup import BottomUpView
from callpath.analysis.flat import FlatView
from callpath.analysis.source import TreeSource
from callpath.analysis.topdown import VIEW_NAMES, TopDownView, View
from callpath.errors import CallpathError


def make_view(name: str, source: TreeSource) -> View:
    """``top-down``, ``bottom-up`` or ``flat`` over a tree source."""
    if name == "top-down":
        return TopDownView(source)
    if name == "bottom-up":
        return BottomUpView(source)
    if name == "flat":
        return FlatView(source)
    raise CallpathError(f"unknown view {name!r}: expected one of {', '.join(VIEW_NAMES)}")
