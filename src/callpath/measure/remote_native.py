"""Native stacks of an attached Python process, merged below its Python frames
(``callpath run --pid PID --native``).

Why two captures and a pairing: from outside the process nothing takes a native stack and the
Python frames at the same instant without stopping the program. The Python frames come from
the interpreter's memory at each tick (``remote_sampler``); the native stacks come from
perf_event samples of the process's threads (``cpu-clock``, the user registers and a copy of
the stack, opened as ``run --pid`` of a native program opens them: ``attach.open_events``) and
are unwound post-mortem with callpath's CFI unwinder, as ``run`` does.

A native sample is lent to a tick of its thread only where nothing says the thread's Python
state differed: the sample must lie between two consecutive ticks of the thread that read the
same Python stack (every frame, every line), and it must hold the innermost Python frame's
instruction pointer (read at the tick) in a register or a stack word: the evaluation loop
keeps its instruction pointer there while it calls into C, so a sample that lacks it was
taken at another instruction (a call of another line between two ticks that read the same
one: without this check, half of the merged samples of a program alternating 0.4 and 0.8 ms
ctypes calls were under the wrong line). Each tick takes the nearest such sample. A thread in
a call into native code (a C extension, ctypes, a library, a wait) gets the native frames
below its Python line; a thread whose line changes between ticks, or that is off the CPU,
keeps its Python-only path. Two call sites of one function a few bytes of bytecode apart
cannot be told apart this way (``INSTR_AFTER``).

The pair is merged as ``run --native`` merges (``python.merge.merge_paths``: the k-th
evaluation activation of the native stack from the leaf is replaced by the k-th group of
Python frames, cut after each activation's entry frame) and made readable the same way
(``python.merge.readable_path``: CPython's frames between two Python frames elided unless
``--keep-interpreter-frames``). A pair whose native stack was unwound completely but holds
another number of evaluation activations than the Python stack has groups did not happen at
the same Python state: that tick keeps its Python-only path (counted *unmatched*).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import numpy as np
import numpy.typing as npt

from callpath.formats import measdir as md
from callpath.measure import attach_pid as attach
from callpath.measure import perf
from callpath.measure import perf_events as events
from callpath.measure import perf_launch as launch

#: perf samples per second of CPU time of each thread: one per tick of the remote sampler
#: (twice as many would merge more of a running thread's ticks, at twice the stack copies)
NATIVE_FREQUENCY = 100
#: bytes of user stack copied with each sample: the merge needs the stack up to the outermost
#: evaluation frame (``run --native`` copies at least as much)
NATIVE_STACK = 32768
#: a word within these bytes of a frame's instruction pointer is the evaluation loop's own
#: (next_instr: the instruction's inline caches past it; 3.11's prev_instr one code unit
#: before); the next call site of a function is further away
INSTR_BEFORE, INSTR_AFTER = 2, 24
#: a frame: (kind, module or code, address or line, flags), as ``python.merge.Key`` (the merge
#: and the unwinder are imported when the sampling is over, not at start-up)
Key = tuple[int, int, int, int]
_NATIVE, _UNKNOWN = int(md.NodeKind.NATIVE), int(md.NodeKind.UNKNOWN)


class NativeCapture:
    """perf_event sampling of every thread of ``pid``, copied to ``out/raw.perf`` at each
    tick of the remote sampler (the copy is cheap when the rings are empty)."""

    def __init__(self, pid: int, out: Path, stack_size: int) -> None:
        self.pid = pid
        self.out = out
        spec = events.parse_event(f"cpu-clock@f{NATIVE_FREQUENCY}")
        self.opts = attach.AttachOptions([spec], out, stack_size=max(stack_size, NATIVE_STACK))
        self.opened = attach.open_events(pid, self.opts)
        self.raw_info = self.opened.raw_info(self.opts, launch._save_vdso(out))
        self._raw: IO[bytes] | None = None
        self._procs: IO[str] | None = None
        self._seen: set[tuple[int, int]] = set()
        self.nbytes = 0

    def start(self) -> None:
        attach.write_load_map(self.out, self.pid)
        self._raw = open(self.out / launch.RAW_FILE, "ab")  # noqa: SIM115
        self._procs = open(self.out / launch.PROCS_FILE, "a")  # noqa: SIM115
        self.opened.switch(perf.PERF_EVENT_IOC_ENABLE)

    def copy(self) -> None:
        if self._raw is not None and self._procs is not None:
            self.nbytes += launch.copy_rings(self.opened.rings, self._raw, self._procs,
                                             self._seen)

    def stop(self) -> None:
        """Disable, copy what is left, close (the process keeps running, unharmed)."""
        self.opened.switch(perf.PERF_EVENT_IOC_DISABLE)
        try:
            self.copy()
        finally:
            self.opened.close()
            for f in (self._raw, self._procs):
                if f is not None:
                    f.close()
            self._raw = self._procs = None


@dataclass
class NativeStacks:
    """The unwound native stacks of one process's samples, per thread in time order."""

    times: dict[int, npt.NDArray[np.int64]]          # tid -> sample times (monotonic ns)
    paths: dict[int, list[tuple[list[Key], list[bool], bool]]]  # tid -> (frames leaf
    # first, which are evaluation activations, unwound completely)
    modules: list[md.Module]
    interpreter: frozenset[int]  # modules that hold _PyEval_EvalFrameDefault
    samples: int = 0
    #: tid -> per sample its index in the arrays below (registers, where its stack copy
    #: starts in ``words`` and its length): read in place from raw.perf's memory map
    index: dict[int, list[int]] = field(default_factory=dict)
    regs: npt.NDArray[np.uint64] = field(default_factory=lambda: np.zeros((0, 0), np.uint64))
    stack0: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    nstack: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    words: npt.NDArray[np.uint64] = field(default_factory=lambda: np.zeros(0, np.uint64))
    period: npt.NDArray[np.uint64] = field(default_factory=lambda: np.zeros(0, np.uint64))
    #: (module, address) of the frames in CPython's take_gil (``merge.mark_gil_wait``)
    gil: frozenset[tuple[int, int]] = frozenset()

    def native_path(self, tid: int, k: int) -> list[Key]:
        """Sample ``k`` of a thread that runs no Python code (a BLAS or OpenMP worker, a
        thread of a C library): its native frames, root first."""
        keys, _evl, complete = self.paths[tid][k]
        path = list(reversed(keys))
        if not complete:
            path.insert(0, (int(md.NodeKind.PARTIAL), -1, 0, 0))
        return path

    def holds(self, tid: int, k: int, instr: int) -> bool:
        """Whether sample ``k`` of ``tid`` was taken at Python instruction ``instr``: a
        register or stack word points at it (the evaluation loop's instruction pointer, kept
        while it calls into C, is at most a few code units past the frame's)."""
        if instr <= INSTR_BEFORE:
            return False  # no Python frame: nothing to confirm a native stack with
        i = self.index[tid][k]
        lo = np.uint64(instr - INSTR_BEFORE)
        span = np.uint64(INSTR_BEFORE + INSTR_AFTER)
        w0 = int(self.stack0[i])
        return bool(np.any(self.regs[i] - lo <= span)
                    or np.any(self.words[w0:w0 + int(self.nstack[i])] - lo <= span))


def unwind_samples(out: Path, raw_info: dict[str, object], pid: int) -> NativeStacks:
    """Decode and unwind ``out/raw.perf`` (samples of the process image that was attached to:
    after an exec its Python frames would be another program's), then remove the raw files."""
    from callpath.measure import perf_records as records
    from callpath.measure import postmortem
    from callpath.measure.python import native_merge as merge

    raw = records.decode(out / launch.RAW_FILE, dict(raw_info))
    images, history = postmortem._images(raw.sideband)
    sm = raw.samples
    hist = history.get(pid, [])
    empty = NativeStacks({}, {}, [], frozenset())
    if not hist or not len(sm):
        _remove_raw(out)
        return empty
    img = images[hist[0][1]]
    until = hist[1][0] if len(hist) > 1 else np.iinfo(np.int64).max
    sel = np.nonzero((sm.pid == pid) & (sm.time.astype(np.int64) < until) & sm.has_regs)[0]
    s = sm.take(sel)
    regs = list(raw_info["regs"])  # type: ignore[call-overload]
    col = {r: regs.index(r) for r in ("ip", "sp", "bx", "bp", "r12", "r13", "r14", "r15")}
    fr, mm, mods, _names = postmortem._unwind_epochs(img, s, col, raw.words, out,
                                                     str(raw_info.get("vdso", "")),
                                                     merge._compiler())
    is_eval, is_gil = merge._eval_frames(fr, mm)
    gil = frozenset(zip(fr.module[is_gil].tolist(), fr.address[is_gil].astype(np.int64).tolist(),
                        strict=True))
    interpreter = frozenset(int(m) for m in np.unique(fr.module[is_eval]).tolist() if m >= 0)
    order = np.lexsort((fr.depth, fr.sample))
    bounds = np.searchsorted(fr.sample[order], np.arange(len(s) + 1))
    kind = np.where(fr.module >= 0, _NATIVE, _UNKNOWN)[order].tolist()
    mod = fr.module[order].tolist()
    addr = fr.address[order].astype(np.int64).tolist()
    exact = fr.exact[order].tolist()
    ev = is_eval[order].tolist()
    complete = fr.complete.tolist()
    tid_l = s.tid.tolist()
    time_l = s.time.astype(np.int64).tolist()

    by_tid: dict[int, list[int]] = {}
    for i, t in enumerate(tid_l):
        by_tid.setdefault(t, []).append(i)
    times: dict[int, npt.NDArray[np.int64]] = {}
    paths: dict[int, list[tuple[list[Key], list[bool], bool]]] = {}
    for tid, idx in by_tid.items():
        idx.sort(key=lambda i: time_l[i])
        times[tid] = np.array([time_l[i] for i in idx], dtype=np.int64)
        rows = []
        for i in idx:
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            keys: list[Key] = [(kind[j], mod[j], addr[j],
                                int(md.NodeFlag.EXACT_PC) if exact[j] else 0)
                               for j in range(lo, hi)]
            evl = ev[lo:hi]
            if not complete[i] and keys and keys[-1][0] == _UNKNOWN:
                keys.pop()  # a return address outside every module: no evidence of a caller
                evl = evl[:-1]
            rows.append((keys, evl, bool(complete[i])))
        paths[tid] = rows
    _remove_raw(out)  # the map stays readable until it is dropped
    return NativeStacks(times, paths, mods, interpreter, len(s), by_tid, s.regs, s.stack0,
                        s.stack_words, raw.words, s.period, gil)


def _remove_raw(out: Path) -> None:
    for name in (launch.RAW_FILE, launch.PROCS_FILE):
        (out / name).unlink(missing_ok=True)


#: a Python stack as the sampler interns it: (code index, line, entry) innermost first
PyStack = tuple[tuple[int, int, bool], ...]


def groups_of(stack: PyStack) -> list[list[Key]]:
    """The Python frames of each evaluation activation, innermost activation first, each
    leaf first (``merge_paths``' groups): cut after each activation's entry frame."""
    out: list[list[Key]] = [[]]
    for ci, line, entry in stack:
        out[-1].append((int(md.NodeKind.PYTHON), ci, line, 0))
        if entry:
            out.append([])
    if not out[-1]:
        out.pop()
    return out


@dataclass
class Pairing:
    """How a thread's ticks found native stacks (for the summary and the process file)."""

    merged: int = 0
    python_only: int = 0     # no native sample between two ticks with the same Python stack
    unconfirmed: int = 0     # ... none whose stack holds the Python frame's instruction
    native_only_threads: int = 0  # threads without Python frames: native samples alone
    unmatched: int = 0       # a native sample of another Python state: not merged
    partial: int = 0         # merged, but the native stack was not unwound completely
    used_modules: set[int] = field(default_factory=set)


def nearest_samples(tick_times: npt.NDArray[np.int64], stack_ids: npt.NDArray[np.int64],
                    sample_times: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64],
                                                                  npt.NDArray[np.int64]]:
    """For each tick, the native samples that may be merged with it, or -1: the nearest
    sample after it before the next tick, and the nearest before it after the previous tick,
    each only where that neighbouring tick read the same Python stack."""
    n = len(tick_times)
    after = np.full(n, -1, dtype=np.int64)
    before = np.full(n, -1, dtype=np.int64)
    if n < 2 or not len(sample_times):
        return after, before
    # the interval between ticks j and j+1 is usable when both read the same stack
    same = stack_ids[1:] == stack_ids[:-1]
    # for each interval, the first sample at or after its start and the last before its end
    lo = np.searchsorted(sample_times, tick_times[:-1], side="left")
    hi = np.searchsorted(sample_times, tick_times[1:], side="right") - 1
    j = np.nonzero(same & (lo <= hi))[0]
    after[j] = lo[j]
    before[j + 1] = hi[j]
    return after, before


def merged_path(stack: PyStack, native: tuple[list[Key], list[bool], bool],
                interpreter: frozenset[int], keep_interpreter: bool,
                gil: frozenset[tuple[int, int]] = frozenset()) -> tuple[list[Key], str]:
    """The merged path (root first) of a tick's Python stack and a native sample, and '' or
    'partial'; or ([], 'unmatched') where they cannot be the same moment. With ``gil`` (the
    take_gil frames), a wait for the GIL ends in ``<GIL wait>`` as in ``run --native``."""
    from callpath.measure.python import native_merge as merge

    keys, evl, complete = native
    groups = groups_of(stack)
    nevals = sum(evl)
    if nevals != len(groups) and (complete or nevals > len(groups)):
        return [], "unmatched"
    path, state = merge.merge_paths(keys, evl, complete, groups)
    if state == "unmatched":
        return [], "unmatched"
    path = merge.readable_path(path, interpreter, frozenset(), frozenset(), keep_interpreter)
    if gil and path:
        path = merge.mark_gil_wait(path, gil)
    return path, state


def keep_used_modules(mods: list[md.Module], used: set[int]) -> tuple[list[md.Module],
                                                                      dict[int, int]]:
    """The modules that frames name, renumbered from 0 (``struct`` analyses every module a
    process file lists), and the renumbering."""
    renum = {old: new for new, old in enumerate(sorted(used))}
    kept = [md.Module(renum[m.index], m.path, m.start, m.end, m.offset, m.vaddr, m.build_id,
                      m.saved) for m in mods if m.index in renum]
    return kept, renum


def describe(p: Pairing) -> str:
    total = p.merged + p.python_only + p.unconfirmed + p.unmatched
    if not total:
        return "no thread sample"
    return (f"{p.merged} of {total} thread samples merged with a native stack "
            f"({p.partial} partial), {p.python_only} without one (the thread was not running "
            f"or its Python line changed between ticks), {p.unconfirmed} whose native "
            f"samples were not at the same Python instruction, {p.unmatched} unmatched"
            + (f"; {p.native_only_threads} threads without Python code, native paths alone"
               if p.native_only_threads else ""))

