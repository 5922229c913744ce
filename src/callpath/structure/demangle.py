"""C++ names as people read them: libstdc++'s ``__cxa_demangle`` through ctypes (what
hpcprof's and hpcstruct's ``cplus_demangle`` give), loaded once; shared by ``callpath struct``
(procedures named from symbols) and ``callpath prof`` (frames named from symbols alone)."""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

__all__ = ["demangle"]

_cxa: Any = None
_free: Any = None


def demangle(name: str) -> str:
    """A C++ (``_Z``) name demangled by libstdc++'s ``__cxa_demangle`` (what hpcprof's
    ``cplus_demangle`` gives); any other name, or one that fails, unchanged."""
    global _cxa, _free
    if not name.startswith("_Z"):
        return name
    if _cxa is None:
        lib = ctypes.util.find_library("stdc++")
        try:
            fn = ctypes.CDLL(lib or "libstdc++.so.6").__cxa_demangle
        except (OSError, AttributeError):
            _cxa = False
            return name
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.POINTER(ctypes.c_int)]
        # looked up once: a CDLL per call cost 15 us (380k names of libtorch_cpu.so: 6 s)
        _free = ctypes.CDLL(None).free
        _free.argtypes = [ctypes.c_void_p]
        _free.restype = None
        _cxa = fn
    if _cxa is False:
        return name
    status = ctypes.c_int(0)
    ptr = _cxa(name.encode(), None, None, ctypes.byref(status))
    if not ptr or status.value != 0:
        return name
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        _free(ptr)
