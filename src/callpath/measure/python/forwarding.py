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

import bisect

from callpath.measure.elfinfo import ElfInfo

STUB_BYTES = 64          # a procedure this small can only forward its call
MAX_DISPATCH_BYTES = 4096  # larger procedures are not looked at (work, not a trampoline)


MAX_CALLER_BYTES = 1 << 16  # calls_through_pointer decodes procedures up to this size


def _procedure(elf: ElfInfo, ra: int, limit: int) -> tuple[int, int, bytes] | None:
    starts, ends, _names = elf.symbols()
    i = bisect.bisect_right(starts, ra - 1) - 1
    if i < 0 or ra - 1 >= ends[i] or ends[i] - starts[i] > limit:
        return None
    data = elf.read_code(starts[i], ends[i])
    return (starts[i], ends[i], data) if len(data) == ends[i] - starts[i] else None


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
