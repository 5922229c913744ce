"""Linux kernel frames of HPCToolkit measurements, named from ``kernel_symbols/vmlinux.*``.

With perf events, hpcrun records kernel call chains: their frames name a load module whose
path is relative, ``kernel_symbols/vmlinux.<host id>``, a file hpcrun writes into the
measurement directory (an xz-compressed ``/proc/kallsyms`` listing: ``address type name
[module]`` per line). hpcprof (``src/hpcprof/finalizers/kernelsyms.cpp``) resolves such a frame
to the text symbol (type ``t`` or ``T``) with the greatest address at or below it, the first
listed among equal addresses, with no upper bound, and puts a function context named
``name [module] [vmlinux]`` there, reached by a call, with no line or instruction below it.
A frame below every symbol, or a file that is missing or cannot be decompressed, is left to the
ordinary path (an instruction context), as hpcprof leaves it.
"""

from __future__ import annotations

import lzma
from pathlib import Path

import numpy as np
import numpy.typing as npt

KERNEL_NAME = "[vmlinux]"  # LINUX_KERNEL_NAME in HPCToolkit's linux_info.h
_cache: dict[str, KernelSymbols | None] = {}


def is_kernel_symbols(lm_path: str) -> bool:
    """Whether a load module of an hpcrun load map is a kernel symbol file (a relative path
    inside a ``kernel_symbols/`` directory, as hpcprof decides)."""
    p = Path(lm_path)
    return not p.is_absolute() and p.parent.name == "kernel_symbols"


class KernelSymbols:
    """Sorted text-symbol addresses of one kernel and the function names hpcprof gives them."""

    def __init__(self, addrs: npt.NDArray[np.uint64], names: list[str]) -> None:
        self.addrs, self.names = addrs, names

    @classmethod
    def parse(cls, text: str) -> KernelSymbols:
        """Symbols of a kallsyms listing; lines that do not parse are skipped (hpcprof logs
        them and goes on)."""
        addrs: list[int] = []
        names: list[str] = []
        for line in text.splitlines():
            f = line.split()
            if len(f) < 3 or len(f[1]) != 1 or f[1] not in "tT":
                continue
            try:
                a = int(f[0], 16)
            except ValueError:
                continue
            if not 0 <= a < 1 << 64:
                continue
            addrs.append(a)
            names.append(" ".join([f[2], *f[3:4], KERNEL_NAME]))
        arr = np.array(addrs, dtype=np.uint64)
        order = np.argsort(arr, kind="stable")
        # equal addresses: the first listed wins
        keep = np.ones(len(order), dtype=bool)
        keep[1:] = arr[order][1:] != arr[order][:-1]
        order = order[keep]
        return cls(arr[order], [names[i] for i in order])

    @classmethod
    def of_file(cls, path: Path) -> KernelSymbols | None:
        """The symbols of an xz-compressed listing (memoised per path); None when the file is
        absent or unreadable, as hpcprof then names no kernel function."""
        key = str(path)
        if key not in _cache:
            try:
                with lzma.open(path, "rt", encoding="utf-8", errors="replace") as f:
                    text = f.read()
            except (OSError, lzma.LZMAError, EOFError):
                _cache[key] = None
            else:
                _cache[key] = cls.parse(text)
        return _cache[key]

    def find(self, ip: int) -> tuple[int, str] | None:
        """(symbol address, function name) of the symbol containing ``ip``."""
        i = int(np.searchsorted(self.addrs, np.uint64(ip), side="right")) - 1
        if i < 0:
            return None
        return int(self.addrs[i]), self.names[i]
