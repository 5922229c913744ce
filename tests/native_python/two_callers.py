"""kernel_a (work N) called from small_part, kernel_b (work 2N) from large_part, alternating."""
import ctypes
import os
import sys

lib = ctypes.CDLL(sys.argv[1])
for name in ("kernel_a", "kernel_b"):
    getattr(lib, name).restype = ctypes.c_double
    getattr(lib, name).argtypes = [ctypes.c_long]
N = int(os.environ.get("KERNEL_N", "3000000"))


def small_part() -> float:
    return lib.kernel_a(N)


def large_part() -> float:
    return lib.kernel_b(2 * N)


for _ in range(int(sys.argv[2])):
    small_part()
    large_part()
