"""What a node of any view *is*: a kind plus indices into the experiment's tables.

All three views describe their nodes with the same columns, so naming, labelling, finding and
exporting are written once. Names are computed per distinct (kind, function, file, line, ...)
key rather than per node, so searching a 10^6-node view formats a few thousand strings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
import numpy.typing as npt

from callpath.model import Experiment

I64 = npt.NDArray[np.int64]


class ViewKind(IntEnum):
    ROOT = 0
    ENTRY = 1  # a thread's entry point ("main thread")
    MODULE = 2  # Flat: load module
    FILE = 3  # Flat: source file
    PROCEDURE = 4  # Flat and Bottom-up: a procedure as a whole
    ACTIVATION = 5  # Top-down and Flat: a procedure reached by a call: `[line] » callee`
    INLINED = 6  # inlined code: `[line] » callee [inlined]`
    CALLER = 7  # Bottom-up: a calling context: `[line] « caller`
    LOOP = 8
    LINE = 9
    INSTRUCTION = 10


KIND_TYPES = {
    ViewKind.ROOT: "entry", ViewKind.ENTRY: "entry", ViewKind.MODULE: "module",
    ViewKind.FILE: "file", ViewKind.PROCEDURE: "function", ViewKind.ACTIVATION: "function",
    ViewKind.INLINED: "function", ViewKind.CALLER: "function", ViewKind.LOOP: "loop",
    ViewKind.LINE: "line", ViewKind.INSTRUCTION: "instruction",
}

ROOT_LABEL = "<program root>"


def _base(path: str) -> str:
    return os.path.basename(path) or path


@dataclass
class NodeTable:
    """Per-node description columns of a view (one element per materialized node)."""

    kind: npt.NDArray[np.uint8]
    function: I64
    module: I64
    file: I64
    line: I64
    offset: npt.NDArray[np.uint64]
    call_line: I64  # line of the call site in the caller (activations, callers); -1 if none
    entry_names: dict[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.kind)

    @classmethod
    def empty(cls) -> NodeTable:
        z = np.zeros(0, np.int64)
        return cls(np.zeros(0, np.uint8), z, z, z, z, np.zeros(0, np.uint64), z)

    def extend(self, other: NodeTable) -> None:
        n = len(self)
        self.kind = np.concatenate([self.kind, other.kind])
        self.function = np.concatenate([self.function, other.function])
        self.module = np.concatenate([self.module, other.module])
        self.file = np.concatenate([self.file, other.file])
        self.line = np.concatenate([self.line, other.line])
        self.offset = np.concatenate([self.offset, other.offset])
        self.call_line = np.concatenate([self.call_line, other.call_line])
        self.entry_names.update({n + k: v for k, v in other.entry_names.items()})

    # ---- names ---------------------------------------------------------------------------

    def name(self, exp: Experiment, i: int) -> str:
        """The bare name of a node: what filters and Find match against."""
        kind = ViewKind(int(self.kind[i]))
        if kind == ViewKind.ROOT:
            return ROOT_LABEL
        if kind == ViewKind.ENTRY:
            return self.entry_names.get(i, "<entry>")
        if kind == ViewKind.MODULE:
            m = int(self.module[i])
            return _base(exp.modules[m].path) if m >= 0 else "<unknown module>"
        if kind == ViewKind.FILE:
            f = int(self.file[i])
            return _base(exp.files[f].path) if f >= 0 else "<unknown file>"
        if kind in (ViewKind.PROCEDURE, ViewKind.ACTIVATION, ViewKind.INLINED, ViewKind.CALLER):
            return self._function_name(exp, i)
        if kind == ViewKind.LOOP:
            return f"loop at {self._srcloc(exp, i)}"
        if kind == ViewKind.LINE:
            return self._srcloc(exp, i)
        m = int(self.module[i])
        mod = _base(exp.modules[m].path) if m >= 0 else "<unknown module>"
        return f"{mod}+{int(self.offset[i]):#x}"

    def label(self, exp: Experiment, i: int) -> str:
        """The label shown in a tree: the name with call-site decoration (» callee, « caller)."""
        kind = ViewKind(int(self.kind[i]))
        name = self.name(exp, i)
        cl = int(self.call_line[i])
        if kind in (ViewKind.ACTIVATION, ViewKind.INLINED):
            prefix = f"[{cl}] »" if cl > 0 else "»"
            suffix = " [inlined]" if kind == ViewKind.INLINED else ""
            return f"{prefix} {name}{suffix}"
        if kind == ViewKind.CALLER:
            prefix = f"[{cl}] «" if cl > 0 else "«"
            return f"{prefix} {name}"
        return name

    def _function_name(self, exp: Experiment, i: int) -> str:
        f = int(self.function[i])
        if f >= 0:
            fn = exp.functions[f]
            if fn.has_name and fn.name:
                return fn.name
            if fn.module >= 0:
                return f"<unknown procedure> {_base(exp.modules[fn.module].path)}+{fn.offset:#x}"
        m = int(self.module[i])
        if m >= 0:
            return f"<unknown procedure> {_base(exp.modules[m].path)}+{int(self.offset[i]):#x}"
        return "<unknown procedure>"

    def _srcloc(self, exp: Experiment, i: int) -> str:
        f = int(self.file[i])
        name = _base(exp.files[f].path) if f >= 0 else "<unknown file>"
        return f"{name}:{int(self.line[i])}"

    def name_keys(self, ids: I64 | None = None) -> tuple[I64, I64]:
        """Group nodes whose names are certainly equal: ``(key_of_node, representative)``.

        ``representative[k]`` is one node of key ``k``; naming the representatives names all.
        Entry nodes are kept apart (their names live in a dictionary)."""
        sel = np.arange(len(self), dtype=np.int64) if ids is None else ids
        kind = self.kind[sel].astype(np.int64)
        entry = np.where(kind == ViewKind.ENTRY, sel, -1)
        cols = np.stack([kind, self.function[sel], self.module[sel], self.file[sel],
                         self.line[sel], self.offset[sel].astype(np.int64), entry], axis=1)
        _, first, inverse = np.unique(cols, axis=0, return_index=True, return_inverse=True)
        return inverse.reshape(-1).astype(np.int64), sel[first]
