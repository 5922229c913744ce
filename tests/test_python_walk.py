"""The C stack walk of the Python sampler (``_callpath_walk.c``) against the Python walk it
replaces: for real frames of every kind (plain calls, deep recursion past its inline buffer,
generators, coroutines, comprehensions, class bodies, a frame inside a call to C, threads), both
give the same stack id, and the C walk reports a miss exactly when the Python one does."""

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

STACK_OF, WALKER = S._c_walk()
pytestmark = pytest.mark.skipif(
    STACK_OF is None, reason="the C stack walk (_callpath_walk.c) was not built: no compiler "
    "or Python headers when callpath was installed")


def python_walk(smp: S.Sampler, frame: FrameType) -> int | None:
    """The handler's Python walk (sampler.py), as a function."""
    key: list[int] = []
    f: FrameType | None = frame
    try:
        while f is not None:
            key.append(smp.locs_of[id(f.f_code)][f.f_lasti])
            f = f.f_back
        return smp.stacks[tuple(key)]
    except KeyError:
        return None


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
        assert python_walk(smp, frame) is None, name
        v = smp._new_stack(frame)
        assert v >= 0, name
        assert STACK_OF(frame, smp.locs_of, smp.stacks) == python_walk(smp, frame) == v, name
    ids = [smp._new_stack(f) for _, f in frames]
    assert len(set(ids)) == len(ids)  # every kind is its own call path
    # a location missing from a known code object's table is a miss, not an error
    name, frame = frames[1]
    smp.locs_of[id(frame.f_code)].clear()
    assert STACK_OF(frame, smp.locs_of, smp.stacks) is None
    assert python_walk(smp, frame) is None


@pytest.mark.parametrize("args", [(), (None, {}, {}), (sys._getframe(), [], {}),
                                  (sys._getframe(), {}, None), (1, 2, 3, 4)])
def test_c_walk_rejects_wrong_arguments(args: tuple[Any, ...]) -> None:
    assert STACK_OF is not None
    call: Callable[..., Any] = STACK_OF
    with pytest.raises(TypeError):
        call(*args)
