"""Work in the code objects that a Python file's structure cannot name by line alone: a
coroutine whose loop body ends in an ``if`` (CPython 3.11 gives that loop's back edge no line),
a module-level lambda, a generator expression and a class body. Argument: the number of loop
iterations per part (each part runs a few tenths of a second at 1,000,000)."""

import asyncio
import sys

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000


async def spin(n):
    s = 0
    for i in range(n):  # LOOPHEAD
        s += i
        if i % 1000 == 999:
            s -= 1
    return s


def evens(n):
    return sum(x for x in range(n) if x % 2 == 0)  # GENEXPR


triple = lambda x: x * 3 % 7  # noqa: E731  LAMBDA


class Table:  # CLASSBODY
    total = 0
    for i in range(N):
        total += i


print(asyncio.run(spin(2 * N)), evens(2 * N), sum(map(triple, range(N))), Table.total)
