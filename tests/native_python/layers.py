"""Layers called as objects, as PyTorch calls its modules: ``layer(x)`` goes through the
type's ``tp_call`` slot (``slot_tp_call``, vectorcall: CPython's C code) into a new
activation of the evaluation loop, so every two Python frames of a layer have the
interpreter's frames between them; the innermost layer's ``forward`` calls a C kernel through
ctypes. Usage: ``python layers.py LIBKERNELS ROUNDS``."""
import ctypes
import os
import sys

lib = ctypes.CDLL(sys.argv[1])
lib.kernel_a.restype = ctypes.c_double
lib.kernel_a.argtypes = [ctypes.c_long]
N = int(os.environ.get("KERNEL_N", "2000000"))


class Layer:
    def __init__(self, inner: "Layer | None") -> None:
        self.inner = inner

    def __call__(self, n: int) -> float:
        return self.forward(n)

    def forward(self, n: int) -> float:
        if self.inner is None:
            return lib.kernel_a(n)
        return self.inner(n) + 1.0


model = Layer(Layer(Layer(Layer(None))))
total = 0.0
for _ in range(int(sys.argv[2])):
    total += model(N)
print(round(total, 3))
