"""What a signal handler reading the interpreter's frames must survive, at a high rate.

Every kind of call from C into Python (``map``, ``sorted``'s key, ``functools.reduce``,
``__lt__``/``__hash__``/``__eq__`` slots called by ``sorted`` and ``set``, ``__call__`` through
``tp_call``, ``__del__`` from the garbage collector), generators and ``yield from``, exceptions
raised and caught through many frames, code objects compiled, run and freed (imports of fresh
modules: a frame's code object can die between two samples), the cyclic garbage collector,
and threads doing the same at once. Each part returns a number that depends on every step, and
the program prints their sum: the test compares it with the value computed without a sampler
(``expected``), so a run that goes wrong in any way, not only a crash, fails.

Usage: ``python stress.py SCALE`` (work grows linearly with SCALE; 1 is about 0.3 s here).
"""
from __future__ import annotations

import functools
import gc
import sys
import threading
import time
import types
from collections.abc import Iterator


class Key:
    """Compared, hashed and called from C (sort, set, map over a bound __call__)."""

    __slots__ = ("v",)

    def __init__(self, v: int) -> None:
        self.v = v

    def __lt__(self, other: Key) -> bool:
        return self.v < other.v

    def __hash__(self) -> int:
        return self.v * 7919

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and self.v == other.v

    def __call__(self, x: int) -> int:
        return x ^ self.v


def callbacks(n: int) -> int:
    s = sum(map(lambda x: x + 1, range(n)))
    s += sorted(range(n // 4), key=lambda x: -x)[0]
    s += functools.reduce(lambda a, b: a ^ b, range(n // 4), 0)
    keys = [Key((i * 37) % 1009) for i in range(n // 16)]
    s += len(set(keys)) + sorted(keys)[-1].v
    s += sum(map(Key(5), range(n // 8)))
    return s


def _inner(k: int) -> Iterator[int]:
    for i in range(k):
        yield i * i


def _outer(k: int) -> Iterator[int]:
    yield from _inner(k)
    yield from (j + 1 for j in _inner(k))


def generators(n: int) -> int:
    return sum(_outer(n // 4)) + sum(x for x in range(n // 4) if x % 3)


def _raise(depth: int) -> int:
    if depth == 0:
        raise ValueError(depth)
    return _raise(depth - 1) + 1


def exceptions(n: int) -> int:
    caught = 0
    for i in range(n // 50):
        try:
            _raise(20 + i % 10)
        except ValueError:
            caught += 1
        try:
            {}[i]
        except KeyError:
            caught += 2
    return caught


def fresh_code(n: int) -> int:
    """Modules built, run through map (a C caller) and dropped: their code objects die."""
    total = 0
    for i in range(n // 500):
        mod = types.ModuleType(f"stress_mod_{i}")
        exec(compile(f"def f(x):\n    return x * {i} + 1\n", f"<stress {i}>", "exec"),
             mod.__dict__)
        total += sum(map(mod.f, range(200)))
        del mod
    return total


class Node:
    """Cycles with a finalizer: the collector calls __del__ (Python) from C."""

    def __init__(self, sink: list[int]) -> None:
        self.sink = sink
        self.other: Node | None = None

    def __del__(self) -> None:
        self.sink.append(1)


def garbage(n: int) -> int:
    sink: list[int] = []
    want = 2 * (n // 200)
    for _ in range(n // 200):
        a, b = Node(sink), Node(sink)
        a.other, b.other = b, a
    del a, b
    for _ in range(1000):  # another thread's collection may be under way: then ours is not
        gc.collect()
        if len(sink) >= want:
            break
        time.sleep(0.001)
    return len(sink)


def work(n: int) -> int:
    return callbacks(n) + generators(n) + exceptions(n) + fresh_code(n) + garbage(n)


def expected(scale: int) -> int:
    """What the program prints: 3 threads and the main thread each do work(n)."""
    return 4 * work(100_000 * scale)


def main(scale: int) -> int:
    n = 100_000 * scale
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(work(n)), name=f"stress_{i}")
               for i in range(3)]
    for t in threads:
        t.start()
    results.append(work(n))
    for t in threads:
        t.join()
    return sum(results)


if __name__ == "__main__":
    print(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1))
