"""The notes API of the viewer (``/api/db/N/notes``, ``notes/save``, ``notes/delete``): parse
the request, read or change the notes through :mod:`callpath.engine.notes`, tell live
sessions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from callpath.engine.database import Database
from callpath.engine.notes import add_note, delete_note, load_notes
from callpath.view.request_body import json_body


def handlers(changed: Callable[[int], None]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The GET and POST handlers of the notes API; ``changed(db_id)`` is called (from the
    worker thread) after a note was added or deleted, so that live sessions hear of it."""
    def list_notes(db: Database, params: Any, body: bytes) -> Any:
        return {"notes": load_notes(db.path)}

    def save(db: Database, params: Any, body: bytes) -> Any:
        note = add_note(db.path, json_body(body))
        changed(db.id)
        return note

    def delete(db: Database, params: Any, body: bytes) -> Any:
        doc = json_body(body)
        ok = delete_note(db.path, doc.get("id") if isinstance(doc, dict) else None)
        if ok:
            changed(db.id)
        return {"deleted": ok}

    return {"notes": list_notes}, {"notes/save": save, "notes/delete": delete}
