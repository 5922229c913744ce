"""The one exception type users see.

Every mistake a user can make (a bad path, a corrupt or truncated file, malformed XML, an unknown
metric) raises :class:`CallpathError` with a message that names the thing and says what was
expected. The command line prints that message on one line and exits with status 2, so a user
never sees a traceback for their own mistake; anything else escaping is a bug in callpath.
"""

from __future__ import annotations


class CallpathError(Exception):
    """A user-facing error: ``str(err)`` is one line naming the culprit and the expectation."""


class FormatError(CallpathError):
    """A file on disk is not what its format promises (bad magic, truncation, bad offset)."""

    def __init__(self, path: object, message: str, offset: int | None = None) -> None:
        where = f"{path}" if offset is None else f"{path} at offset {offset:#x}"
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.offset = offset


class NotFound(CallpathError):
    """Something asked for that does not exist (no source recorded for a scope, no traces in
    the database): the viewer answers it with a 404."""
