"""Recursion of a known depth whose innermost call spins in a leaf function."""

import sys


def leaf(n):
    s = 0
    for i in range(n):
        s += i & 3  # LEAF
    return s


def descend(depth, n):
    if depth == 0:
        return leaf(n)  # BOTTOM
    return descend(depth - 1, n)  # RECURSE


if __name__ == "__main__":
    depth = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    for _ in range(3):
        descend(depth, 400_000)  # TOP
