"""The structure model: a load module's scopes as preorder numpy arrays, and address lookup.

A :class:`Structure` is one load module (an ELF file, or a Python source file as a pseudo
module). Its scopes form a tree stored in preorder: FILE → PROC → (ALIEN | LOOP | STMT)*, where
ALIEN is code inlined from ``name`` called at ``call_file:call_line``, LOOP carries the line of
its back-edge branch and its header address, STMT is a source line with address ranges, and
CALL is one call instruction (its line, and ``target``: the callee's entry address, 0 when the
call is indirect); a call instruction belongs to its CALL scope, not to a STMT.
Every scope has a set of address ranges (``range_lo``/``range_hi`` rows ``range_ptr[i] ..
range_ptr[i+1]``): for PROC its entry ``[entry, entry+1)``, for LOOP its header, for STMT the
code of that line in that scope — the same ``v=`` sets as HPCToolkit's structure XML.

:meth:`Structure.lookup` answers, for a numpy array of module offsets, the innermost scope of
each (vectorised: one ``searchsorted``); :meth:`Structure.chain` gives the enclosing scopes.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np
import numpy.typing as npt


class Kind(IntEnum):
    ROOT = 0
    FILE = 1
    PROC = 2
    ALIEN = 3
    LOOP = 4
    STMT = 5
    CALL = 6


@dataclass
class Structure:
    """One load module's recovered structure (see the module docstring)."""

    path: str
    build_id: str | None
    strings: list[str]
    kind: npt.NDArray[np.uint8]
    parent: npt.NDArray[np.int32]
    name: npt.NDArray[np.int32]  # string id: FILE path, PROC/ALIEN display name, else -1
    link_name: npt.NDArray[np.int32]  # PROC link name, -1 if same as name
    file: npt.NDArray[np.int32]  # string id of the source file, -1 unknown
    line: npt.NDArray[np.int32]
    call_file: npt.NDArray[np.int32]  # ALIEN: string id of the caller's file
    call_line: npt.NDArray[np.int32]  # ALIEN: line of the call; CALL: target address low bits
    target: npt.NDArray[np.uint64]  # CALL: target address (0 unknown)
    range_ptr: npt.NDArray[np.int64]
    range_lo: npt.NDArray[np.uint64]
    range_hi: npt.NDArray[np.uint64]
    #: Address map: disjoint sorted intervals -> innermost scope (STMT, or PROC without lines).
    map_lo: npt.NDArray[np.uint64] = field(default_factory=lambda: np.zeros(0, np.uint64))
    map_hi: npt.NDArray[np.uint64] = field(default_factory=lambda: np.zeros(0, np.uint64))
    map_scope: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    has_calls: bool = False
    #: some versions of hpcstruct name a procedure without a source file ``name [module]``,
    #: others (those of HPCToolkit's GPU test data) the plain name; the names here are
    #: without it, and this says whether the structure file had it (hpcprof shows the name
    #: as the file has it)
    proc_suffix: bool = True

    def __len__(self) -> int:
        return len(self.kind)

    def ranges(self, i: int) -> list[tuple[int, int]]:
        a, b = int(self.range_ptr[i]), int(self.range_ptr[i + 1])
        return [(int(x), int(y)) for x, y in zip(self.range_lo[a:b], self.range_hi[a:b],
                                                 strict=True)]

    def text(self, sid: int) -> str:
        return self.strings[sid] if sid >= 0 else ""

    def lookup(self, offsets: npt.ArrayLike) -> npt.NDArray[np.int32]:
        """Innermost scope of each module offset (-1 where the module has no code there)."""
        off = np.asarray(offsets, dtype=np.uint64)
        if len(self.map_lo) == 0:
            return np.full(off.shape, -1, dtype=np.int32)
        i = np.searchsorted(self.map_lo, off, side="right").astype(np.int64) - 1
        ok = i >= 0
        ic = np.where(ok, i, 0)
        ok &= off < self.map_hi[ic]
        return np.where(ok, self.map_scope[ic], -1).astype(np.int32)

    def chain(self, scope: int) -> list[int]:
        """``scope`` and its enclosing scopes, innermost first, up to (excluding) the root."""
        out = []
        while scope > 0:
            out.append(scope)
            scope = int(self.parent[scope])
        return out

    def enclosing(self, scopes: npt.NDArray[np.int32], kind: Kind) -> npt.NDArray[np.int32]:
        """For each scope, the nearest enclosing scope (itself included) of ``kind``; -1 if none.

        Vectorised by pointer jumping over the parent array (depth-many numpy passes at most).
        """
        cur = np.asarray(scopes, dtype=np.int32).copy()
        out = np.full(cur.shape, -1, dtype=np.int32)
        active = cur >= 0
        while active.any():
            hit = active & (self.kind[np.where(active, cur, 0)] == kind)
            out[hit] = cur[hit]
            active &= ~hit
            nxt = np.where(active, self.parent[np.where(active, cur, 0)], -1)
            cur = nxt.astype(np.int32)
            active &= cur > 0
        return out

    def call_targets(self) -> npt.NDArray[np.int32]:
        """For each scope, the PROC scope whose entry is its call target (CALL scopes with a
        direct target inside this module), else -1. Vectorised: one sort, one searchsorted."""
        out = np.full(len(self), -1, dtype=np.int32)
        procs = np.flatnonzero((self.kind == Kind.PROC)
                               & (self.range_ptr[1:] > self.range_ptr[:-1]))
        calls = np.flatnonzero((self.kind == Kind.CALL) & (self.target != 0))
        if len(procs) == 0 or len(calls) == 0:
            return out
        entry = self.range_lo[self.range_ptr[procs]]
        order = np.argsort(entry, kind="stable")
        entry, procs = entry[order], procs[order]
        t = self.target[calls]
        j = np.minimum(np.searchsorted(entry, t), len(entry) - 1)
        hit = entry[j] == t
        out[calls[hit]] = procs[j[hit]]
        return out

    def children(self) -> list[list[int]]:
        kids: list[list[int]] = [[] for _ in range(len(self))]
        for i in range(1, len(self)):
            kids[int(self.parent[i])].append(i)
        return kids


class StructureBuilder:
    """Appends scopes in preorder and freezes them into a :class:`Structure`.

    Columns are ``array.array`` of machine integers, not lists: a list holds a pointer plus a
    28-byte int object per entry, which made the builder most of the peak memory (libpython:
    290k scopes x 13 columns).
    """

    def __init__(self, path: str, build_id: str | None) -> None:
        self.path = path
        self.build_id = build_id
        self.strings: list[str] = []
        self._sid: dict[str, int] = {}
        # scope and string indices in 4 bytes, as the Structure keeps them (libtorch_cpu.so's
        # ~6M scopes: ~150 MB less than 8-byte columns); lines stay 8 bytes here and are cut
        # to 4 by build(), as before
        self.kind = array("b", [int(Kind.ROOT)])
        self.parent = array("i", [-1])
        self.name = array("i", [self.sid(path)])
        self.link = array("i", [-1])
        self.file = array("i", [-1])
        self.line = array("q", [0])
        self.cfile = array("i", [-1])
        self.cline = array("q", [0])
        self.target = array("Q", [0])
        self.rptr = array("q", [0, 0])
        self.rlo = array("Q")
        self.rhi = array("Q")
        self.map_lo = array("Q")
        self.map_hi = array("Q")
        self.map_scope = array("i")
        self.has_calls = False

    def sid(self, s: str | None) -> int:
        if s is None:
            return -1
        i = self._sid.get(s)
        if i is None:
            i = self._sid[s] = len(self.strings)
            self.strings.append(s)
        return i

    def add(self, kind: Kind, parent: int, *, name: str | None = None,
            link: str | None = None, file: str | None = None, line: int = 0,
            call_file: str | None = None, call_line: int = 0, target: int = 0,
            ranges: list[tuple[int, int]] | None = None) -> int:
        i = len(self.kind)
        self.kind.append(int(kind))
        self.parent.append(parent)
        self.name.append(self.sid(name))
        self.link.append(self.sid(link) if link is not None and link != name else -1)
        self.file.append(self.sid(file))
        self.line.append(line)
        self.cfile.append(self.sid(call_file))
        self.cline.append(call_line)
        self.target.append(target)
        for lo, hi in ranges or ():
            self.rlo.append(lo)
            self.rhi.append(hi)
        self.rptr.append(len(self.rlo))
        return i

    def extend(self, kind: npt.NDArray[Any], parent: npt.NDArray[Any],
               name: npt.NDArray[Any], link: npt.NDArray[Any], file: npt.NDArray[Any],
               line: npt.NDArray[Any], target: npt.NDArray[Any], nranges: npt.NDArray[Any],
               range_lo: npt.NDArray[Any], range_hi: npt.NDArray[Any],
               map_lo: npt.NDArray[Any], map_hi: npt.NDArray[Any],
               map_scope: npt.NDArray[Any]) -> None:
        """Append scopes given as columns (what :meth:`add` and :meth:`map_range` do one at a
        time; strings already as ids, no call file or line): ``nranges`` ranges each, taken in
        order from ``range_lo``/``range_hi``."""
        def put(col: array[int], x: npt.NDArray[Any]) -> None:
            col.frombytes(np.ascontiguousarray(x, dtype=np.dtype(col.typecode)).tobytes())

        n = len(kind)
        put(self.kind, kind)
        put(self.parent, parent)
        put(self.name, name)
        put(self.link, link)
        put(self.file, file)
        put(self.line, line)
        put(self.cfile, np.full(n, -1, np.int32))
        put(self.cline, np.zeros(n, np.int64))
        put(self.target, target)
        put(self.rptr, len(self.rlo) + np.cumsum(nranges, dtype=np.int64))
        put(self.rlo, range_lo)
        put(self.rhi, range_hi)
        put(self.map_lo, map_lo)
        put(self.map_hi, map_hi)
        put(self.map_scope, map_scope)

    def map_range(self, lo: int, hi: int, scope: int) -> None:
        self.map_lo.append(lo)
        self.map_hi.append(hi)
        self.map_scope.append(scope)

    def build(self) -> Structure:
        """The scopes as a :class:`Structure`; empties the builder (once per builder)."""
        def take(attr: str, dtype: type) -> npt.NDArray[Any]:
            # Each column leaves the builder as it becomes an array, and a column already of
            # the array's type becomes a view of its buffer, not a copy: the builder and the
            # arrays never both hold the module (libtorch_cpu.so: ~6M scopes, ~1 GB).
            a = getattr(self, attr)
            setattr(self, attr, array(a.typecode))
            if not len(a):
                return np.zeros(0, dtype)
            return np.frombuffer(a, np.dtype(a.typecode)).astype(dtype, copy=False)

        kind, parent = take("kind", np.uint8), take("parent", np.int32)
        name, link = take("name", np.int32), take("link", np.int32)
        file, line = take("file", np.int32), take("line", np.int32)
        cfile, cline = take("cfile", np.int32), take("cline", np.int32)
        target, rptr = take("target", np.uint64), take("rptr", np.int64)
        rlo, rhi = take("rlo", np.uint64), take("rhi", np.uint64)
        # the address map last, sorted one column at a time (the peak of the whole build)
        lo, hi, sc = (take("map_lo", np.uint64), take("map_hi", np.uint64),
                      take("map_scope", np.int32))
        order = np.lexsort((sc, hi, lo))
        lo = lo[order]
        hi = hi[order]
        sc = sc[order]
        del order
        return Structure(
            path=self.path, build_id=self.build_id, strings=self.strings, kind=kind,
            parent=parent, name=name, link_name=link, file=file, line=line, call_file=cfile,
            call_line=cline, target=target, range_ptr=rptr, range_lo=rlo, range_hi=rhi,
            map_lo=lo, map_hi=hi, map_scope=sc, has_calls=self.has_calls)


def concat_structures(parts: list[Structure], *, join_files: bool = False,
                      consume: bool = False) -> Structure:
    """One structure from ``parts`` built separately for the same module (each with its own
    ROOT and string table), their top-level scopes appended in order under one ROOT.

    Used to build runs of procedures of a large module in several processes. With
    ``join_files``, a part whose first scope is a FILE of the same name as the last FILE
    before it continues that FILE (its FILE row is dropped, its children move under the
    earlier one: a FILE group cut between two processes), so the result is exactly what one
    builder would have produced — strings included, since each part's strings are in
    first-use order. Vectorised per part, one column at a time; with ``consume`` each part's
    column is dropped as soon as the result's is made, so the parts and the result are never
    both whole in memory (libtorch_cpu.so: ~500 MB of columns).
    """
    if not parts:
        raise ValueError("concat_structures needs at least one part")
    first = parts[0]
    if int(first.range_ptr[1] - first.range_ptr[0]):
        raise ValueError("a part's ROOT has address ranges")
    sid: dict[str, int] = {}
    off = 1  # scopes so far, the ROOT included
    last_file, last_name = -1, ""  # the last top-level FILE so far: its index, its name
    remaps: list[npt.NDArray[np.int32]] = []
    news: list[npt.NDArray[np.int64]] = []
    keeps: list[npt.NDArray[np.bool_] | slice] = []
    for p in parts:
        ids = [sid.setdefault(x, len(sid)) for x in p.strings]
        remaps.append(np.array([*ids, -1], dtype=np.int32))  # remap[-1] == -1: no string
        # new index of each of the part's scopes (its ROOT -> 0)
        new = np.arange(-1, len(p) - 1, dtype=np.int64) + off
        new[0] = 0
        keep: npt.NDArray[np.bool_] | slice = slice(1, None)
        if (join_files and len(p) > 1 and last_file > 0 and p.kind[1] == Kind.FILE
                and p.text(int(p.name[1])) == last_name
                and p.range_ptr[2] == p.range_ptr[1]):
            keep = slice(2, None)
            new[2:] -= 1
            new[1] = last_file
        top = np.flatnonzero((p.parent == 0) & (p.kind == Kind.FILE))
        if len(top):
            last_file, last_name = int(new[top[-1]]), p.text(int(p.name[top[-1]]))
        news.append(new)
        keeps.append(keep)
        off += len(p) - (2 if keep == slice(2, None) else 1)
    strings = [""] * len(sid)
    for s_, i in sid.items():
        strings[i] = s_
    root_name = sid.get(first.path, -1)

    def column(k: str, dtype: type, root: int | None,
               piece: Callable[[int, Structure], npt.NDArray[Any]]) -> npt.NDArray[Any]:
        pieces: list[npt.NDArray[Any]] = [] if root is None else [np.array([root], dtype=dtype)]
        for j, p in enumerate(parts):
            pieces.append(np.asarray(piece(j, p), dtype=dtype))
        out: npt.NDArray[Any] = np.concatenate(pieces).astype(dtype, copy=False)
        del pieces
        if consume:
            for p in parts:
                # a new empty array, not a[:0]: a view would keep the whole buffer alive
                setattr(p, k, np.zeros(0, getattr(p, k).dtype))
        return out

    def keep_of(j: int, a: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return a[keeps[j]]

    has_calls = all(p.has_calls for p in parts)
    kind = column("kind", np.uint8, int(Kind.ROOT), lambda j, p: keep_of(j, p.kind))
    parent = column("parent", np.int32, -1, lambda j, p: news[j][keep_of(j, p.parent)])
    name = column("name", np.int32, root_name, lambda j, p: remaps[j][keep_of(j, p.name)])
    link = column("link_name", np.int32, -1, lambda j, p: remaps[j][keep_of(j, p.link_name)])
    file = column("file", np.int32, -1, lambda j, p: remaps[j][keep_of(j, p.file)])
    line = column("line", np.int32, 0, lambda j, p: keep_of(j, p.line))
    cfile = column("call_file", np.int32, -1, lambda j, p: remaps[j][keep_of(j, p.call_file)])
    cline = column("call_line", np.int32, 0, lambda j, p: keep_of(j, p.call_line))
    target = column("target", np.uint64, 0, lambda j, p: keep_of(j, p.target))
    nr = column("range_ptr", np.int64, 0, lambda j, p: np.diff(p.range_ptr)[keeps[j]])
    rptr = np.concatenate([[0], np.cumsum(nr)])
    del nr
    rlo = column("range_lo", np.uint64, None, lambda j, p: p.range_lo)
    rhi = column("range_hi", np.uint64, None, lambda j, p: p.range_hi)
    map_scope = column("map_scope", np.int32, None, lambda j, p: news[j][p.map_scope])
    map_lo = column("map_lo", np.uint64, None, lambda j, p: p.map_lo)
    map_hi = column("map_hi", np.uint64, None, lambda j, p: p.map_hi)
    order = np.lexsort((map_scope, map_hi, map_lo))  # as the builder sorts its tuples
    map_lo = map_lo[order]
    map_hi = map_hi[order]
    map_scope = map_scope[order]
    del order
    return Structure(
        path=first.path, build_id=first.build_id, strings=strings, kind=kind, parent=parent,
        name=name, link_name=link, file=file, line=line, call_file=cfile, call_line=cline,
        target=target, range_ptr=rptr.astype(np.int64), range_lo=rlo, range_hi=rhi,
        map_lo=map_lo, map_hi=map_hi, map_scope=map_scope, has_calls=has_calls)
