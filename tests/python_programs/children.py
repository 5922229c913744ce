"""Starts a Python subprocess and a concurrent.futures process pool of 2 workers."""

import concurrent.futures as cf
import multiprocessing as mp
import subprocess
import sys


def square_sum(n):
    s = 0
    for i in range(n):
        s += i * i  # POOLWORK
    return s


if __name__ == "__main__":
    code = "s = 0\nfor i in range(400_000):\n    s += i % 3\n"
    subprocess.run([sys.executable, "-c", code], check=True)
    with cf.ProcessPoolExecutor(max_workers=2, mp_context=mp.get_context("spawn")) as ex:
        print(sum(ex.map(square_sum, [300_000, 300_000])))
