"""A structure's arrays on disk in numpy's ``.npz`` form: the cache format that loads in
milliseconds.

Parsing hpcstruct XML costs a Python step per scope (libtorch_cpu.so's whole structure is a
617 MB file, about a minute to parse); a :class:`Structure` is already a handful of flat
arrays and a string table, so it is stored as those arrays (uncompressed ``np.savez``: each
member is one read, no decoding) plus a JSON header. XML stays the interchange format with
HPCToolkit (``formats/hpcstruct.py``); this is the project's own cache.

Entries are written atomically (a temporary file renamed into place) and checked on load
(member CRCs, array lengths consistent with each other, the caller's header fields): an entry
that does not read back whole is treated as absent, never as an error.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.structure.model import Structure

#: The structure's columns, in the order the model declares them.
ARRAYS = ("kind", "parent", "name", "link_name", "file", "line", "call_file", "call_line",
          "target", "range_ptr", "range_lo", "range_hi", "map_lo", "map_hi", "map_scope")
_PER_SCOPE = ARRAYS[:9]


def save(path: str | os.PathLike[str], s: Structure, meta: dict[str, Any],
         extra: dict[str, npt.NDArray[Any]] | None = None) -> bool:
    """Write ``s`` with the JSON-able ``meta`` and ``extra`` arrays to ``path`` atomically;
    False (and nothing left behind) where it cannot be written."""
    p = Path(path)
    # members are prefixed: ``file`` would collide with ``np.savez``'s own parameter
    arrays: dict[str, npt.NDArray[Any]] = {"s." + k: getattr(s, k) for k in ARRAYS}
    arrays["strings"] = np.frombuffer(
        "\0".join(s.strings).encode("utf-8", "surrogatepass"), dtype=np.uint8)
    head = dict(meta, path=s.path, build_id=s.build_id, has_calls=s.has_calls,
                n_strings=len(s.strings))
    arrays["meta"] = np.frombuffer(json.dumps(head).encode("utf-8"), dtype=np.uint8)
    for k, v in (extra or {}).items():
        arrays["x." + k] = v
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, p)
    except (OSError, ValueError, TypeError):
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    return True


def load(path: str | os.PathLike[str], expect: dict[str, Any] | None = None
         ) -> tuple[Structure, dict[str, Any], dict[str, npt.NDArray[Any]]] | None:
    """``(structure, meta, extra arrays)`` of an entry written by :func:`save`, or None when
    it is absent, damaged, or its header differs from ``expect`` in any field given."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode("utf-8"))
            if not isinstance(meta, dict):
                return None
            if expect and any(meta.get(k) != v for k, v in expect.items()):
                return None
            cols = {k: z["s." + k] for k in ARRAYS}
            text = bytes(z["strings"]).decode("utf-8", "surrogatepass")
            extra = {k[2:]: z[k] for k in z.files if k.startswith("x.")}
    except Exception:  # any entry that does not read back whole is a miss
        return None
    strings = text.split("\0") if meta.get("n_strings") else []
    n = len(cols["kind"])
    if (len(strings) != meta.get("n_strings") or len(cols["range_ptr"]) != n + 1
            or any(len(cols[k]) != n for k in _PER_SCOPE)
            or not len(cols["range_lo"]) == len(cols["range_hi"]) == int(cols["range_ptr"][-1])
            or not len(cols["map_lo"]) == len(cols["map_hi"]) == len(cols["map_scope"])):
        return None
    s = Structure(path=str(meta.get("path", "")), build_id=meta.get("build_id"),
                  strings=strings, has_calls=bool(meta.get("has_calls")), **cols)
    return s, meta, extra
