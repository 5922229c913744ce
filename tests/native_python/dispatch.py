"""A Python program calling an operator library with a dispatcher (``dispatch.c``) through
ctypes, three ways: the operator through its dispatcher and wrapper (``op_call``), a driver
that calls through pointers in a loop (``run_callbacks``), and a dispatcher that calls into
another library (``dispatch_other``). Usage: ``python dispatch.py LIBDISPATCH LIBOTHER
ROUNDS``."""
import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
other = ctypes.CDLL(sys.argv[2])
lib.setup(ctypes.cast(other.other_kernel, ctypes.c_void_p))
for name in ("op_call", "run_callbacks", "dispatch_other"):
    getattr(lib, name).restype = ctypes.c_double
n = 20000
x = (ctypes.c_double * n)(*[float(i % 7) for i in range(n)])


def operator() -> float:
    return lib.op_call(x, ctypes.c_long(n))


def driver() -> float:
    return lib.run_callbacks(x, ctypes.c_long(n), ctypes.c_int(2))


def cross() -> float:
    return lib.dispatch_other(ctypes.c_int(1), x, ctypes.c_long(n))


total = 0.0
for _ in range(int(sys.argv[3])):
    total += operator() + driver() + cross()
print(round(total, 1))
