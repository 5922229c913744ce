"""Two worker threads with different work (arithmetic and strings), one sleeper; the main
thread waits in join(). Prints each thread's measured CPU time as JSON."""

import json
import threading
import time

cpu = {}


def arithmetic(n):
    s = 0
    for i in range(n):
        s += i * i % 11  # ARITH
    cpu["arith"] = time.thread_time()
    time.sleep(0.2)  # TAIL: a sample here carries the CPU used since the last one
    return s


def strings(n):
    out = 0
    for i in range(n):
        out += len(str(i) + "x")  # STRINGS
    cpu["strings"] = time.thread_time()
    time.sleep(0.2)  # TAIL
    return out


def sleeper(seconds):
    time.sleep(seconds)  # SLEEP


def main():
    ts = [threading.Thread(target=arithmetic, args=(4_000_000,), name="arith"),
          threading.Thread(target=strings, args=(2_500_000,), name="strings"),
          threading.Thread(target=sleeper, args=(0.4,), name="sleeper")]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(json.dumps(cpu))


if __name__ == "__main__":
    main()
