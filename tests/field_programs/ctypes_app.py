"""Python calling C through ctypes: two Python functions call the library's c_compute.
Usage: python ctypes_app.py LIBCWORK SECONDS"""

import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
lib.c_compute.argtypes = [ctypes.c_double]
lib.c_compute.restype = ctypes.c_double


def short_phase(seconds: float) -> float:
    return lib.c_compute(seconds)


def long_phase(seconds: float) -> float:
    return lib.c_compute(seconds)


if __name__ == "__main__":
    s = float(sys.argv[2])
    print(short_phase(s) + long_phase(2 * s))
