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

import numpy as np

from callpath.measure.elfinfo import ElfInfo

STUB_BYTES = 64          # a procedure this small can only forward its call
MAX_DISPATCH_BYTES = 4096  # larger procedures are not looked at (work, not a trampoline)


MAX_CALLER_BYTES = 1 << 16  # calls_through_pointer decodes procedures up to this size


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
        # per module path: (file, {ra: flags}, changed?)
        self._mods: dict[str, tuple[Path, dict[int, int], list[bool]]] = {}

    @staticmethod
    def _expect() -> dict[str, object]:
        return {"format": FORWARD_FORMAT, "version": FORWARD_VERSION, "stub": STUB_BYTES,
                "dispatch": MAX_DISPATCH_BYTES, "caller": MAX_CALLER_BYTES}

    def _read(self, file: Path) -> dict[int, int]:
        from callpath.structure import store
        got = store.load_arrays(file, self._expect())
        if got is None:
            return {}
        a = got[1]
        try:
            if len(a["ra"]) != len(a["flags"]):
                return {}
            return dict(zip(a["ra"].tolist(), a["flags"].tolist(), strict=True))
        except KeyError:
            return {}

    def _module(self, elf: ElfInfo) -> tuple[Path, dict[int, int], list[bool]] | None:
        got = self._mods.get(elf.path)
        if got is not None or self.directory is None:
            return got
        from callpath.measure.recipes import cache_name
        file = self.directory / cache_name(elf.path, elf.build_id).replace(".npz", ".fwd")
        got = self._mods[elf.path] = (file, self._read(file), [False])
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
        for file, answers, changed in self._mods.values():
            if not changed[0]:
                continue
            for ra, flags in self._read(file).items():
                answers[ra] = answers.get(ra, 0) | flags
            ras = sorted(answers)
            store.save_arrays(file, self._expect(), {
                "ra": np.array(ras, dtype=np.uint64),
                "flags": np.array([answers[r] for r in ras], dtype=np.uint8)})
            changed[0] = False
