"""The sampler's frame walking: the signal handler (in C where ``_callpath_walk.c`` is built,
else a Python closure), the walk of other threads, and the slow path that interns new code
objects, offsets and stacks.

Runs inside the measured program, loaded by path by ``sampler.py`` (standard library only, no
import of the ``callpath`` package or of the other modules beside it). Why a module of its own:
this is the code that runs a thousand times a second inside the program, written for its cost
(closures over local bindings, subscripts rather than method calls); keeping it apart from the
file writing and the life cycle keeps that discipline in one place. :class:`Walker` is the
half of ``Sampler`` that samples; it calls the writing half (``measfile.Recorder``) only to
register a thread and to flush.
"""

from __future__ import annotations

import _thread
import os
import sys
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from callpath.measure.python.timer import Timer

# "python": the handler and the walk in Python even where the C ones are built; "c-walk": the
# handler in Python, the walk in C (for measuring what each part costs)
ENV_WALK = "CALLPATH_PY_WALK"

IDLE_CPU_SHARE = 20  # IDLE when cpu * 20 < wall, i.e. under 5% of one CPU
OTHERS_BUDGET = 50  # sample other threads at most every 50 x the CPU time it took last time
STACK_CACHE = 50_000  # entries of the offset-keyed stack cache before it is cleared
FLUSH_NS = 1_000_000_000  # flush at least once a second ...
TRACE_FLUSH = 2 * 8192  # ... or when the trace holds this many samples (two integers each)


def call_opcodes() -> frozenset[int]:
    import opcode
    return frozenset(v for k, v in opcode.opmap.items() if k.startswith(("CALL", "PRECALL")))


def backward_jumps() -> tuple[dict[int, int], int]:
    """This interpreter's backward-jump opcodes with their inline cache entries (code units
    between the jump and the offset its argument counts from), and ``EXTENDED_ARG``."""
    import opcode
    caches = getattr(opcode, "_inline_cache_entries", None)
    jumps: dict[int, int] = {}
    for name, op in opcode.opmap.items():
        if "JUMP_BACKWARD" in name:
            n = 0
            if isinstance(caches, dict):  # 3.13: by name
                n = int(caches.get(name, 0))
            elif isinstance(caches, list | tuple) and op < len(caches):  # 3.11, 3.12
                n = int(caches[op])
            jumps[op] = n
    return jumps, int(opcode.opmap.get("EXTENDED_ARG", -1))


_BACK_JUMPS, _EXTENDED_ARG = backward_jumps()


def line_table(co: CodeType) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``co.co_lines()`` as (range starts, lines), with a line for every range that has one
    to give.

    CPython 3.11 gives the back edge of a loop whose body ends in an ``if`` no line (the
    ``JUMP_BACKWARD`` after the ``if`` body); 3.12 gives it the line of the loop's ``for`` or
    ``while``. Such a back edge is where the interpreter checks for pending signals in a loop
    without calls, so *every* sample of that loop lands on it: without a line it fell back to
    the ``def`` line (a coroutine's whole loop appeared at ``async def``). A range without a
    line whose instruction is a backward jump gets the line of the jump's target, the loop
    header, as 3.12 locates it; other ranges without a line keep -1 (the first line)."""
    starts: list[int] = []
    lines: list[int] = []
    for start, _end, line in co.co_lines():
        starts.append(start)
        lines.append(line if line else -1)  # None, or 0 (the module's RESUME)
    if -1 in lines and _BACK_JUMPS:
        code = co.co_code
        n = len(code)
        for k, start in enumerate(starts):
            if lines[k] >= 0:
                continue
            i, arg = start, 0
            while i + 1 < n and code[i] == _EXTENDED_ARG:
                arg = (arg | code[i + 1]) << 8
                i += 2
            caches = _BACK_JUMPS.get(code[i]) if i + 1 < n else None
            if caches is None:
                continue
            target = i + 2 + 2 * caches - 2 * (arg | code[i + 1])
            j = bisect_right(starts, target) - 1
            if 0 <= target < start and j >= 0:
                lines[k] = lines[j]
    # tuples of ints, which the garbage collector stops visiting (lists it would visit at every
    # collection, for as long as the sampler keeps them)
    return tuple(starts), tuple(lines)


def call_flags(call_ops: frozenset[int]) -> bytes:
    """``call_ops`` as 256 flags, one per opcode, for ``_callpath_walk.intern_stack``."""
    return bytes(1 if op in call_ops else 0 for op in range(256))


def c_walk() -> tuple[Any, str]:
    """The C stack walk and handler (``_callpath_walk.c``, built by ``pip install`` when a
    compiler and Python's headers are there) for this interpreter, loaded by path like this
    module; else None, and the handler walks in Python. Returns its module and the walker's
    name for the metadata: ``C`` (C handler and walk), ``C walk`` (``CALLPATH_PY_WALK=c-walk``:
    the handler in Python), or ``python`` with the reason."""
    choice = os.environ.get(ENV_WALK, "")
    if choice == "python":
        return None, "python (CALLPATH_PY_WALK=python)"
    try:
        import importlib.machinery
        import importlib.util
        here = os.path.dirname(os.path.abspath(__file__))
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(here, "_callpath_walk" + suffix)
            if os.path.exists(path):
                spec = importlib.util.spec_from_file_location("_callpath_walk", path)
                if spec is None or spec.loader is None:
                    break
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                if all(callable(getattr(mod, name, None))
                       for name in ("stack_of", "Cache", "Handler")):
                    return mod, "C walk (CALLPATH_PY_WALK=c-walk)" if choice == "c-walk" else "C"
    except (ImportError, OSError, AttributeError):
        pass
    return None, "python (no C walk built for this interpreter)"


def stack_key(locations: list[int]) -> bytes:
    """A stack's key in the sampler's ``stacks``: its locations, leaf first, as 32-bit
    integers (``_callpath_walk.c``'s ``stack_key``); ``line_stacks`` keys its (code index,
    line) pairs the same way. Bytes, not tuples: no container for the garbage collector to
    count and visit, where a program's start makes one at most samples."""
    return array("i", locations).tobytes()


def py_stack_of(frame: FrameType, locs_of: dict[int, dict[int, int]],
                stacks: dict[bytes, int], cache: Any = None) -> int | None:
    """The stack walk in Python, where the C one (``_callpath_walk.stack_of``, same signature
    and answer) is not built: ``stacks`` of the frames' locations leaf first, or None when a
    code object, offset or stack is new (the slow path's business). ``cache`` is ignored.
    Subscripts, not ``.get``: they are specialised bytecodes, not method calls."""
    key: list[int] = []
    ap = key.append
    f: FrameType | None = frame
    try:
        while f is not None:
            ap(locs_of[id(f.f_code)][f.f_lasti])
            f = f.f_back
        return stacks[stack_key(key)]
    except KeyError:
        return None


_STDLIB = os.path.dirname(os.__file__)


def program_exception(exc: BaseException, own_files: frozenset[str]) -> bool:
    """Whether an exception raised inside the sampler's handler is the program's (see
    ``_handler_error``): not an ``Exception``, or raised through a frame of code outside the
    sampler's files and the standard library (a signal handler of the program)."""
    if not isinstance(exc, Exception):
        return True
    tb = exc.__traceback__
    while tb is not None:
        f = tb.tb_frame.f_code.co_filename
        if f not in own_files and not f.startswith((_STDLIB, "<frozen")):
            return True
        tb = tb.tb_next
    return False


class Walker:
    """The sampling half of :class:`Sampler` (``sampler.py``). The attributes below are the
    sampler's per-process state (set by ``Sampler._reset``) that this half reads and updates;
    ``own_files`` are the files the sampler's code is in (a sample whose leaf is there is the
    sampler's own), and the two callables are the writing half's."""

    trace: bool
    period_ns: int
    timer: Timer
    call_ops: frozenset[int]
    stack_of: Callable[..., int | None]
    other_stacks: Callable[[int], dict[int, list[tuple[CodeType, int]]]] | None
    c_handler: Callable[..., Any] | None
    own_files: frozenset[str]
    main_ident: int
    threads: dict[int, list[Any]]
    locs_of: dict[int, dict[int, int]]
    locs: list[int]
    loc_ids: dict[int, int]
    stacks: dict[bytes, int]
    line_stacks: dict[bytes, int]
    code_index: dict[int, int]
    codes: list[CodeType]
    line_tables: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]
    c_intern: Callable[[FrameType, tuple[Any, ...]], int] | None
    c_tables: tuple[Any, ...]
    stack_paths: list[bytes]
    busy: bool
    dropped: int
    errors: int
    last_flush: int
    last_others: int
    others_gap: int
    _drain: Callable[[dict[int, list[int]], Any], None] | None
    _flush_locked: Callable[[], None]
    _thread_state: Callable[[int, int, int], list[Any]]

    def make_handler(self) -> Callable[[int, FrameType | None], None]:
        """The main thread's SIGPROF handler: the C one (``_callpath_walk.Handler``) where it
        is built, else this closure. Both do the same per sample: read two clocks, map each
        frame to a location (``locs_of[id(code)][f_lasti]``: recursion through different call
        sites of one line gives one key, not one per combination), look the stack up, and add
        the sample to the thread's aggregate, which is what gets written; anything new (a code
        object, an offset, a stack) takes the slow path once, other threads and the periodic
        flush are visited from here. The C handler aggregates in its own table, which
        ``_flush_locked`` drains first.
        """
        st = self.threads[self.main_ident]
        if self.c_handler is not None:
            h = self.c_handler(self, self.locs_of, self.stacks, st[5], st[1], st[2],
                               self.last_flush, self.trace, FLUSH_NS, TRACE_FLUSH,
                               IDLE_CPU_SHARE, _thread._count)
            self._drain = h.drain
            return cast(Callable[[int, FrameType | None], None], h)
        self._drain = None
        return self._py_handler(st)

    def _py_handler(self, st: list[Any]) -> Callable[[int, FrameType | None], None]:
        """The handler in Python, as a closure over local bindings (the fastest lookups
        CPython has): every bytecode here runs about a thousand times a second with cold
        caches (the program evicts them between samples)."""
        stacks = self.stacks
        locs_of = self.locs_of
        walk_new = self._new_stack
        mono = time.monotonic_ns
        tcpu = time.thread_time_ns
        n_others = _thread._count
        agg = st[3]
        trace = st[4] if self.trace else None
        cache = st[5]
        share = IDLE_CPU_SHARE
        sampler = self
        stack_of = self.stack_of

        def on_sample(signum: int, frame: FrameType | None) -> None:
            if sampler.busy or frame is None:
                sampler.dropped += 1
                return
            sampler.busy = True
            try:
                t = mono()
                c = tcpu()
                v = stack_of(frame, locs_of, stacks, cache)  # C or Python; None: a miss
                if v is None:
                    v = walk_new(frame)
                if v < 0:  # the signal hit the sampler's own code (finishing, forking)
                    return
                dc = c - st[2]
                wall = t - st[1]
                k = v << 1 | (dc * share < wall)
                try:
                    r = agg[k]
                    r[0] += 1
                    r[1] += dc
                    r[2] += wall
                except KeyError:
                    agg[k] = [1, dc, wall]
                if trace is not None:
                    trace.append(t)
                    trace.append(k)
                st[1] = t
                if n_others():
                    sampler._maybe_others(t)
                if t - sampler.last_flush >= FLUSH_NS or (
                        trace is not None and len(trace) >= TRACE_FLUSH):
                    sampler._flush_locked()
                # The handler's own CPU time is the profiler's, not the program's; it is taken
                # as the handler's wall-clock time (reading a CPU clock costs 5 times more).
                st[2] = c + mono() - t
            except BaseException as e:
                if sampler._handler_error(e):
                    raise  # the program's (Ctrl-C's KeyboardInterrupt ...): see _handler_error
            finally:
                sampler.busy = False

        return on_sample

    def _handler_error(self, exc: BaseException) -> bool:
        """An exception ended the handler: True if it is the program's, to be raised on, else
        the sampler's own, never raised into the program (after a few the sampler gives up).

        Python runs signal handlers between any two instructions, the handler's own
        included: Ctrl-C during a sample raises the program's ``KeyboardInterrupt`` (or a
        ``SIGALRM`` handler of the program its ``TimeoutError``) inside the handler, and
        swallowing it would leave the program running, deaf to the interrupt. An exception
        that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``), or that passed
        through code neither the sampler's nor the standard library's, is the program's."""
        if program_exception(exc, self.own_files):
            return True
        self.errors += 1
        if self.errors > 10:
            self.timer.stop()
        return False

    def _maybe_others(self, t: int) -> None:
        """Sample the other threads, unless the last walk of them was too recent: many
        threads make it long, so it is kept under ~2% of the time by visiting them less often
        (their weights still cover every interval). Its cost is measured in CPU time, which
        preemption does not inflate."""
        if t - self.last_others >= self.others_gap:
            c0 = time.thread_time_ns()
            self._sample_others(t)
            self.others_gap = (time.thread_time_ns() - c0) * OTHERS_BUDGET
            self.last_others = t

    def _sample_others(self, t: int) -> None:
        """Sample every thread but the main one (which the handler sampled from its frame)."""
        threads = self.threads
        stacks = self.stacks
        locs_of = self.locs_of
        cpu_of = time.clock_gettime_ns
        clock_of = time.pthread_getcpuclockid
        main = self.main_ident
        trace = self.trace
        stack_of = self.stack_of
        other = self.other_stacks
        # 3.12+: the other threads' frame records, without frame objects (f_back on another
        # thread's frames corrupts memory in CPython 3.12.1 and 3.13.0: _callpath_walk.c)
        frames: dict[int, Any] = other(main) if other is not None else sys._current_frames()
        for ident, top in frames.items():
            if ident == main:
                continue
            try:
                c = cpu_of(clock_of(ident))
            except OSError:
                continue  # the thread is exiting
            st = threads.get(ident)
            if st is None or c < st[2]:  # new thread, or a new one reusing an ident
                # its CPU clock started at zero; its wall time is counted from one period ago
                st = self._thread_state(ident, 0, t - self.period_ns)
            if other is not None:
                v = self._stack_of_sites([s[0] for s in top], [s[1] for s in top])
            else:
                found = stack_of(top, locs_of, stacks, st[5])
                v = self._new_stack(top) if found is None else found
            if v < 0:
                continue
            dc = c - st[2]
            wall = t - st[1]
            k = v << 1 | (dc * IDLE_CPU_SHARE < wall)
            r = st[3].get(k)
            if r is None:
                st[3][k] = [1, dc, wall]
            else:
                r[0] += 1
                r[1] += dc
                r[2] += wall
            if trace:
                st[4].append(t)
                st[4].append(k)
            st[1] = t
            st[2] = c
        if len(threads) > len(frames):
            for ident in [i for i in threads if i not in frames and i != main]:
                del threads[ident]

    # ---- the slow path: new code objects, offsets and stacks ----------------------------------

    def _register(self, co: CodeType) -> dict[int, int]:
        """Intern a code object (kept alive, so that its id stays unique); its line table is
        read when an offset needs it (``line_table_of``)."""
        ci = len(self.codes)
        self.code_index[id(co)] = ci
        self.codes.append(co)
        table: dict[int, int] = {}
        self.locs_of[id(co)] = table
        return table

    def line_table_of(self, ci: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The line table (``line_table``) of the code object of index ``ci``, read once."""
        table = self.line_tables.get(ci)
        if table is None:
            table = self.line_tables[ci] = line_table(self.codes[ci])
        return table

    def _loc(self, co: CodeType, lasti: int) -> int:
        """The location of a byte offset: its line, and whether it is a call (NATIVE)."""
        ci = self.code_index[id(co)]
        if lasti < 0:
            line, native = co.co_firstlineno, 0
        else:
            starts, lines = self.line_table_of(ci)
            i = bisect_right(starts, lasti) - 1
            line = lines[i] if i >= 0 else -1
            if line < 0:
                line = co.co_firstlineno
            ops = co.co_code
            native = 1 if lasti < len(ops) and ops[lasti] in self.call_ops else 0
        loc = (ci << 32 | line & 0xFFFFFFFF) << 1 | native
        lid = self.loc_ids.get(loc)
        if lid is None:
            locs = self.locs
            lid = self.loc_ids[loc] = len(locs) // 3
            locs.append(ci)
            locs.append(line)
            locs.append(native)
        return lid

    def _new_stack(self, frame: FrameType) -> int:
        """Slow path, on a miss of the handler's lookup: intern what is new, name the stack.

        Returns ``stack << 1 | NATIVE`` (the leaf's location says whether it is inside a call),
        or -1 for a stack whose leaf is the sampler itself. Stacks that differ only in the
        NATIVE bit of their leaf share a stack id; the cache is bounded and cleared when full
        (deep recursion of varying depth makes many), the line-keyed table only grows with new
        call paths. In C (``_callpath_walk.intern_stack``, on the same tables) where built.
        """
        if self.c_intern is not None:
            return self.c_intern(frame, self.c_tables)
        codes: list[CodeType] = []
        lastis: list[int] = []
        f: FrameType | None = frame
        while f is not None:
            codes.append(f.f_code)
            lastis.append(f.f_lasti)
            f = f.f_back
        return self._stack_of_sites(codes, lastis)

    def _stack_of_sites(self, codes: list[CodeType], lastis: list[int]) -> int:
        """``_new_stack`` of the frames given as code objects and their ``f_lasti``, leaf
        first (as ``_callpath_walk.other_stacks`` gives another thread's frames): the same
        lookups, interning what is new.

        It runs at most samples of a program's start (``import torch``: ~900 of 1,100), when
        every stack is new; what it allocates there is what the garbage collector counts to
        decide when to collect, so it makes no tuple that it does not keep: two lists rather
        than a (code, offset) pair per frame, int keys and bytes (``stack_key``). With pairs,
        the extra collections, one of them a full one, cost the program more than the path
        itself. Where the C extension is built, ``intern_stack`` does this work instead (for
        the main thread, and on 3.11 for the others too)."""
        key: list[int] = []
        locs_of = self.locs_of
        for co, lasti in zip(codes, lastis, strict=True):
            table = locs_of.get(id(co))
            if table is None:
                table = self._register(co)
            lid = table.get(lasti)
            if lid is None:
                lid = table[lasti] = self._loc(co, lasti)
            key.append(lid)
        tkey = stack_key(key)
        value = self.stacks.get(tkey)
        if value is not None:
            return value
        if codes[0].co_filename in self.own_files:
            value = -1
        else:
            locs = self.locs
            pairs: list[int] = []
            ap = pairs.append
            for lid in key:
                ap(locs[3 * lid])
                ap(locs[3 * lid + 1])
            lkey = array("i", pairs).tobytes()
            sid = self.line_stacks.get(lkey)
            if sid is None:
                sid = len(self.stack_paths)
                self.line_stacks[lkey] = sid
                self.stack_paths.append(lkey)
            value = sid << 1 | locs[3 * key[0] + 2]
        if len(self.stacks) >= STACK_CACHE:
            self.stacks.clear()  # in place: the handler holds this very dict
        self.stacks[tkey] = value
        return value
