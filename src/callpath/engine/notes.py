"""Notes on the data: text pinned to a calling context, a source line or a trace interval,
saved with the database so that a discussion outlives the session it started in.

The file is ``<DBDIR>/callpath/notes.json``, beside the saved derived metrics, versioned and
written atomically like them (:mod:`callpath.formats.sidecar`)::

    {"format": "callpath-notes", "version": 1, "notes": [
      {"id": "n3f2a...", "author": "Ana", "text": "why so slow?", "created": "2026-...Z",
       "anchor": {"kind": "node", "view": "top-down", "key": "t42", "label": "main"}}]}

Anchors: ``node`` (a view and a node key, the keys the viewer already uses, which resolve
after a restart, plus the label at the time for readers without a viewer), ``line`` (file and
line number) and ``interval`` (trace time ``t0``..``t1`` in the database's time unit and
execution-context rows ``c0``..``c1``). Texts and names are stored as given and are only ever
rendered as text (``textContent`` in the viewer), never as markup.

``callpath report DB --notes`` lists them (:func:`render_notes`); the viewer reads and
writes them through :mod:`callpath.view.notes_api`.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from callpath.errors import CallpathError, FormatError
from callpath.formats import sidecar

FILE_FORMAT = "callpath-notes"
VERSION = 1
DB_RELPATH = sidecar.NOTES
MAX_TEXT = 4000
MAX_NOTES = 5000
MAX_FIELD = 4096
VIEWS = ("top-down", "bottom-up", "flat")
_lock = threading.Lock()


def store_path(dbdir: str | os.PathLike[str]) -> Path:
    return sidecar.path(dbdir, DB_RELPATH)


def load_notes(dbdir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The notes saved with a database (empty when there are none); a damaged file is a
    one-line :class:`FormatError`."""
    path = store_path(dbdir)
    if not path.is_file():
        return []
    doc = sidecar.read_document(path, FILE_FORMAT, VERSION, "a notes file")
    if not isinstance(doc.get("notes"), list):
        raise FormatError(path, "\"notes\" must be a list")
    out = []
    for i, n in enumerate(doc["notes"]):
        try:
            out.append(check_note(n))
        except CallpathError as e:
            raise FormatError(path, f"note {i}: {e}") from None
    return out


def _save(dbdir: str | os.PathLike[str], notes: list[dict[str, Any]]) -> Path:
    path = store_path(dbdir)
    text = json.dumps({"format": FILE_FORMAT, "version": VERSION, "notes": notes},
                      indent=1, ensure_ascii=False) + "\n"
    try:
        sidecar.write_atomically(path, text)
    except OSError as e:
        raise CallpathError(f"cannot save the notes: {path}: {e.strerror}") from None
    return path


def _text(v: Any, what: str, limit: int = MAX_FIELD, empty: bool = False) -> str:
    if not isinstance(v, str) or (not empty and not v.strip()):
        raise CallpathError(f"{what}: expected a non-empty string")
    if len(v) > limit:
        raise CallpathError(f"{what}: at most {limit} characters, got {len(v)}")
    return v


def _int(v: Any, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise CallpathError(f"{what}: expected an integer")
    return v


def check_anchor(a: Any) -> dict[str, Any]:
    if not isinstance(a, dict):
        raise CallpathError("\"anchor\": expected an object with \"kind\" node, line or "
                            "interval")
    kind = a.get("kind")
    if kind == "node":
        view = a.get("view")
        if view not in VIEWS:
            raise CallpathError(f"anchor \"view\": expected one of {', '.join(VIEWS)}")
        return {"kind": kind, "view": view, "key": _text(a.get("key"), "anchor \"key\""),
                "label": _text(a.get("label", ""), "anchor \"label\"", empty=True)}
    if kind == "line":
        line = _int(a.get("line"), "anchor \"line\"")
        if line < 1:
            raise CallpathError("anchor \"line\": expected a line number >= 1")
        return {"kind": kind, "file": _text(a.get("file"), "anchor \"file\""), "line": line}
    if kind == "interval":
        t0, t1 = _int(a.get("t0"), "anchor \"t0\""), _int(a.get("t1"), "anchor \"t1\"")
        c0, c1 = _int(a.get("c0"), "anchor \"c0\""), _int(a.get("c1"), "anchor \"c1\"")
        if t1 < t0 or c1 <= c0 or c0 < 0:
            raise CallpathError("anchor: expected t0 <= t1 and 0 <= c0 < c1")
        return {"kind": kind, "t0": t0, "t1": t1, "c0": c0, "c1": c1}
    raise CallpathError("anchor \"kind\": expected node, line or interval")


def check_note(n: Any) -> dict[str, Any]:
    if not isinstance(n, dict):
        raise CallpathError("expected a note object")
    return {"id": _text(n.get("id"), "\"id\"", 40), "author": _text(n.get("author"),
            "\"author\"", 40), "text": _text(n.get("text"), "\"text\"", MAX_TEXT),
            "created": _text(n.get("created"), "\"created\"", 40),
            "anchor": check_anchor(n.get("anchor"))}


def add_note(dbdir: str | os.PathLike[str], doc: Any) -> dict[str, Any]:
    """Validate a new note (``{"author", "text", "anchor"}``), give it an id and a time,
    append it to the database's notes; returns the note as saved."""
    if not isinstance(doc, dict):
        raise CallpathError("request body: expected {\"author\", \"text\", \"anchor\"}")
    note = check_note({**doc, "id": "n" + secrets.token_hex(6),
                       "created": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")})
    with _lock:
        notes = load_notes(dbdir)
        if len(notes) >= MAX_NOTES:
            raise CallpathError(f"at most {MAX_NOTES} notes per database")
        notes.append(note)
        _save(dbdir, notes)
    return note


def delete_note(dbdir: str | os.PathLike[str], note_id: Any) -> bool:
    if not isinstance(note_id, str):
        raise CallpathError("request body: expected {\"id\": \"...\"}")
    with _lock:
        notes = load_notes(dbdir)
        kept = [n for n in notes if n["id"] != note_id]
        if len(kept) == len(notes):
            return False
        _save(dbdir, kept)
    return True


def anchor_text(a: dict[str, Any]) -> str:
    if a["kind"] == "node":
        return f"{a['view']} {a['label'] or a['key']} [{a['key']}]"
    if a["kind"] == "line":
        return f"{a['file']}:{a['line']}"
    return f"trace {a['t0']}..{a['t1']}, contexts {a['c0']}..{a['c1'] - 1}"


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f) if c not in (0x09, 0x0a)}


def _plain(text: str) -> str:
    """Text for a terminal: control characters (an escape sequence typed into a note) are
    shown as ``\\xNN`` instead of acting on the terminal."""
    return text.translate(_CONTROL)


def render_notes(notes: list[dict[str, Any]], out: TextIO, fmt: str = "text") -> None:
    """``callpath report DB --notes``: one block per note, oldest first (or JSON)."""
    if fmt == "json":
        json.dump(notes, out, indent=1, ensure_ascii=False)
        out.write("\n")
        return
    if not notes:
        out.write("no notes\n")
        return
    for n in notes:
        head = f"{n['created']}  {n['author']}  on {anchor_text(n['anchor'])}"
        out.write(_plain(head.replace("\n", " ")) + "\n")
        for line in n["text"].split("\n"):
            out.write(f"    {_plain(line)}\n")
