"""The viewer's security model: who may talk to the server and which files it serves.

- Bound to a loopback address (the default), the server only answers requests whose Host
  header names a loopback host (``localhost``, ``127.0.0.1``, ``[::1]``), so that a web page
  cannot reach it through DNS rebinding.
- Bound to any other address, every request must carry the random access token printed with
  the URL: query ``token=``, header ``X-Callpath-Token`` or the ``callpath_token`` cookie that
  ``GET /?token=`` sets. Tokens are compared in constant time.
- Static files are served from ``view/static/`` only: the raw request path must not contain a
  percent sign, a backslash, a NUL, a ``..`` segment or an absolute path, and the resolved
  file (symlinks followed) must lie inside the static directory.
- State-changing requests (POST) must be JSON and, when the browser says where they come
  from (``Origin``), come from the server's own origin.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from pathlib import Path

TOKEN_COOKIE = "callpath_token"
TOKEN_HEADER = "x-callpath-token"
LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}


def new_token() -> str:
    return secrets.token_urlsafe(24)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def token_matches(given: str | None, token: str) -> bool:
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"), token.encode())


def host_of(header: str) -> str:
    """The host part of a Host header (``[::1]:8765`` -> ``::1``)."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def static_file(static_dir: Path, raw_path: bytes, rel: str) -> Path | None:
    """The file under ``static_dir`` that ``rel`` names, or None when the request is refused
    or names nothing. ``raw_path`` is the undecoded request path: encoded forms are refused
    before any decoding could turn them into separators or dots."""
    if b"%" in raw_path or b"\\" in raw_path or b"\x00" in raw_path:
        return None
    if not rel or "\x00" in rel or "\\" in rel or rel.startswith("/") or ":" in rel:
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    try:
        root = static_dir.resolve(strict=True)
        cand = (root / rel).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    try:
        cand.relative_to(root)
    except ValueError:
        return None
    return cand if cand.is_file() else None
