"""The Lines tab's JSON API (PerfVisS): the endpoints are being written (issue 18)."""

from __future__ import annotations

from typing import Any

GETS: dict[str, Any] = {}
