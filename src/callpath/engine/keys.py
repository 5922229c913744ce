"""Node keys: opaque strings that name a node of a view and that the server can resolve from
scratch (after a restart, or from a link a colleague opened).

- ``r``: the root (the aggregate row).
- Top-down ``t<ctx>``: the calling-context id of the node in the database, which does not
  depend on how far the tree was expanded, on filters or on the thread selection.
- Bottom-up and Flat ``p<i>.<j>...``: the path of child positions from the root, each in
  the view's own stable child order (the order the analysis layer materializes children in,
  which is deterministic for a database and a filter set). Bottom-up nodes are materialized
  lazily, so a node number would depend on what was expanded before; a path does not.

The front end never parses keys; it only sends back what it was given.
"""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt

from callpath.analysis.topdown import TopDownView, View
from callpath.errors import CallpathError

I64 = npt.NDArray[np.int64]

MAX_KEY = 4096


class NodeKeys:
    """Encode and resolve the keys of one built view."""

    def __init__(self, view: View) -> None:
        self.view = view
        self.top_down = isinstance(view, TopDownView)
        self._ctx: I64 | None = None
        self._inverse: I64 | None = None

    def _tables(self) -> tuple[I64, I64]:
        if self._ctx is None or self._inverse is None:
            src = self.view.source
            ctx = src.exp.cct.ctx_id[src.orig].astype(np.int64)
            inv = np.full(int(ctx.max()) + 1 if len(ctx) else 1, -1, dtype=np.int64)
            inv[ctx] = np.arange(len(ctx), dtype=np.int64)
            self._ctx, self._inverse = ctx, inv
        return self._ctx, self._inverse

    # ---- encode --------------------------------------------------------------------------

    def key(self, node: int) -> str:
        if node == 0:
            return "r"
        if self.top_down:
            return f"t{int(self._tables()[0][node])}"
        path = self.view.path_to(node)
        parts = []
        for par, child in itertools.pairwise(path):
            kids = self.view.children(par)
            parts.append(str(int(np.searchsorted(kids, child)) if _is_sorted(kids)
                             else int(np.nonzero(kids == child)[0][0])))
        return "p" + ".".join(parts)

    def child_keys(self, parent_key: str, parent: int, nodes: I64) -> list[str]:
        """Keys of some children of ``parent`` (whose key is ``parent_key``) at once."""
        if self.top_down:
            ctx = self._tables()[0]
            return [f"t{c}" for c in ctx[nodes].tolist()]
        kids = self.view.children(parent)
        pos = np.empty(0, np.int64)
        if len(nodes):
            if _is_sorted(kids):
                pos = np.searchsorted(kids, nodes)
            else:
                order = np.argsort(kids)
                pos = order[np.searchsorted(kids[order], nodes)]
        prefix = "p" if parent_key == "r" else parent_key + "."
        return [f"{prefix}{p}" for p in pos.tolist()]

    # ---- resolve -------------------------------------------------------------------------

    def resolve(self, key: str) -> int:
        if not isinstance(key, str) or not key or len(key) > MAX_KEY:
            raise CallpathError(f"node key {str(key)[:40]!r}: expected a key the server sent")
        if key == "r":
            return 0
        head, body = key[0], key[1:]
        if self.top_down:
            if head != "t" or not body.isdigit():
                raise CallpathError(f"node key {key[:40]!r}: not a {self.view.name} key "
                                    "(expected 'r' or 't<context id>')")
            _ctx, inv = self._tables()
            c = int(body)
            node = int(inv[c]) if c < len(inv) else -1
            if node < 0:
                raise CallpathError(f"node key {key[:40]!r}: no such node in the "
                                    f"{self.view.name} view (filtered out, or another "
                                    "database)")
            return node
        if head != "p" or not all(p.isdigit() for p in body.split(".")):
            raise CallpathError(f"node key {key[:40]!r}: not a {self.view.name} key "
                                "(expected 'r' or 'p<i>.<j>...')")
        node = 0
        for part in body.split("."):
            kids = self.view.children(node)
            i = int(part)
            if i >= len(kids):
                raise CallpathError(f"node key {key[:40]!r}: no such node in the "
                                    f"{self.view.name} view (position {i} of a node with "
                                    f"{len(kids)} children)")
            node = int(kids[i])
        return node


def _is_sorted(a: I64) -> bool:
    return len(a) < 2 or bool(np.all(a[1:] > a[:-1]))
