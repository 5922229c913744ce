"""Which native frames of a merged ``--native`` path only pass a call on (the trampolines of a
library), so that the merge can leave them out between two frames of interest.

A C++ library with a dispatcher puts several frames between the function a user called and
the one that does the work: PyTorch's ``at::native::linear`` reaches
``torch::autograd::VariableType::addmm`` through ``at::_ops::addmm::call`` (which looks the
kernel up in the operator's dispatch table and calls it through a pointer) and
``c10::impl::wrap_kernel_functor_unboxed_<...>::call`` (a template wrapper that moves the
arguments and calls), and again for every dispatch key. Those frames say which machinery ran,
not what work was done, and they double the depth at which the operator and the BLAS kernel
appear. They are recognised from their machine code, not from their names, so that the rule
holds for any library built this way:

- a **stub**: a procedure of at most ``STUB_BYTES`` bytes of code that returns (a wrapper, an
  adaptor, a thunk: that little code can only move arguments and call);
- a **dispatcher**: a procedure without a loop that made the call to the next frame through a
  pointer (``call *%reg`` / ``call *mem``: a dispatch table, a virtual method, a kernel
  pointer): it decides where the call goes and goes there once.

The merge elides such a frame only where the frame it called is in the same load module (a
library's own call machinery between two of its frames), never the innermost frame (where
the time is spent) nor the outermost. A procedure with a loop that calls through a pointer (a
driver iterating over callbacks, a pass manager) keeps its frame, and so does a call from one
library into another. ``--keep-interpreter-frames`` keeps every frame.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.measure.elfinfo import ElfInfo

STUB_BYTES = 64          # a procedure this small can only forward its call
MAX_DISPATCH_BYTES = 4096  # larger procedures are not looked at (work, not a trampoline)


MAX_CALLER_BYTES = 1 << 16  # calls_through_pointer decodes procedures up to this size

#: the symbols the merge looks for in every module its stacks pass through: CPython's
#: evaluation loop (where Python frames belong) and ``take_gil`` (a thread waiting for the
#: GIL; the symbol may carry a compiler suffix such as ``take_gil.lto_priv.0``)
NAMED_KINDS = ("eval", "gil")
EVAL_SYMBOLS = frozenset({"_PyEval_EvalFrameDefault"})
GIL_SYMBOLS = frozenset({"take_gil"})  # 3.11 to 3.13
_NAMED_KEYS = tuple(f"{k}_{e}" for k in NAMED_KINDS for e in ("lo", "hi"))
#: per kind: sorted [lo, hi) link-time ranges
NamedRanges = dict[str, tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]]


def named_ranges(elf: ElfInfo) -> NamedRanges:
    """Where a module's evaluation-loop and ``take_gil`` symbols lie: each symbol's range up
    to the next symbol's start, so that an address in it is one that symbolizing would name
    so (the symbols are searched for by name in the string tables, no other name decoded)."""
    t = elf.symbol_table()
    starts = np.asarray(t.starts, dtype=np.uint64)
    ends = np.asarray(t.ends, dtype=np.uint64)
    if len(starts):
        ends = np.minimum(ends, np.append(starts[1:], np.uint64(np.iinfo(np.uint64).max)))
    ev = t.named(EVAL_SYMBOLS)
    gil = t.named(GIL_SYMBOLS, dotted=True) & ~ev
    return {"eval": (starts[ev], ends[ev]), "gil": (starts[gil], ends[gil])}


def in_ranges(addr: npt.NDArray[np.uint64],
              ranges: tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]
              ) -> npt.NDArray[np.bool_]:
    """Whether each address lies in one of the sorted disjoint ``ranges``."""
    lo, hi = ranges
    if not len(lo):
        return np.zeros(len(addr), dtype=bool)
    i = np.searchsorted(lo, addr, side="right").astype(np.int64) - 1
    inside: npt.NDArray[np.bool_] = (i >= 0) & (addr < hi[np.maximum(i, 0)])
    return inside


def _procedure(elf: ElfInfo, ra: int, limit: int) -> tuple[int, int, bytes] | None:
    # the symbol arrays, not ``elf.symbols()``: that decodes every name (libtorch_cpu.so's
    # 380k, ~1 s) where only the procedure around ``ra`` is wanted
    t = elf.symbol_table()
    i = int(t.starts.searchsorted(ra - 1, side="right")) - 1
    if i < 0:
        return None
    lo, hi = int(t.starts[i]), int(t.ends[i])
    if ra - 1 >= hi or hi - lo > limit:
        return None
    data = elf.read_code(lo, hi)
    return (lo, hi, data) if len(data) == hi - lo else None


def calls_through_pointer(elf: ElfInfo, ra: int) -> bool:
    """Whether the call that returns to link-time address ``ra`` of ``elf`` is indirect
    (``call *%reg``, ``call *mem``): how an interpreter reaches an extension's function (a
    method's or a type slot's pointer), unlike its direct calls into the C library."""
    from callpath.structure.cfg import ICALL, decode

    got = _procedure(elf, ra, MAX_CALLER_BYTES)
    if got is None:
        return False
    lo, hi, data = got
    code = decode(data, lo, lo, hi)
    try:
        return code.kind[code.end.index(ra)] == ICALL
    except ValueError:
        return False


def forwards(elf: ElfInfo, ra: int) -> bool:
    """Whether the frame that returns to link-time address ``ra`` of ``elf`` is a stub or a
    dispatcher (module docstring). False where its procedure, its code or the call before
    ``ra`` cannot be read."""
    from callpath.structure.cfg import CALL, ICALL, RETURN, build_cfg, decode
    from callpath.structure.havlak import find_loops

    got = _procedure(elf, ra, MAX_DISPATCH_BYTES)
    if got is None:
        return False
    lo, hi, data = got
    code = decode(data, lo, lo, hi)
    try:
        k = code.end.index(ra)
    except ValueError:
        return False  # no instruction ends at ra: not a call site of this procedure
    if code.kind[k] not in (CALL, ICALL) or RETURN not in code.kind:
        return False
    if hi - lo <= STUB_BYTES:
        return True
    if code.kind[k] != ICALL:
        return False
    graph = build_cfg(code, lo, hi)
    loops, _inner = find_loops(graph.succ)
    return not loops


FORWARD_FORMAT, FORWARD_VERSION = "callpath-forwarding", 1
_FWD_KNOWN, _FWD_YES, _PTR_KNOWN, _PTR_YES = 1, 2, 4, 8


class ForwardCache:
    """The answers of :func:`forwards` and :func:`calls_through_pointer` that earlier merges
    found, per module file identity (build-id, else path, size and modification time).

    Each answer decodes the procedure around a return address (and for a dispatcher builds
    its control flow graph): about half a second for the ~1,400 frames of a PyTorch loop's
    stacks, the same at every run of the same program. An answer depends only on the
    module's bytes and on the rules of this module (``FORWARD_VERSION`` and the byte limits
    are in the file's header), so it is kept in ``DIR/<name>-<id>.fwd`` beside the unwind
    rows (:func:`callpath.measure.recipes.cache_dir`). A file that cannot be read or
    written costs only the decoding."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        # per module path: (file, {ra: flags}, changed?, [named ranges or None])
        self._mods: dict[str, tuple[Path, dict[int, int], list[bool],
                                    list[NamedRanges | None]]] = {}

    @staticmethod
    def _expect() -> dict[str, object]:
        return {"format": FORWARD_FORMAT, "version": FORWARD_VERSION, "stub": STUB_BYTES,
                "dispatch": MAX_DISPATCH_BYTES, "caller": MAX_CALLER_BYTES}

    def _read(self, file: Path) -> tuple[dict[int, int], NamedRanges | None]:
        from callpath.structure import store
        got = store.load_arrays(file, self._expect())
        if got is None:
            return {}, None
        a = got[1]
        named: NamedRanges | None = None
        if all(k in a for k in _NAMED_KEYS):
            named = {k: (a[k + "_lo"].astype(np.uint64), a[k + "_hi"].astype(np.uint64))
                     for k in NAMED_KINDS}
        try:
            if len(a["ra"]) != len(a["flags"]):
                return {}, named
            return dict(zip(a["ra"].tolist(), a["flags"].tolist(), strict=True)), named
        except KeyError:
            return {}, named

    def _module(self, elf: ElfInfo) -> tuple[Path, dict[int, int], list[bool],
                                             list[NamedRanges | None]] | None:
        got = self._mods.get(elf.path)
        if got is not None or self.directory is None:
            return got
        from callpath.measure.recipes import cache_name
        file = self.directory / cache_name(elf.path, elf.build_id).replace(".npz", ".fwd")
        answers, named = self._read(file)
        got = self._mods[elf.path] = (file, answers, [False], [named])
        return got

    def named_ranges(self, elf: ElfInfo) -> NamedRanges:
        """:func:`named_ranges`, from the cache when an earlier merge read them (the symbol
        table of each module a stack passes through: 0.1-0.3 s a run for a PyTorch loop's)."""
        m = self._module(elf)
        if m is not None and m[3][0] is not None:
            return m[3][0]
        got = named_ranges(elf)
        if m is not None:
            m[3][0] = got
            m[2][0] = True
        return got

    def _ask(self, elf: ElfInfo, ra: int, known: int, yes: int,
             compute: Callable[[ElfInfo, int], bool]) -> bool:
        m = self._module(elf)
        flags = m[1].get(ra, 0) if m is not None else 0
        if flags & known:
            return bool(flags & yes)
        got = compute(elf, ra)
        if m is not None:
            m[1][ra] = flags | known | (yes if got else 0)
            m[2][0] = True
        return got

    def forwards(self, elf: ElfInfo, ra: int) -> bool:
        """:func:`forwards`, from the cache when an earlier run answered it."""
        return self._ask(elf, ra, _FWD_KNOWN, _FWD_YES, forwards)

    def calls_through_pointer(self, elf: ElfInfo, ra: int) -> bool:
        """:func:`calls_through_pointer`, from the cache when an earlier run answered it."""
        return self._ask(elf, ra, _PTR_KNOWN, _PTR_YES, calls_through_pointer)

    def save(self) -> None:
        """Write the modules this run added answers to, merged with what their file holds
        now (another process's merge may have added to it since)."""
        from callpath.structure import store
        for file, answers, changed, named in self._mods.values():
            if not changed[0]:
                continue
            disk, disk_named = self._read(file)
            for ra, flags in disk.items():
                answers[ra] = answers.get(ra, 0) | flags
            ras = sorted(answers)
            arrays: dict[str, npt.NDArray[Any]] = {
                "ra": np.array(ras, dtype=np.uint64),
                "flags": np.array([answers[r] for r in ras], dtype=np.uint8)}
            ranges = named[0] if named[0] is not None else disk_named
            if ranges is not None:
                for k, (lo, hi) in ranges.items():
                    arrays[k + "_lo"], arrays[k + "_hi"] = lo, hi
            store.save_arrays(file, self._expect(), arrays)
            changed[0] = False
