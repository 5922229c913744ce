"""Ends in the way argv[1] names, after some work in work(): raise, exit3, os_exit, wait (spin
until a signal ends it; prints 'ready' first), fork (a forked child works and leaves with
os._exit), none (returns normally)."""

import os
import sys


def work(n):
    s = 0
    for i in range(n):
        s += i % 7  # WORK
    return s


def spin_forever():
    while True:
        work(10_000)


if __name__ == "__main__":
    mode = sys.argv[1]
    work(3_000_000)
    if mode == "raise":
        raise RuntimeError("the script fails on purpose")
    if mode == "exit3":
        sys.exit(3)
    if mode == "os_exit":
        os._exit(5)
    if mode == "wait":
        print("ready", flush=True)
        spin_forever()
    if mode == "fork":
        pid = os.fork()
        if pid == 0:
            work(3_000_000)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
