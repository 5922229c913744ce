"""The JSON request body that every POST handler reads, and the 404 error (raised by the
engine, :class:`callpath.errors.NotFound`), in a module of their own so that every handler
module (api, traces_api, lines_api, notes_api, ...) can use them without importing another
handler module."""

from __future__ import annotations

import json
from typing import Any

from callpath.errors import CallpathError
from callpath.errors import NotFound as NotFound  # a 404; the engine raises it


def json_body(body: bytes) -> Any:
    """A request's JSON body; anything else is a one-line error (a 400)."""
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CallpathError(f"request body: expected JSON ({e})") from None
