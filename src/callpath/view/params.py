"""Request parameters: the view state every view endpoint takes (which view, filters, derived
metrics, thread selection, flatten level and zoom node, all as query parameters so that the
front end can keep them in its own URL: a reload or a shared link restores the view), and the
numbers, flags and JSON lists other endpoints take. The state itself is the engine's
:class:`~callpath.engine.state.ViewState`.

Parsing is strict: anything malformed is a :class:`CallpathError` with one line naming the
parameter and what was expected, which the API turns into a 400.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from callpath.analysis.derived import DerivedMetric
from callpath.analysis.topdown import VIEW_NAMES
from callpath.analysis.tree_filters import Filter, FilterType
from callpath.engine.state import ViewState
from callpath.errors import CallpathError

MAX_LIST = 256  # filters, derived metrics or threads in one request: plenty for a person


def parse_json_param(params: Mapping[str, str], name: str) -> Any:
    text = params.get(name)
    if text is None or text == "":
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise CallpathError(f"parameter {name!r}: not valid JSON ({e.msg} at character "
                            f"{e.pos + 1})") from None


def _json_list(params: Mapping[str, str], name: str) -> list[Any]:
    doc = parse_json_param(params, name)
    if doc is None:
        return []
    if not isinstance(doc, list):
        raise CallpathError(f"parameter {name!r}: expected a JSON list")
    if len(doc) > MAX_LIST:
        raise CallpathError(f"parameter {name!r}: at most {MAX_LIST} items, got {len(doc)}")
    return doc


def parse_filters(items: list[Any], what: str = "filters") -> tuple[Filter, ...]:
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("pattern"), str):
            raise CallpathError(f"{what}[{i}]: expected an object with a string \"pattern\"")
        ftype = item.get("type", "self")
        enabled = item.get("enabled", True)
        if not isinstance(ftype, str) or not isinstance(enabled, bool):
            raise CallpathError(f"{what}[{i}]: \"type\" must be self, descendants or all and "
                                "\"enabled\" true or false")
        try:
            out.append(Filter(item["pattern"], FilterType.parse(ftype), enabled))
        except CallpathError as e:
            raise CallpathError(f"{what}[{i}]: {e}") from None
    return tuple(out)


def parse_derived(items: list[Any], what: str = "derived") -> tuple[DerivedMetric, ...]:
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) \
                or not isinstance(item.get("formula"), str):
            raise CallpathError(f"{what}[{i}]: expected an object with string \"name\" and "
                                "\"formula\"")
        fmt = item.get("format", "scientific")
        pct = item.get("percent_annotation", item.get("percent", False))
        if not isinstance(fmt, str) or not isinstance(pct, bool):
            raise CallpathError(f"{what}[{i}] ({item['name']!r}): \"format\" must be a string "
                                "and \"percent_annotation\" true or false")
        try:
            out.append(DerivedMetric(item["name"].strip(), item["formula"], fmt, pct))
        except CallpathError as e:
            raise CallpathError(f"{what}[{i}]: {e}") from None
    names = [d.name for d in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise CallpathError(f"{what}: the name {sorted(dup)[0]!r} is used twice: names must "
                            "be unique")
    return tuple(out)


def derived_to_json(d: DerivedMetric) -> dict[str, Any]:
    return {"name": d.name, "formula": d.formula, "format": d.format,
            "percent_annotation": d.percent}


def parse_int(params: Mapping[str, str], name: str, default: int, *, lo: int = 0,
              hi: int | None = None) -> int:
    text = params.get(name)
    if text is None or text == "":
        return default
    try:
        v = int(text)
    except ValueError:
        raise CallpathError(f"parameter {name!r}: expected an integer, got {text[:40]!r}"
                            ) from None
    if v < lo or (hi is not None and v > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise CallpathError(f"parameter {name!r}: expected an integer {rng}, got {v}")
    return v


def parse_float(params: Mapping[str, str], name: str, default: float | None, *,
                lo: float | None = None, hi: float | None = None) -> float | None:
    text = params.get(name)
    if text is None or text == "":
        return default
    try:
        v = float(text)
    except ValueError:
        raise CallpathError(f"parameter {name!r}: expected a number, got {text[:40]!r}"
                            ) from None
    if v != v or (lo is not None and v < lo) or (hi is not None and v > hi):
        raise CallpathError(f"parameter {name!r}: expected a number in "
                            f"[{lo if lo is not None else '-inf'}, "
                            f"{hi if hi is not None else 'inf'}], got {text[:40]!r}")
    return v


def parse_bool(params: Mapping[str, str], name: str) -> bool:
    text = params.get(name, "0")
    if text in ("0", "", "false"):
        return False
    if text in ("1", "true"):
        return True
    raise CallpathError(f"parameter {name!r}: expected 0 or 1, got {text[:40]!r}")


def parse_state(params: Mapping[str, str], n_contexts: int) -> ViewState:
    view = params.get("view") or "top-down"
    if view not in VIEW_NAMES:
        raise CallpathError(f"parameter 'view': unknown view {view[:40]!r}: expected one of "
                            f"{', '.join(VIEW_NAMES)}")
    filters = parse_filters(_json_list(params, "filters"))
    derived = parse_derived(_json_list(params, "derived"))
    threads_raw = _json_list(params, "threads")
    threads = []
    for t in threads_raw:
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < n_contexts:
            raise CallpathError(f"parameter 'threads': {str(t)[:40]!r} is not a context index "
                                f"(expected integers 0..{n_contexts - 1})")
        threads.append(t)
    flatten = parse_int(params, "flatten", 0, lo=0, hi=64)
    zoom = params.get("zoom") or None
    return ViewState(view, filters, derived, tuple(sorted(set(threads))), flatten, zoom)
