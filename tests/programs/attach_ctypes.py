"""A Python program for `callpath run --pid --native`: kernel_a (work N) called through ctypes
from small_part only, kernel_b (work 2N) from large_part only, alternating, until the file
argv[2] exists (argv[1]: the library, tests/native_python/kernels.c); it prints "ready" once
running and "done" at the end, and exits 0."""
import ctypes
import os
import sys

lib = ctypes.CDLL(sys.argv[1])
for name in ("kernel_a", "kernel_b"):
    getattr(lib, name).restype = ctypes.c_double
    getattr(lib, name).argtypes = [ctypes.c_long]
N = int(os.environ.get("KERNEL_N", "30000000"))


def small_part() -> float:
    return float(lib.kernel_a(N))  # SMALL_LINE


def large_part() -> float:
    return float(lib.kernel_b(2 * N))  # LARGE_LINE


def main() -> None:
    print("ready", flush=True)
    total = 0.0
    while not os.path.exists(sys.argv[2]):
        total += small_part()
        total += large_part()
    print("done" if total > 0 else "wrong", flush=True)


main()
