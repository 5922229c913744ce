"""The C stack walk of the Python sampler (``_callpath_walk.c``) against its Python walk
(``sampler.py_stack_of``, used where the C one is not built): for real frames of every kind
(plain calls, deep recursion past its inline buffer, generators, coroutines, comprehensions,
class bodies, a frame inside a call to C, threads), both give the same stack id, and the C
walk reports a miss exactly when the Python one does."""

from __future__ import annotations

import array
import asyncio
import gc
import signal
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

from callpath.formats import measdir
from callpath.measure.python import measfile
from callpath.measure.python import sampler as S
from callpath.measure.python import walk as W

MODULE, WALKER = W.c_walk()
STACK_OF = MODULE.stack_of if MODULE is not None else None
pytestmark = pytest.mark.skipif(
    MODULE is None, reason="the C stack walk (_callpath_walk.c) was not built: no compiler "
    "or Python headers when callpath was installed")


_HELD: list[Iterator[Any]] = []


def held_next(gen: Iterator[Any]) -> Any:
    """``next(gen)``, with ``gen`` kept suspended for the rest of the run. From CPython 3.12 a
    generator that finishes (or is collected, which closes it) gives its frame a back link to
    the frame that ran it then: here a test function that goes on running, so a walk through
    the chain would see its line change between two calls. A generator left suspended ends
    the chain (its frame's f_back is None), as every finished one did on 3.11."""
    _HELD.append(gen)
    return next(gen)


def every_kind() -> list[tuple[str, FrameType]]:
    """The frames of :func:`frames_of_every_kind`, its generator left suspended (held_next)."""
    gen = frames_of_every_kind()
    out = [held_next(gen)]
    for item in gen:
        if item[0] == "end":
            break  # suspended at its last yield: the chains of the frames above end there
        out.append(item)
    return out


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
    if sys.version_info < (3, 12):  # PEP 709: from 3.12 a comprehension has no frame of its own
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
    yield "end", here()


def test_c_walk_agrees_with_python_walk(tmp_path: Path) -> None:
    smp = S.Sampler(str(tmp_path), 1000.0, False)
    assert STACK_OF is not None and smp.walker == "C"
    frames = every_kind()
    for name, frame in frames:
        # unseen: both miss; after the slow path interned it, both find the same stack
        assert STACK_OF(frame, smp.locs_of, smp.stacks) is None, name
        assert W.py_stack_of(frame, smp.locs_of, smp.stacks) is None, name
        v = smp._new_stack(frame)
        assert v >= 0, name
        assert STACK_OF(frame, smp.locs_of, smp.stacks) == v, name
        assert W.py_stack_of(frame, smp.locs_of, smp.stacks) == v, name
    ids = [smp._new_stack(f) for _, f in frames]
    assert len(set(ids)) == len(ids)  # every kind is its own call path
    # a location missing from a known code object's table is a miss, not an error
    name, frame = frames[1]
    smp.locs_of[id(frame.f_code)].clear()
    assert STACK_OF(frame, smp.locs_of, smp.stacks) is None
    assert W.py_stack_of(frame, smp.locs_of, smp.stacks) is None


def test_cache_gives_the_answers_of_the_tables(tmp_path: Path) -> None:
    """One thread's cache through a sequence of stacks that share prefixes of every length,
    repeat, go deeper than its inline buffers, and change tables (as after a fork): every
    answer equals the uncached walk's, including misses."""
    assert MODULE is not None and STACK_OF is not None
    smp = S.Sampler(str(tmp_path), 1000.0, False)
    cache = MODULE.Cache()
    frames = [f for _, f in every_kind()]

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
    chain = held_next(chain_of(200))
    sequence = frames + chain + chain[::-1] + frames[::-1] + chain[::7] + frames
    for f in sequence[: len(sequence) // 2]:  # half of them interned: the others miss
        smp._new_stack(f)
    for f in sequence:
        assert STACK_OF(f, smp.locs_of, smp.stacks, cache) == STACK_OF(
            f, smp.locs_of, smp.stacks), f
    for f in sequence:
        smp._new_stack(f)
    for f in sequence + sequence[::-1]:
        v = W.py_stack_of(f, smp.locs_of, smp.stacks)
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


# ---- the C signal handler (_callpath_walk.Handler) ------------------------------------------

def _sampler(path: Path, walk: str, monkeypatch: pytest.MonkeyPatch) -> S.Sampler:
    monkeypatch.setenv(W.ENV_WALK, walk)
    smp = S.Sampler(str(path), 1000.0, True)
    smp._open()
    return smp


def _paths(smp: S.Sampler) -> dict[tuple[tuple[str, int], ...], int]:
    """Samples per call path (code name and line, root first) in the file the sampler wrote,
    idle or not (idleness depends on the clocks, the call paths do not)."""
    proc = measdir.read_process(smp.path)
    (t,) = proc.threads
    names = [c.function for c in proc.pycode]
    addr, mod = t.nodes["address"], t.nodes["module"]
    out: dict[tuple[tuple[str, int], ...], int] = {}
    for node in np.flatnonzero(t.samples[:, measfile.METRIC_CPU]):
        key = tuple((names[mod[n]], int(addr[n])) for n in t.path_of(int(node))[1:])
        out[key] = out.get(key, 0) + int(t.samples[node, measfile.METRIC_CPU])
    assert sum(out.values()) == t.stats["samples"]
    return out


def test_c_handler_writes_what_the_python_handler_writes(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The C handler and the Python one, given the same real frames (every kind, and a chain
    of 200 with leaves at every depth), write the same call paths with the same numbers of
    samples, and the same number of trace records."""
    frames = [f for _, f in every_kind()]

    def leaves(n: int, out: list[FrameType]) -> None:
        out.append(sys._getframe())
        if n:
            leaves(n - 1, out)

    def chain_of(n: int) -> Iterator[list[FrameType]]:
        out: list[FrameType] = []
        leaves(n, out)
        yield out
    sequence = frames + held_next(chain_of(200)) * 2 + frames
    written = []
    for walk in ("", "python"):
        smp = _sampler(tmp_path / (walk or "c"), walk, monkeypatch)
        handler = smp.make_handler()
        assert (type(handler).__name__ == "Handler") == (walk == "")
        for f in sequence:
            handler(signal.SIGPROF, f)
        smp.finish("exit", 0)
        assert smp.samples == len(sequence) and smp.errors == 0 and smp.dropped == 0
        (t,) = measdir.read_process(smp.path).threads
        assert len(t.trace) == len(sequence)
        written.append(_paths(smp))
    assert written[0] == written[1]
    assert len(written[0]) == len(frames) + 201  # each kind of frame, each depth of the chain


def test_c_handler_drains_into_the_aggregate(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    smp = _sampler(tmp_path, "", monkeypatch)
    handler = smp.make_handler()
    def suspended() -> Iterator[FrameType]:
        yield sys._getframe()
    frame = held_next(suspended())  # a stack that does not change between the calls
    for _ in range(5):
        handler(signal.SIGPROF, frame)
    v = W.py_stack_of(frame, smp.locs_of, smp.stacks)
    agg: dict[int, list[int]] = {}
    trace = array.array("q")
    assert smp._drain is not None
    smp._drain(agg, trace)
    # one stack; its samples are idle or not depending on the clocks (the key's low bit)
    assert v is not None and {k >> 1 for k in agg} == {v}
    assert sum(r[0] for r in agg.values()) == 5
    assert all(r[2] > 0 for r in agg.values())  # wall-clock time between the calls
    assert len(trace) == 10 and sorted(trace[1::2]) == sorted(
        k for k, r in agg.items() for _ in range(r[0]))
    assert sorted(trace[0::2]) == trace[0::2].tolist()  # times, in order
    smp._drain(agg, trace)  # nothing new
    assert sum(r[0] for r in agg.values()) == 5 and len(trace) == 10
    for _ in range(3):
        handler(signal.SIGPROF, frame)
    keys = set(agg)
    smp._drain(agg, None)  # merged into the rows of the same keys; no trace wanted
    assert sum(r[0] for r in agg.values()) == 8 and len(trace) == 10
    assert {k >> 1 for k in agg} == {v} and len(agg) <= 2 and keys <= set(agg)
    smp.finish("exit", 0)


def test_c_handler_drops_when_busy_and_counts_errors(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    smp = _sampler(tmp_path, "", monkeypatch)
    handler = smp.make_handler()
    smp.busy = True  # a flush, fork or exit in progress
    handler(signal.SIGPROF, sys._getframe())
    handler(signal.SIGPROF, None)  # no frame (a signal outside Python code)
    smp.busy = False
    assert smp.dropped == 2 and smp.samples == 0

    monkeypatch.setattr(smp, "_new_stack", _sampler_code_failing(RuntimeError))
    stopped: list[bool] = []
    monkeypatch.setattr(smp.timer, "stop", lambda: stopped.append(True))
    for i in range(12):  # a new stack each time: every call takes the slow path
        (lambda: handler(signal.SIGPROF, sys._getframe()))()
        assert smp.errors == i + 1
    assert stopped == [True, True]  # gave up after 10 errors (11th and 12th)
    smp.finish("exit", 0)


def _sampler_code_failing(exc: type[BaseException]) -> Callable[[FrameType], int]:
    """A slow path that fails in the sampler's own code: a function compiled as a line of
    walk.py, so that the traceback names only the sampler's file."""
    ns: dict[str, Any] = {"exc": exc}
    exec(compile("def broken(frame):\n    raise exc('slow path failed')\n", W.__file__, "exec"),
         ns)
    return ns["broken"]  # type: ignore[no-any-return]


class Timeout(Exception):
    """What a program's SIGALRM handler raises."""


def program_alarm(frame: FrameType) -> int:
    raise Timeout("the program's own handler ran inside the sampler's")


@pytest.mark.parametrize("walk", ["", "python"])
def test_the_programs_exceptions_pass_through_the_handler(tmp_path: Path, walk: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Python runs a signal handler between any two instructions, the sampler's handler's
    included: Ctrl-C during a sample raises the program's KeyboardInterrupt there, a SIGALRM
    handler of the program its exception. The handler (C and Python) raises those on into
    the program, uncounted, and swallows only its own failures. Swallowing Ctrl-C left
    ``callpath profile`` of a spinning program waiting for it forever (1 run in 6 on 3.11)."""
    smp = _sampler(tmp_path, walk, monkeypatch)
    for slow, raised in ((_sampler_code_failing(KeyboardInterrupt), KeyboardInterrupt),
                         (_sampler_code_failing(SystemExit), SystemExit),
                         (program_alarm, Timeout)):
        monkeypatch.setattr(smp, "_new_stack", slow)  # (the Python handler binds it)
        handler = smp.make_handler()
        assert (type(handler).__name__ == "Handler") == (walk == "")
        with pytest.raises(raised):
            (lambda: handler(signal.SIGPROF, sys._getframe()))()
        assert smp.errors == 0 and not smp.busy
    monkeypatch.setattr(smp, "_new_stack", _sampler_code_failing(ValueError))
    handler = smp.make_handler()
    (lambda: handler(signal.SIGPROF, sys._getframe()))()  # the sampler's own: swallowed
    assert smp.errors == 1
    smp.finish("exit", 0)


def test_c_handler_is_collected_with_its_sampler(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler holds its handler and the handler its sampler: the cycle is collectable
    (a fork's child replaces both)."""
    smp = _sampler(tmp_path, "", monkeypatch)
    smp.handler = smp.make_handler()
    ref = weakref.ref(smp)
    smp.finish("exit", 0)
    del smp
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("args", [(), (1,), (1, 2, 3)])
def test_c_handler_rejects_wrong_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           args: tuple[Any, ...]) -> None:
    assert MODULE is not None
    smp = _sampler(tmp_path, "", monkeypatch)
    handler: Callable[..., Any] = smp.make_handler()
    with pytest.raises(TypeError):
        handler(*args)
    with pytest.raises(TypeError):
        MODULE.Handler(smp, [], {}, None, 0, 0, 0, False, 1, 1, 20, len)
    with pytest.raises(TypeError):
        MODULE.Handler(smp, {}, {}, 5, 0, 0, 0, False, 1, 1, 20, len)
    with pytest.raises(TypeError):
        MODULE.Handler(smp, {}, {}, None, 0, 0, 0, False, 1, 1, 20, 7)
    assert smp._drain is not None
    with pytest.raises(TypeError):
        smp._drain([], None)
    smp.finish("exit", 0)


def test_c_walk_agrees_with_python_walk_on_live_frames(tmp_path: Path) -> None:
    """The walks from inside running frames of every kind, as the handler sees them (the
    test above walks frames that have finished): the C walk and the Python walk give the
    stack id that the slow path gave."""
    assert STACK_OF is not None
    smp = S.Sampler(str(tmp_path), 1000.0, False)
    seen: list[str] = []

    def probe(name: str) -> bool:
        frame = sys._getframe(1)
        v = smp._new_stack(frame)
        assert v >= 0, name
        assert (STACK_OF(frame, smp.locs_of, smp.stacks),
                W.py_stack_of(frame, smp.locs_of, smp.stacks)) == (v, v), name
        seen.append(name)
        return True

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        else:
            probe(f"recursion {depth}")
    for depth in (0, 63, 64, 65, 300):
        deep(depth)

    def gen() -> Iterator[int]:
        probe("generator")
        yield 1
        probe("generator resumed")
    list(gen())

    async def inner() -> None:
        probe("coroutine")
        await asyncio.sleep(0)
        probe("coroutine resumed")

    async def outer() -> None:
        await inner()
    asyncio.run(outer())
    assert [probe("comprehension") for _ in range(1)]

    class Body:
        probe("class body")
    list(map(lambda _: probe("inside a call to C"), [0]))
    t = threading.Thread(target=probe, args=("thread",))
    t.start()
    t.join()
    assert len(seen) == 13, seen


@pytest.mark.skipif(not hasattr(MODULE, "other_stacks"),
                    reason="other_stacks is built for CPython 3.12 and 3.13 only (3.11 walks "
                    "other threads through frame objects)")
def test_other_stacks_are_the_frame_objects_walk() -> None:
    """Other threads' frames read from CPython's frame records (what the sampler uses from
    3.12, where following ``f_back`` from another thread's frames corrupts memory) are the
    frames and offsets that ``sys._current_frames()`` and ``f_back`` give: threads blocked
    in a recursion, in a generator, in a callback from C (``map``), and none for the
    calling thread."""
    assert MODULE is not None
    ready, go = threading.Barrier(4), threading.Event()

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        else:
            ready.wait()
            go.wait()

    def in_generator() -> None:
        def g() -> Iterator[None]:
            ready.wait()
            go.wait()
            yield None
        next(g())

    def in_callback() -> None:
        list(map(lambda _: (ready.wait(), go.wait()), [0]))

    threads = [threading.Thread(target=f) for f in (lambda: deep(40), in_generator,
                                                     in_callback)]
    for t in threads:
        t.start()
    try:
        ready.wait()
        got = MODULE.other_stacks(threading.get_ident())
        ref: dict[int, list[tuple[Any, int]]] = {}
        for ident, top in sys._current_frames().items():
            f: FrameType | None = top
            ref[ident] = []
            while f is not None:
                ref[ident].append((f.f_code, f.f_lasti))
                f = f.f_back
    finally:
        go.set()
        for t in threads:
            t.join()
    assert threading.get_ident() not in got
    for t in threads:
        assert t.ident is not None
        assert got[t.ident] == ref[t.ident], (got[t.ident], ref[t.ident])
    assert sum(1 for co, _ in got[threads[0].ident or 0] if co.co_name == "deep") == 41


def _tables(smp: S.Sampler) -> tuple[Any, ...]:
    return (smp.codes, smp.locs, smp.loc_ids, smp.stack_paths, smp.line_stacks, smp.stacks,
            {ci: dict(t) for ci, t in enumerate(smp.locs_of[id(co)] for co in smp.codes)})


def test_c_slow_path_builds_the_python_slow_paths_tables(tmp_path: Path) -> None:
    """``intern_stack`` (the slow path in C) and the slow path in Python, fed the same frames
    in the same order, answer the same and build equal tables, entry for entry: live frames of
    every kind, finished ones, past the inline buffers, and frames caught by a real signal in
    a loop without calls, which 3.11 catches at a back edge that has no line (left to the
    Python rule, ``loc``)."""
    c = S.Sampler(str(tmp_path / "c"), 1000.0, False)
    py = S.Sampler(str(tmp_path / "py"), 1000.0, False)
    assert c.c_intern is not None
    py.c_intern = None
    answers: list[tuple[int, int]] = []

    def both(frame: FrameType) -> None:
        answers.append((c._new_stack(frame), py._new_stack(frame)))

    def probe() -> bool:
        both(sys._getframe(1))
        return True

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        else:
            probe()
    for depth in (0, 127, 128, 129, 400):  # the inline buffers hold 128 frames
        deep(depth)

    def gen() -> Iterator[int]:
        probe()
        yield 1
        probe()
    list(gen())
    assert [probe() for _ in range(2)]
    list(map(lambda _: probe(), [0]))
    for _, frame in every_kind():  # finished frames: walked through their objects
        both(frame)

    caught = [0]

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        assert frame is not None
        both(frame)
        caught[0] += 1
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
    try:
        y = 0
        for i in range(10**12):  # no call in the loop: the signal is taken at its back edge
            if caught[0] >= 30:
                break
            if i & 1:  # a body ending in an if: 3.11 gives the back edge no line
                y += 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, old)
    assert [a for a, _ in answers] == [b for _, b in answers]
    assert all(a >= 0 for a, _ in answers)
    assert _tables(c) == _tables(py)
    assert len(c.stack_paths) >= 15
    if sys.version_info < (3, 12):
        assert c.line_tables, "no sample at a back edge without a line: the rule was not used"


def test_line_at_is_co_lines() -> None:
    """The line the C slow path takes for an offset (``PyCode_Addr2Line``) is the line that
    ``co_lines()`` gives the range holding it, at every instruction of every code object of a
    few large standard modules (no line: 0 or -1 from C, None or 0 from ``co_lines``)."""
    import importlib
    import types

    def codes(co: types.CodeType) -> Iterator[types.CodeType]:
        yield co
        for k in co.co_consts:
            if isinstance(k, types.CodeType):
                yield from codes(k)
    assert MODULE is not None
    n = 0
    for name in ("typing", "inspect", "argparse", "asyncio.base_events", "dataclasses"):
        path = importlib.import_module(name).__file__
        assert path is not None
        with open(path, encoding="utf-8") as src:
            top = compile(src.read(), path, "exec")
        for co in codes(top):
            for start, end, line in co.co_lines():
                for off in range(start, end, 2):
                    got = MODULE.line_at(co, off)
                    assert (got if got > 0 else None) == (line or None), (co, off)
                    n += 1
    assert n > 50_000
