"""The viewer's own error type, in a module of its own so that every handler module (api,
traces, lines_api, ...) can raise it without importing another handler module: view/api.py
and view/traces.py used to import each other for it."""

from __future__ import annotations

from callpath.errors import CallpathError


class NotFound(CallpathError):
    """Something that does not exist (no source recorded, no traces): a 404."""
