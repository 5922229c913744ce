"""The viewer's own error type, and the JSON request body that every POST handler reads, in a
module of its own so that every handler module (api, traces, lines_api, notes, ...) can use
them without importing another handler module: view/api.py and view/traces.py used to import
each other for the error."""

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
