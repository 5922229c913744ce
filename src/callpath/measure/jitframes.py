"""Leaving code that has no file: JIT-compiled code, trampolines, run-time patches.

Why: code written at run time (``mmap`` + ``mprotect(PROT_EXEC)``) has neither call-frame
information nor a file to analyse after the run (its bytes are gone), so a sample in it had no
caller at all: a JIT's whole program was one partial frame. Two places may hold the return
address of such a frame: the word at the stack pointer (code that has not pushed anything, as
small generated stubs and loops) and the word above a frame-pointer frame (``rbp + 8``, the
frame layout JITs use). A candidate is taken only when it is *proved* a return address: it
lies in a load module with a file, and the instruction that ends just before it is a call
(read from the file's bytes). Otherwise the path stays partial: no frame is ever guessed.
The frame in the generated code itself stays, marked by its mapping (``[jit]``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.measure.elfinfo import ElfInfo

U64 = npt.NDArray[np.uint64]
_CALL_CACHE: dict[tuple[str, int], bool] = {}


def follows_call(elf: ElfInfo, vaddr: int) -> bool:
    """Whether the instruction just before link-time address ``vaddr`` is a call.

    Decodes the 2 to 7 bytes before it (``call rel32``; ``call r/m64`` in its register and
    memory forms) and accepts only an instruction that ends exactly at ``vaddr``.
    """
    key = (elf.path, vaddr)
    hit = _CALL_CACHE.get(key)
    if hit is not None:
        return hit
    import iced_x86

    code = elf.read_code(vaddr - 7, vaddr)
    if len(code) != 7:
        code = b""  # cut by a section start: the call cannot be decoded, so it is no proof
    ok = False
    for back in (5, 2, 3, 4, 6, 7):
        if len(code) < back:
            continue
        dec = iced_x86.Decoder(64, code[len(code) - back:], ip=vaddr - back)
        ins = dec.decode()
        if (not ins.is_invalid and ins.len == back
                and ins.flow_control in (iced_x86.FlowControl.CALL,
                                         iced_x86.FlowControl.INDIRECT_CALL)):
            ok = True
            break
    _CALL_CACHE[key] = ok
    return ok


def return_candidates(sp: U64, rbp: U64, rbp_ok: npt.NDArray[np.bool_],
                      load: Any) -> list[tuple[U64, npt.NDArray[np.bool_], U64, U64,
                                               npt.NDArray[np.bool_]]]:
    """(return address, loaded, caller's sp, caller's rbp, rbp known) for each hypothesis,
    in the order they are tried: the word at sp, then the frame-pointer frame."""
    ra1, ok1 = load(sp)
    ra2, ok2 = load(rbp + np.uint64(8))
    fp2, okf = load(rbp)
    return [(ra1, ok1, sp + np.uint64(8), rbp, rbp_ok),
            (ra2, ok2 & rbp_ok, rbp + np.uint64(16), fp2, okf & rbp_ok)]


def proved(ra: U64, loaded: npt.NDArray[np.bool_], starts: U64, ends: U64,
           bias: npt.NDArray[np.int64], elves: list[ElfInfo | None]) -> npt.NDArray[np.bool_]:
    """Which candidate return addresses fall after a call in a module with a file."""
    out = np.zeros(len(ra), dtype=bool)
    if not len(starts):
        return out
    q = ra - np.uint64(1)
    k = np.searchsorted(starts, q, side="right").astype(np.int64) - 1
    inmod = loaded & (k >= 0) & (q < ends[np.maximum(k, 0)]) & (ra > 0)
    for i in np.nonzero(inmod)[0].tolist():
        elf = elves[int(k[i])]
        if elf is not None:
            out[i] = follows_call(elf, int(ra[i]) + int(bias[int(k[i])]))
    return out
