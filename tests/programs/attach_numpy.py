"""A Python program for `callpath run --pid --native`: matrix products in numpy (its BLAS, with
worker threads) until the file argv[1] exists; prints "ready" once running and "done" at the
end, and exits 0."""
import os
import sys

import numpy as np

a = np.random.default_rng(1).random((400, 400))


def main() -> None:
    print("ready", flush=True)
    total = 0.0
    while not os.path.exists(sys.argv[1]):
        total += float((a @ a).sum())  # MATMUL_LINE
    print("done" if total > 0 else "wrong", flush=True)


main()
