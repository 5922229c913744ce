"""What a node of any view *is*: a kind plus indices into the experiment's tables.

All three views describe their nodes with the same columns, so naming, labelling, finding and
exporting are written once. Names are computed per distinct (kind, function, file, line, ...)
key rather than per node, so searching a 10^6-node view formats a few thousand strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
import numpy.typing as npt

from callpath.analysis.shortnames import file_names, module_names
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
            return module_names(exp)[m] if m >= 0 else "<unknown module>"
        if kind == ViewKind.FILE:
            f = int(self.file[i])
            return file_names(exp)[f] if f >= 0 else "<unknown file>"
        if kind in (ViewKind.PROCEDURE, ViewKind.ACTIVATION, ViewKind.INLINED, ViewKind.CALLER):
            return self._function_name(exp, i)
        if kind == ViewKind.LOOP:
            return f"loop at {self._srcloc(exp, i)}"
        if kind == ViewKind.LINE:
            return self._srcloc(exp, i)
        m = int(self.module[i])
        mod = module_names(exp)[m] if m >= 0 else "<unknown module>"
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
                return f"<unknown procedure> {module_names(exp)[fn.module]}+{fn.offset:#x}"
        m = int(self.module[i])
        if m >= 0:
            return f"<unknown procedure> {module_names(exp)[m]}+{int(self.offset[i]):#x}"
        return "<unknown procedure>"

    def _srcloc(self, exp: Experiment, i: int) -> str:
        f = int(self.file[i])
        name = file_names(exp)[f] if f >= 0 else "<unknown file>"
        return f"{name}:{int(self.line[i])}"

    def name_keys(self, ids: I64 | None = None) -> tuple[I64, I64]:
        """Group nodes whose names are certainly equal: ``(key_of_node, representative)``.

        ``representative[k]`` is one node of key ``k``; naming the representatives names all.
        Procedures are keyed by function alone (an activation and its procedure share a
        name); statements and loops by (file, line); entries by node."""
        from callpath.model.treeops import group_rows

        sel = np.arange(len(self), dtype=np.int64) if ids is None else ids
        kind = self.kind[sel].astype(np.int64)
        fn = self.function[sel]
        is_fn = np.isin(kind, (ViewKind.PROCEDURE, ViewKind.ACTIVATION, ViewKind.INLINED,
                               ViewKind.CALLER))
        named_fn = is_fn & (fn >= 0)
        tag = np.where(named_fn, ViewKind.PROCEDURE, kind)
        a = np.where(named_fn, fn, np.where(kind == ViewKind.FILE, self.file[sel],
                                            np.where(np.isin(kind, (ViewKind.LOOP,
                                                                    ViewKind.LINE)),
                                                     self.file[sel], self.module[sel])))
        b = np.where(named_fn | (kind == ViewKind.MODULE) | (kind == ViewKind.FILE), 0,
                     np.where(np.isin(kind, (ViewKind.LOOP, ViewKind.LINE)), self.line[sel],
                              self.offset[sel].astype(np.int64)))
        b = np.where(kind == ViewKind.ENTRY, sel, b)
        key, first = group_rows(tag, a, b)
        return key, sel[first]

    def names(self, exp: Experiment, ids: I64) -> list[str]:
        """Names of many nodes at once: per-table strings computed once, then one pass."""
        files = file_names(exp)
        mods = module_names(exp)
        out: list[str] = []
        kinds = self.kind[ids].tolist()
        fns = self.function[ids].tolist()
        fis = self.file[ids].tolist()
        lns = self.line[ids].tolist()
        for i, k, f, fi, ln in zip(ids.tolist(), kinds, fns, fis, lns, strict=True):
            if k in (ViewKind.LINE, ViewKind.LOOP):
                loc = f"{files[fi] if fi >= 0 else '<unknown file>'}:{ln}"
                out.append(loc if k == ViewKind.LINE else f"loop at {loc}")
            elif k == ViewKind.MODULE:
                m = int(self.module[i])
                out.append(mods[m] if m >= 0 else "<unknown module>")
            elif f >= 0 and exp.functions[f].has_name and exp.functions[f].name and k in (
                    ViewKind.PROCEDURE, ViewKind.ACTIVATION, ViewKind.INLINED, ViewKind.CALLER):
                out.append(exp.functions[f].name)
            else:
                out.append(self.name(exp, i))
        return out
