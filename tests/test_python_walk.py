"""The C stack walk of the Python sampler (``_callpath_walk.c``) against its Python walk
(``sampler.py_stack_of``, used where the C one is not built): for real frames of every kind
(plain calls, deep recursion past its inline buffer, generators, coroutines, comprehensions,
class bodies, a frame inside a call to C, threads), both give the same stack id, and the C
walk reports a miss exactly when the Python one does."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from callpath.measure.python import sampler as S

MODULE, WALKER = S._c_walk()
STACK_OF = MODULE.stack_of if MODULE is not None else None
pytestmark = pytest.mark.skipif(
    MODULE is None, reason="the C stack walk (_callpath_walk.c) was not built: no compiler "
    "or Python headers when callpath was installed")


def frames_of_every_kind() -> Iterator[tuple[str, FrameType]]:
    here = sys._getframe
    yield "plain", here()

    def deep(n: int) -> FrameType:
        return deep(n - 1) if n else here()
    for n in (0, 63, 64, 65, 300):  # the C walk keeps 64 locations inline, then grows
        yield f"recursion {n}", deep(n)

    def gen() -> Iterator[FrameType]:
        yield here()
    yield "generator", next(gen())

    async def coro() -> FrameType:
        return here()
    yield "coroutine", asyncio.run(coro())
    yield "comprehension", [here() for _ in range(1)].pop()

    class Body:
        frame = here()
    yield "class body", Body.frame
    yield "inside a call to C", next(iter(map(lambda _: here(), [0])))
    box: list[FrameType] = []
    t = threading.Thread(target=lambda: box.append(here()))
    t.start()
    t.join()
    yield "thread", box[0]


def test_c_walk_agrees_with_python_walk(tmp_path: Path) -> None:
    smp = S.Sampler(str(tmp_path), 1000.0, False)
    assert STACK_OF is not None and smp.walker == "C"
    frames = list(frames_of_every_kind())
    for name, frame in frames:
        # unseen: both miss; after the slow path interned it, both find the same stack
        assert STACK_OF(frame, smp.locs_of, smp.stacks) is None, name
        assert S.py_stack_of(frame, smp.locs_of, smp.stacks) is None, name
        v = smp._new_stack(frame)
        assert v >= 0, name
        assert STACK_OF(frame, smp.locs_of, smp.stacks) == v, name
        assert S.py_stack_of(frame, smp.locs_of, smp.stacks) == v, name
    ids = [smp._new_stack(f) for _, f in frames]
    assert len(set(ids)) == len(ids)  # every kind is its own call path
    # a location missing from a known code object's table is a miss, not an error
    name, frame = frames[1]
    smp.locs_of[id(frame.f_code)].clear()
    assert STACK_OF(frame, smp.locs_of, smp.stacks) is None
    assert S.py_stack_of(frame, smp.locs_of, smp.stacks) is None


def test_cache_gives_the_answers_of_the_tables(tmp_path: Path) -> None:
    """One thread's cache through a sequence of stacks that share prefixes of every length,
    repeat, go deeper than its inline buffers, and change tables (as after a fork): every
    answer equals the uncached walk's, including misses."""
    assert MODULE is not None and STACK_OF is not None
    smp = S.Sampler(str(tmp_path), 1000.0, False)
    cache = MODULE.Cache()
    frames = [f for _, f in frames_of_every_kind()]

    def leaves(n: int, out: list[FrameType]) -> None:
        out.append(sys._getframe())  # a leaf at every depth, and a second site on one line
        if n:
            leaves(n - 1, out); out.append(sys._getframe())  # noqa: E702
    def chain_of(n: int) -> Iterator[list[FrameType]]:
        # called from a generator, whose suspended frame ends the chains: the test's own
        # frames go on running, so a walk through them would change between two calls
        out: list[FrameType] = []
        leaves(n, out)
        yield out
    chain = next(chain_of(200))
    sequence = frames + chain + chain[::-1] + frames[::-1] + chain[::7] + frames
    for f in sequence[: len(sequence) // 2]:  # half of them interned: the others miss
        smp._new_stack(f)
    for f in sequence:
        assert STACK_OF(f, smp.locs_of, smp.stacks, cache) == STACK_OF(
            f, smp.locs_of, smp.stacks), f
    for f in sequence:
        smp._new_stack(f)
    for f in sequence + sequence[::-1]:
        v = S.py_stack_of(f, smp.locs_of, smp.stacks)
        assert v is not None and STACK_OF(f, smp.locs_of, smp.stacks, cache) == v
    # new tables (a fork's reset): the cache must not answer from the old ones
    fresh = S.Sampler(str(tmp_path / "fresh"), 1000.0, False)
    for f in sequence:
        assert STACK_OF(f, fresh.locs_of, fresh.stacks, cache) is None
    # a cleared stack table (the sampler clears it when full) answers as before
    v = [STACK_OF(f, smp.locs_of, smp.stacks, cache) for f in frames]
    smp.stacks.clear()
    assert [STACK_OF(f, smp.locs_of, smp.stacks) for f in frames] == [None] * len(frames)
    assert [smp._new_stack(f) for f in frames] == v


@pytest.mark.parametrize("args", [(), (None, {}, {}), (sys._getframe(), [], {}),
                                  (sys._getframe(), {}, None), (sys._getframe(), {}, {}, 1),
                                  (1, 2, 3, 4, 5)])
def test_c_walk_rejects_wrong_arguments(args: tuple[Any, ...]) -> None:
    assert STACK_OF is not None
    call: Callable[..., Any] = STACK_OF
    with pytest.raises(TypeError):
        call(*args)
