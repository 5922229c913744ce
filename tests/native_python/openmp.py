"""An OpenMP library called through ctypes: its worker threads run native code only."""
import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
lib.omp_work.restype = ctypes.c_double
lib.omp_work.argtypes = [ctypes.c_long]


def parallel_part() -> None:
    for _ in range(15):
        lib.omp_work(10_000_000)


parallel_part()
