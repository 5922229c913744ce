"""A hot loop on one known line (HOT) and a colder one (COLD); prints the measured CPU and wall
time of each phase as JSON on stdout, for the profile's shares to be checked against."""

import json
import sys
import time


def hot(n):
    s = 0
    for i in range(n): s += i * i % 7  # noqa: E701  HOT
    return s


def cold(n):
    parts = []
    for i in range(n): parts.append(str(i) * 2)  # noqa: E701  COLD
    return len(parts)


def main(scale):
    c0, w0 = time.thread_time(), time.perf_counter()
    hot(int(4_000_000 * scale))
    c1, w1 = time.thread_time(), time.perf_counter()
    cold(int(1_500_000 * scale))
    c2, w2 = time.thread_time(), time.perf_counter()
    print(json.dumps({"hot_cpu": c1 - c0, "cold_cpu": c2 - c1,
                      "hot_wall": w1 - w0, "cold_wall": w2 - w1}))


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0)
