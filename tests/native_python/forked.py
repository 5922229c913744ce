"""A multiprocessing 'fork' worker and its parent both call a native routine."""
import ctypes
import multiprocessing as mp
import sys

lib = ctypes.CDLL(sys.argv[1])
lib.kernel_a.restype = ctypes.c_double
lib.kernel_a.argtypes = [ctypes.c_long]


def in_child(_: int) -> float:
    return lib.kernel_a(40_000_000)


def in_parent() -> float:
    return lib.kernel_a(40_000_000)


if __name__ == "__main__":
    with mp.get_context("fork").Pool(1) as pool:
        pool.map(in_child, [0])
    in_parent()
