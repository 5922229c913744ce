"""A multiprocessing Pool of 3 workers (start method from argv); every worker runs task() once:
a barrier makes sure that each of the three takes exactly one of the three tasks."""

import multiprocessing as mp
import os
import sys

_barrier = None


def init(barrier):
    global _barrier
    _barrier = barrier


def task(k):
    _barrier.wait()
    s = 0
    for i in range(1_000_000):
        s += (i ^ k) % 5  # TASK
    return os.getpid()


if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1] if len(sys.argv) > 1 else "fork")
    barrier = ctx.Barrier(3)
    with ctx.Pool(3, initializer=init, initargs=(barrier,)) as pool:
        pids = pool.map(task, range(3), chunksize=1)
    print(len(set(pids)))
