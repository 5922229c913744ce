"""Trace view endpoints (placeholder until the sampler lands)."""

from __future__ import annotations

from typing import Any

from callpath.view.api import NotFound, Params
from callpath.view.session import Database


def _none(db: Database, params: Params, body: bytes) -> Any:
    raise NotFound(f"{db.name}: trace endpoints are not available yet")


meta = frame = depth = callpath = summary = stats = _none
