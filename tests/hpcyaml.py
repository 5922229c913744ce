"""Loading HPCToolkit's YAML dumps of v4 databases (``small.yaml``) as plain Python data.

The dumps use application tags (``!meta.db/v4/Context``) that only HPCToolkit's own library
knows; here every tagged node becomes the plain mapping, list or string it wraps, which is all
the tests need to compare values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    pass


def _any_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_Loader.add_multi_constructor("!", _any_tag)


def load_dump(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        data = yaml.load(fh, Loader=_Loader)
    assert isinstance(data, dict)
    return data


def walk_contexts(entry_points: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """Every context of the dumped tree in preorder, with its parent's ctx_id (0 for entries)."""
    out: list[tuple[dict[str, Any], int]] = []
    stack: list[tuple[dict[str, Any], int]] = [(e, 0) for e in reversed(entry_points)]
    while stack:
        node, parent = stack.pop()
        out.append((node, parent))
        for child in reversed(node.get("children") or []):
            stack.append((child, int(node["ctx_id"])))
    return out
