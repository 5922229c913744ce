"""The JSON API of the profile view (see docs/view.md, "API").

Every handler is a plain function ``(db, params, body) -> payload`` run in a worker thread
with the database's lock held; :mod:`callpath.view.app` turns a :class:`CallpathError` into a
400 with its one-line message and a :class:`NotFound` into a 404. Handlers validate every
parameter before doing any work, then ask the engine (:mod:`callpath.engine`: the built
view state, child order, keys) and :mod:`callpath.analysis`, and return what is serialized;
they hold no state and start no background work themselves (``Database.anticipate`` does).
"""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.analysis.columns import ColumnDef, ColumnSet
from callpath.analysis.derived import load_derived, save_derived
from callpath.analysis.flat import FlatView
from callpath.analysis.formula import parse
from callpath.analysis.navigate import FindOptions, find, hot_path
from callpath.engine.compose import child_order, open_for_find, visible_rows
from callpath.engine.database import Built, Database
from callpath.engine.sources import read_lines
from callpath.errors import CallpathError, NotFound
from callpath.model.treeops import nearest_marked
from callpath.present import viewreport
from callpath.view.params import (
    derived_to_json,
    parse_bool,
    parse_derived,
    parse_float,
    parse_int,
    parse_json_param,
    parse_state,
)
from callpath.view.request_body import json_body
from callpath.view.rows import column_subset, columns_json, number, open_metric, rows_json

I64 = npt.NDArray[np.int64]
Params = Mapping[str, str]

MAX_PAGE = 1000
MAX_FIND = 1000


# ---- helpers ---------------------------------------------------------------------------


def built(db: Database, params: Params) -> Built:
    return db.build(parse_state(params, len(db.exp.contexts)))


def start_key(b: Built) -> str:
    return b.state.zoom or "r"


def _descending(params: Params) -> bool:
    order = params.get("order") or "desc"
    if order not in ("desc", "asc"):
        raise CallpathError(f"parameter 'order': expected desc or asc, got {order[:40]!r}")
    return order == "desc"


def _sort_column(b: Built, params: Params, name: str = "sort") -> ColumnDef:
    key = params.get(name)
    return b.column(key, f"parameter {name!r}") if key else b.columns.columns[0]


def ordered_children(b: Built, node: int, col: ColumnDef, descending: bool) -> I64:
    """Children of ``node`` sorted on the server (:func:`callpath.engine.compose.child_order`,
    with the state's flatten level and start node)."""
    return child_order(b.view, b.columns, node, col, descending=descending,
                       flatten=b.state.flatten, start=b.start())


def _keys_of(b: Built, parent_key: str, parent: int, nodes: I64) -> list[str]:
    view = b.view
    if isinstance(view, FlatView) and b.state.flatten and parent == b.start():
        return [b.keys.key(int(n)) for n in nodes.tolist()]  # flattened: not direct children
    return b.keys.child_keys(parent_key, parent, nodes)


def _path_keys(b: Built, top_key: str, path: list[int]) -> list[str]:
    """Keys of ``path[1:]``, each a child of the one before; ``path[0]`` has ``top_key``."""
    out = []
    key = top_key
    for par, child in itertools.pairwise(path):
        key = b.keys.child_keys(key, par, np.array([child], np.int64))[0]
        out.append(key)
    return out


# ---- handlers --------------------------------------------------------------------------


def databases(dbs: list[Database]) -> list[dict[str, Any]]:
    out = []
    for db in dbs:
        exp = db.exp
        entry: dict[str, Any] = {
            "id": db.id, "name": db.name, "path": str(db.path),
            "title": exp.title or db.name,
            "metrics": [{"index": k, "name": m.name, "description": m.description}
                        for k, m in enumerate(exp.metrics)],
            "contexts": len(exp.contexts),
            "has_traces": bool(exp.traces is not None and exp.traces.lines),
            "open_metric": open_metric([m.name for m in exp.metrics]),
            "derived": [],
        }
        try:
            entry["derived"] = [derived_to_json(d) for d in load_derived(db.path)]
        except CallpathError as e:
            entry["derived_error"] = str(e)
        out.append(entry)
    return out


def saved_filters() -> list[dict[str, Any]]:
    from callpath.analysis.tree_filters import load_filters

    return [{"pattern": f.pattern, "type": "all" if f.type.value == "self-and-descendants"
             else f.type.value, "enabled": f.enabled} for f in load_filters()]


def columns(db: Database, params: Params, body: bytes) -> Any:
    return columns_json(built(db, params))


def children(db: Database, params: Params, body: bytes) -> Any:
    b = built(db, params)
    col = _sort_column(b, params)
    desc = _descending(params)
    offset = parse_int(params, "offset", 0, lo=0)
    limit = parse_int(params, "limit", 200, lo=1, hi=MAX_PAGE)
    node_key = params.get("node") or None
    node = b.node(node_key) if node_key else b.start()
    parent_key = node_key or start_key(b)
    kids = ordered_children(b, node, col, desc)
    page = kids[offset:offset + limit]
    servable = db.servable()
    out: dict[str, Any] = {"node": parent_key, "total": len(kids), "offset": offset}
    if node_key is None:
        out["root"] = rows_json(b, [node], [parent_key], servable)[0]
    out["rows"] = rows_json(b, page.tolist(), _keys_of(b, parent_key, node, page), servable)
    if node_key is None:
        db.anticipate(b.state)  # other views, trace index: built in the background
    return out


def hotpath(db: Database, params: Params, body: bytes) -> Any:
    b = built(db, params)
    col = _sort_column(b, params, "column")
    threshold = parse_float(params, "threshold", 50.0, lo=0.0, hi=100.0)
    assert threshold is not None
    node_key = params.get("node") or start_key(b)
    node = b.node(node_key)
    path = hot_path(b.view, node, lambda: b.columns.values(b.view, col), threshold or 1e-9)
    return {"path": [node_key, *_path_keys(b, node_key, path)]}


def find_nodes(db: Database, params: Params, body: bytes) -> Any:
    b = built(db, params)
    q = params.get("q") or ""
    if not q or len(q) > 1000:
        raise CallpathError("parameter 'q': expected the text to find (1 to 1000 characters)")
    opts = FindOptions(q, parse_bool(params, "case"), parse_bool(params, "word"),
                       parse_bool(params, "regex"))
    limit = parse_int(params, "limit", 100, lo=1, hi=MAX_FIND)
    view = b.view
    open_for_find(view)
    start = b.start()
    top = start_key(b)
    hits = find(view, opts)
    if start != 0:  # keep the matches inside the zoomed subtree: one vectorised pass
        mark = np.zeros(len(view), dtype=bool)
        mark[start] = True
        hits = hits[nearest_marked(view.parent, mark)[hits] == start]
    matches, labels = [], []
    for n in hits[hits != start][:limit].tolist():
        path = view.path_to(int(n))
        path = path[path.index(start):]
        matches.append(_path_keys(b, top, path))
        labels.append(view.label(int(n)))  # the Find dialog lists matches by their labels
        if len(matches) >= limit:
            break
    return {"matches": matches, "labels": labels}


def node_path(db: Database, params: Params, body: bytes) -> Any:
    """The keys from the start node's child down to ``node`` (one ``find`` match's shape):
    what the front end expands to reveal a node it knows only by key."""
    b = built(db, params)
    key = params.get("node")
    if not key:
        raise CallpathError("parameter 'node': expected the key of a node")
    node = b.node(key)
    start = b.start()
    path = b.view.path_to(node)
    if start not in path:
        raise CallpathError(f"node key {key[:40]!r}: not inside the zoomed subtree")
    return {"path": _path_keys(b, start_key(b), path[path.index(start):])}


def source(db: Database, params: Params, body: bytes) -> Any:
    b = built(db, params)
    node_key = params.get("node")
    if not node_key:
        raise CallpathError("parameter 'node': expected the key of a node")
    node = b.node(node_key)
    which = params.get("which") or "self"
    if which not in ("self", "callsite"):
        raise CallpathError(f"parameter 'which': expected self or callsite, got {which[:40]!r}")
    loc = b.view.location(node)
    path, line = (loc.file, loc.line) if which == "self" else (loc.call_file, loc.call_line)
    label = b.view.label(node)
    if not path:
        what = "source file" if which == "self" else "call site"
        raise NotFound(f"{label}: no {what} is recorded for this scope in the database")
    real = db.servable().get(path)
    if real is None:
        raise NotFound(f"source file {path}: not copied into the database and not readable "
                       "at its recorded path")
    return {"file": os.path.basename(path) or path, "path": path, "line": line,
            "lines": read_lines(real, path)}


def contexts(db: Database, params: Params, body: bytes) -> Any:
    exp = db.exp
    out = []
    for i, c in enumerate(exp.contexts):
        ids = {}
        for ident in c.ids:
            name = exp.id_names[ident.kind] if ident.kind < len(exp.id_names) \
                else f"KIND{ident.kind}"
            ids[name] = ident.logical_id
        out.append({"index": i, "label": exp.context_label(c), "attrs": {
            "short": c.short_label(exp.id_names), "profile": c.index, "ids": ids,
            "name": c.name}})
    return out


def plot(db: Database, params: Params, body: bytes) -> Any:
    from callpath.analysis.percontext import context_values

    b = built(db, params)
    col = _sort_column(b, params, "column")
    node = b.node(params.get("node") or None, b.start())
    data = context_values(b.columns, b.view, node, col)
    st = data.statistics()
    return {"contexts": list(range(len(data.profiles))), "labels": data.labels,
            "values": [number(v) for v in data.values.tolist()],
            "column": b.column_key(col), "name": col.title, "node_label": b.view.label(node),
            "stats": {"count": st.count, "sum": number(st.sum), "mean": number(st.mean),
                      "min": number(st.min), "max": number(st.max),
                      "stdev": number(st.stddev), "cv": number(st.cv)}}


def csv_rows(b: Built, expanded: list[int], col: ColumnDef, descending: bool
             ) -> list[tuple[int, int]]:
    """The visible rows (:func:`callpath.engine.compose.visible_rows`) of a built state."""
    return visible_rows(b.view, b.columns, b.start(), expanded, col, descending=descending,
                        flatten=b.state.flatten)


def csv_text(db: Database, params: Params, body: bytes) -> str:
    b = built(db, params)
    col = _sort_column(b, params)
    desc = _descending(params)
    exp_keys = parse_json_param(params, "expanded") or []
    col_keys = parse_json_param(params, "columns") or []
    if body:  # POST: the lists in the body (a fully expanded tree does not fit in a URL)
        doc = json_body(body)
        if not isinstance(doc, dict):
            raise CallpathError("request body: expected {\"expanded\": [KEY...], "
                                "\"columns\": [COL...]}")
        exp_keys = doc.get("expanded", exp_keys) or []
        col_keys = doc.get("columns", col_keys) or []
    for name, val in (("expanded", exp_keys), ("columns", col_keys)):
        if not isinstance(val, list) or not all(isinstance(k, str) for k in val):
            raise CallpathError(f"parameter {name!r}: expected a JSON list of keys")
    if len(exp_keys) > 100000:
        raise CallpathError("parameter 'expanded': at most 100000 keys")
    expanded = [b.node(k) for k in exp_keys]
    cols = column_subset(b, col_keys)
    rows = csv_rows(b, expanded, col, desc)
    out = io.StringIO()
    viewreport.render_csv(b.columns, b.view, cols, rows, out)
    return out.getvalue()


def derived_check(db: Database, params: Params, body: bytes) -> Any:
    doc = json_body(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("formula"), str):
        raise CallpathError("request body: expected {\"formula\": \"...\"}")
    b = built(db, params)
    try:
        formula = parse(doc["formula"])
        formula.check_references(range(len(b.columns.columns)), "column")
    except CallpathError as e:
        return {"ok": False, "error": str(e), "column": getattr(e, "column", None)}
    return {"ok": True}


def derived_save(db: Database, params: Params, body: bytes) -> Any:
    doc = json_body(body)
    if not isinstance(doc, list):
        raise CallpathError("request body: expected the JSON list of derived metrics")
    items = parse_derived(doc, "request body")
    b = built(db, {k: v for k, v in params.items() if k != "derived"})
    ColumnSet(b.source, items)  # every formula refers only to columns before it
    path = save_derived(db.path, items)
    return {"saved": len(items), "path": str(path)}
