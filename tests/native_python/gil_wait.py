"""A thread that keeps waiting for the GIL (tests/test_run_native_python.py): one thread holds
the GIL in a pure-Python loop; the other sleeps 2 ms at a time, and the GIL it gave up for
the sleep is taken by the spinner, which hands it back only after a switch interval (set to
20 ms). Nearly all of the sleeper's life is therefore spent waiting for the GIL at the sleep's
line. Prints the time the sleeper spent inside the sleep calls (its own clock) as ``waited
SECONDS``. (A read that returns at once would not do: its thread usually takes the GIL back
before the spinner has woken up to take it.)"""

from __future__ import annotations

import sys
import threading
import time

CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 60
sys.setswitchinterval(0.02)
stop = False


def spin() -> int:
    x = 0
    while not stop:
        x += 1
    return x


def sleeper(out: list[float]) -> None:
    total = 0.0
    for _ in range(CALLS):
        t0 = time.perf_counter()
        time.sleep(0.002)  # the GIL wait: this line
        total += time.perf_counter() - t0
    out.append(total)


spinner = threading.Thread(target=spin, name="spinner")
spinner.start()
got: list[float] = []
t = threading.Thread(target=sleeper, args=(got,), name="gil-sleeper")
t.start()
t.join()
stop = True
spinner.join()
print(f"waited {got[0]:.6f}")
