"""The executable load map of one address space over time, from the kernel's mapping records.

Why a module of its own: the kernel reports every executable mapping change as a new record,
and programs change their mappings in ways a naive "last record wins" map gets wrong:

- *code patched at run time*: UCX's memory hooks (loaded by MPICH and Open MPI), LD_AUDIT tools
  and hot patchers ``mprotect`` a page of libc writable, write into it and ``mprotect`` it back;
  the kernel reports that page as a new 4 KiB mapping of libc at the same file offset. Such a
  record changes only its own range, and the page is still libc's code for unwinding and
  attribution (``pieces`` splits the older mapping around it, then joins the pieces again
  where file and offsets continue);
- *unmapping and reuse*: a library ``dlclose``d between phases and another loaded at the same
  address. Records carry times, so the map is kept in *epochs*: a new epoch starts only when a
  record changes what an already mapped address means (another file or another offset), and a
  sample is resolved with the map of the epoch it was taken in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Mapping:
    time: int
    start: int
    end: int
    pgoff: int
    path: str
    build_id: str

    def same_code(self, other: Mapping) -> bool:
        """Whether both map their common addresses to the same bytes of the same file."""
        return (self.path == other.path
                and (not self.build_id or not other.build_id or self.build_id == other.build_id)
                and self.pgoff - self.start == other.pgoff - other.start)


def module_name(path: str) -> str:
    """The module name of an executable mapping: code without a file (anonymous memory, a
    named anonymous mapping, a memfd) was written at run time, by a JIT or a patcher, and is
    named ``[jit]`` (``[jit:NAME]``) so that reports mark it as such."""
    if path in ("//anon", ""):
        return "[jit]"
    if path.startswith("[anon:") and path.endswith("]"):
        return f"[jit:{path[6:-1]}]"
    if path.startswith("/memfd:"):
        return f"[jit:memfd:{path[7:].removesuffix(' (deleted)')}]"
    return path


def pieces(mappings: list[Mapping]) -> list[Mapping]:
    """The load map after ``mappings`` (in time order), sorted by start, without overlaps.

    A later mapping replaces only the range it covers: the parts of older mappings on either
    side stay, with their file offsets. Adjacent pieces of one file whose offsets continue are
    joined, so a library with patched pages is one module again.
    """
    kept: list[Mapping] = []
    for m in sorted(mappings, key=lambda m: m.time):
        nxt: list[Mapping] = []
        for k in kept:
            if k.end <= m.start or k.start >= m.end:
                nxt.append(k)
                continue
            if k.start < m.start:
                nxt.append(replace(k, end=m.start))
            if k.end > m.end:
                nxt.append(replace(k, start=m.end, pgoff=k.pgoff + (m.end - k.start)))
        nxt.append(m)
        kept = nxt
    kept.sort(key=lambda m: m.start)
    out: list[Mapping] = []
    for k in kept:
        last = out[-1] if out else None
        if last is not None and last.end == k.start and last.same_code(k):
            out[-1] = replace(last, end=k.end, build_id=last.build_id or k.build_id)
        else:
            out.append(k)
    return out


def epoch_starts(mappings: list[Mapping]) -> list[int]:
    """Times at which the map changes what an already mapped address means (first: 0).

    A record that maps new addresses, or maps the same file at the same offsets again (a
    patched page), does not start an epoch; one that puts other code where code was does.
    """
    starts = [0]
    current: list[Mapping] = []
    for m in sorted(mappings, key=lambda m: m.time):
        if any(not (k.end <= m.start or k.start >= m.end) and not k.same_code(m)
               for k in current):
            starts.append(m.time)
        current = pieces([*current, m])
    return starts


def epochs(mappings: list[Mapping]) -> list[tuple[int, list[Mapping]]]:
    """(start time, load map) of each epoch; the map holds every mapping made before the
    next epoch starts (code mapped in the middle of an epoch is new code, not a change)."""
    starts = epoch_starts(mappings)
    bounds = [*starts[1:], None]
    out = []
    for t0, t1 in zip(starts, bounds, strict=True):
        upto = [m for m in mappings if t1 is None or m.time < t1]
        out.append((t0, pieces(upto)))
    return out


def epoch_of(starts: list[int], times: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """The epoch of each sample time."""
    k = np.searchsorted(np.array(starts, dtype=np.uint64), times, side="right") - 1
    return np.maximum(k, 0).astype(np.int64)
