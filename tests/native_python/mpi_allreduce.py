"""mpi4py: a pure-Python loop, then Allreduce of a numpy buffer, on every rank."""
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD


def compute() -> int:
    t = 0
    for i in range(200_000):
        t += i % 5
    return t


def exchange() -> None:
    buf = np.ones(100_000)
    out = np.empty_like(buf)
    for _ in range(100):
        comm.Allreduce(buf, out, op=MPI.SUM)


compute()
exchange()
