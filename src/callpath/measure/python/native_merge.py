"""Post-mortem half of ``callpath run --native``: unwind the native stacks captured with the
Python frames of the same instant, merge both into one call path per sample, and rewrite the
process file with those paths.

Inputs per process image (written by ``native_capture.py`` and ``_callpath_native.c``):
``native-PID-GEN.samples`` (fixed-layout records: thread, clocks, registers, Python frame
records, a slice of the native stack) and ``native-PID-GEN.json`` (code objects by address with
their line tables, executable mappings as they changed, the capture's facts).

Merging: the native stack is unwound with callpath's CFI unwinder (``measure.unwind``, all
samples of the process at once). Every activation of CPython's ``_PyEval_EvalFrameDefault``
in it runs one or more Python frames: from 3.11 a Python-to-Python call does not recurse in
C, and the frame that an activation started with is marked (3.11: ``is_entry``; 3.12 and
3.13: the shim frame owned by the C stack below it, which the capture turns into the same
mark). The Python frames, leaf first, are therefore cut after each entry frame into groups,
and the k-th group from the leaf replaces the k-th evaluation frame from the leaf; the native
frames between two evaluation frames (the call machinery, a C extension, ctypes, a library)
stay where they are, so native code sits below the Python line that called it, and the native
frames above the outermost replaced one (the interpreter's entry) are left out. Nothing is
guessed (``merge_paths``): Python groups left without an evaluation frame (the unwinding
stopped below them) go on top, above the native frames that were recovered, and the sample
counts as *partial*; evaluation frames left without a group are left out with the entry and
the sample counts as *unmatched*. A code object the sampler never interned (it died between
the signal and the next walk) stays an unknown frame with its address. Each merged path is
then made readable (``readable_path``): CPython's own frames before a Python frame or an
extension and a library's trampolines between two of its frames (``forwarding``) are elided
unless ``--keep-interpreter-frames``, and the profiler's own frames are cut off.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from callpath.errors import FormatError
from callpath.formats import measdir as md
from callpath.measure import cfi, loadmap, postmortem, unwind
from callpath.measure.elfinfo import ElfInfo
from callpath.measure.loadmap import Mapping
from callpath.measure.python import forwarding

MAGIC = 0x4E4D5043
HEAD_WORDS = 14          # sizeof(Head) / 8 in _callpath_native.c
REPEAT = 8               # Head.flags: the thread has not run since its previous sample
CODE_NOTE_SLACK_NS = 3_000_000_000  # a code object is noted within ~1 s of being seen
IDLE_CPU_SHARE = 20      # as the Python sampler: IDLE when the thread used under 5% of a CPU
STAGING = ".merging"
_NATIVE, _PYTHON, _PARTIAL, _UNKNOWN, _PLACEHOLDER = (
    int(md.NodeKind.NATIVE), int(md.NodeKind.PYTHON), int(md.NodeKind.PARTIAL),
    int(md.NodeKind.UNKNOWN), int(md.NodeKind.PLACEHOLDER))
Key = tuple[int, int, int, int]  # (kind, module or code, address or line, flags)


@dataclass
class ProcessMerge:
    """What one process's merge found (for the summary and measurement.json)."""

    pid: int
    samples: int = 0
    threads: int = 0
    partial: int = 0
    unmatched: int = 0
    lost: int = 0
    hidden: int = 0      # samples in the profiler's own code alone, left out
    interpreter_frames: str = "elided"  # or "kept" (--keep-interpreter-frames)
    native_only_threads: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    fallback: str = ""   # why this process kept Python-only paths
    handler_ns: int = 0  # CPU time of the capture: in the signal handler, in the writer thread
    writer_ns: int = 0
    cpu_ns: int = 0      # CPU time of the process's threads over their samples


@dataclass
class Records:
    """The capture's records as parallel arrays over samples (views into the file)."""

    words: npt.NDArray[np.uint64]
    tid: npt.NDArray[np.int64]
    flags: npt.NDArray[np.int64]
    time: npt.NDArray[np.int64]
    cpu: npt.NDArray[np.int64]
    regs: npt.NDArray[np.uint64]        # (n, 8): ip sp bp bx r12 r13 r14 r15
    npy: npt.NDArray[np.int64]
    py0: npt.NDArray[np.int64]          # word index of the first Python frame record
    stack0: npt.NDArray[np.int64]
    nwords: npt.NDArray[np.int64]
    high_at: npt.NDArray[np.int64]      # the outer window of a stack too deep to copy whole:
    high_n: npt.NDArray[np.int64]       # its start in words above sp, its length in words,
    high0: npt.NDArray[np.int64]        # and its first word (after the window at sp)


def read_records(path: Path) -> Records:
    """Decode a ``.samples`` file; a torn last record (the process was killed) is dropped.
    The file is memory-mapped (a long run of many threads writes gigabytes)."""
    n = path.stat().st_size & ~7
    data: Any = np.memmap(path, dtype="<u8", mode="r", shape=(n // 8,)) if n else \
        np.zeros(0, dtype="<u8")
    offs: list[int] = []
    o = 0
    head = np.asarray(data).view("<u4")  # plain ndarray: a memmap's item access is ~10 us
    while o + HEAD_WORDS * 8 <= n:
        magic, size = int(head[o // 4]), int(head[o // 4 + 1])
        if magic != MAGIC or size < HEAD_WORDS * 8 or size % 8 or o + size > n:
            break
        offs.append(o)
        o += size
    words: npt.NDArray[np.uint64] = data[:o // 8]
    b = np.array(offs, dtype=np.int64) // 8
    lo32 = np.uint64(0xFFFFFFFF)

    def w(k: int) -> npt.NDArray[np.uint64]:
        return words[b + k]

    npy = (w(12) & lo32).astype(np.int64)
    nstack = (w(12) >> np.uint64(32)).astype(np.int64)
    nhigh = (w(13) & lo32).astype(np.int64)
    high_at = (w(13) >> np.uint64(32)).astype(np.int64)
    regs = words[b[:, None] + 4 + np.arange(8)] if len(b) else np.zeros((0, 8), np.uint64)
    stack0 = b + HEAD_WORDS + 2 * npy
    return Records(words, (w(1) & lo32).astype(np.int64), (w(1) >> np.uint64(32)).astype(
        np.int64), w(2).astype(np.int64), w(3).astype(np.int64), regs, npy,
        b + HEAD_WORDS, stack0, nstack // 8, high_at // 8, nhigh // 8, stack0 + nstack // 8)


def _read_notes(path: Path) -> dict[str, Any]:
    notes: dict[str, Any] = {"codes": {}, "maps": [], "start": {}, "end": {}, "comm": {}}
    try:
        text = path.read_text()
    except OSError as e:
        raise FormatError(path, f"cannot read the native capture's notes ({e.strerror})") \
            from None
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line
        for row in obj.get("codes", ()):
            # the same address may name another code object later (a code object that was
            # never interned can die and its memory hold one interned afterwards): keep when
            # each was noted, and the first note of an address
            notes["codes"].setdefault(int(row[1]), (int(row[0]), row[2], row[3],
                                                    int(obj.get("t", 0)),
                                                    int(row[4]) if len(row) > 4 else 0))
        if "maps" in obj:
            notes["maps"].append(obj["maps"])
        if isinstance(obj.get("comm"), dict):
            notes["comm"].update({int(t): str(n) for t, n in obj["comm"].items()
                                  if str(t).isdigit()})
        for k in ("start", "end"):
            if k in obj:
                notes[k] = obj[k]
    return notes


def _module_map(snapshots: list[list[Any]], out: Path) -> tuple[unwind.ModuleMap,
                                                                 list[md.Module]]:
    """Executable mappings over the run, from the capture's ``/proc`` snapshots in order: each
    changes only the ranges it covers, as the kernel's mapping records do for ``callpath run``
    (``loadmap.pieces``), and the modules are made as there (``postmortem.module_map``)."""
    maps = [Mapping(t, int(lo), int(hi), int(off), str(path), "")
            for t, snap in enumerate(snapshots) for lo, hi, off, path in snap]
    vdso = "vdso.so" if (out / "vdso.so").exists() else ""
    mm, mods, _names = postmortem.module_map(loadmap.pieces(maps), out, vdso)
    return mm, mods


def _python_frames(rec: Records, notes: dict[str, Any], pycode: list[md.PyCode]) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64],
        npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """All Python frame records, leaf first per sample: (sample, code index or -1, line or the
    code's address, is_entry, incomplete)."""
    total = int(rec.npy.sum())
    sample = np.repeat(np.arange(len(rec.npy), dtype=np.int64), rec.npy)
    first = np.repeat(np.cumsum(rec.npy) - rec.npy, rec.npy)
    j = np.arange(total, dtype=np.int64) - first
    idx = rec.py0[sample] + 2 * j
    code = rec.words[idx].astype(np.uint64)
    meta = rec.words[idx + 1]
    offset = (meta & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32).astype(np.int64)
    fl = (meta >> np.uint64(32)).astype(np.int64)
    known: dict[int, tuple[int, list[int], list[int], int, int]] = notes["codes"]
    ucode, inv = np.unique(code, return_inverse=True)
    ci_of = np.array([known[int(c)][0] if int(c) in known else -1 for c in ucode.tolist()],
                     dtype=np.int64)
    noted = np.array([known[int(c)][3] if int(c) in known else 0 for c in ucode.tolist()],
                     dtype=np.int64)
    resume = np.array([known[int(c)][4] if int(c) in known else 0 for c in ucode.tolist()],
                      dtype=np.int64)
    ci = ci_of[inv.reshape(-1)] if total else np.zeros(0, dtype=np.int64)
    if total:
        # a code object is interned by the sampler's next walk of its thread and noted at the
        # next flush (at least once a second): one noted much later than the sample is
        # another object at the same address, not the one the sample saw
        late = noted[inv.reshape(-1)] > rec.time[sample] + CODE_NOTE_SLACK_NS
        ci = np.where(late & (noted[inv.reshape(-1)] > 0), -1, ci)
    # lines: per distinct (code, offset)
    line = np.zeros(total, dtype=np.int64)
    if total:
        key = np.stack([code.astype(np.int64), offset], axis=1)
        kinv = _row_ids(key)
        ukey = np.zeros((int(kinv.max()) + 1, 2), dtype=np.int64)
        ukey[kinv] = key
        uline = np.zeros(len(ukey), dtype=np.int64)
        for u, (c, off) in enumerate(ukey.tolist()):
            entry = known.get(c & 0xFFFFFFFFFFFFFFFF)
            if entry is None:
                uline[u] = c  # unknown code: its address (an UNKNOWN node)
                continue
            cidx, starts, lines, _t, _r = entry
            ln = -1
            if off >= 0:
                i = bisect.bisect_right(starts, off) - 1
                ln = lines[i] if i >= 0 else -1
            if ln < 0 and 0 <= cidx < len(pycode):
                ln = pycode[cidx].first_line
            uline[u] = ln
        line = uline[kinv]
    # a frame of its own (flag 4: not a generator's) before its code's first RESUME has not
    # started (the handler reads no code object, so this is decided here)
    before = offset < (resume[inv.reshape(-1)] if total else np.zeros(0, dtype=np.int64))
    incomplete = ((fl >> 1) & 1) | (((fl >> 2) & 1) & before.astype(np.int64))
    return sample, ci, line, fl & 1, incomplete


def _eval_frames(fr: unwind.Frames, mm: unwind.ModuleMap,
                 cache: forwarding.ForwardCache | None = None
                 ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Which unwound frames are activations of CPython's evaluation loop, and which are its
    ``take_gil`` (a thread waiting for the GIL): by the ranges of those symbols in each
    module (``forwarding.named_ranges``, kept per module by ``cache``)."""
    if not len(fr.module):
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    ok = fr.module >= 0
    addr = fr.address.astype(np.int64) - (~fr.exact).astype(np.int64)
    key = np.where(ok, (fr.module << 48) | (addr & ((1 << 48) - 1)), -1)
    uk, inv = np.unique(key, return_inverse=True)
    um = np.where(uk >= 0, uk >> 48, -1)
    is_eval, is_gil = eval_ranges(um, (uk & ((1 << 48) - 1)).astype(np.uint64), mm.elves,
                                   cache)
    return is_eval[inv.reshape(-1)], is_gil[inv.reshape(-1)]


def eval_ranges(module: npt.NDArray[np.int64], lookup: npt.NDArray[np.uint64],
                elves: list[ElfInfo | None], cache: forwarding.ForwardCache | None
                ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
    """Whether each (module, link-time address looked up) lies in the evaluation loop, and
    whether in ``take_gil`` (module -1: in neither)."""
    is_eval = np.zeros(len(module), dtype=bool)
    is_gil = np.zeros(len(module), dtype=bool)
    for mod in np.unique(module[module >= 0]).tolist():
        elf = elves[mod]
        if elf is None:
            continue
        got = cache.named_ranges(elf) if cache is not None else forwarding.named_ranges(elf)
        if not (len(got["eval"][0]) or len(got["gil"][0])):
            continue
        sel = np.nonzero(module == mod)[0]
        is_eval[sel] = forwarding.in_ranges(lookup[sel], got["eval"])
        is_gil[sel] = forwarding.in_ranges(lookup[sel], got["gil"])
    return is_eval, is_gil


def _native_ids(fr: unwind.Frames) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                                            npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Each frame's index among the distinct (module, address, exact) of all frames, and
    those distinct frames' module (-1: in none; the address is then the raw pc), address and
    exactness. One sort of one packed integer per frame where the values fit in 63 bits (a
    lexsort of the three columns over a PyTorch loop's half a million frames took 0.1 s)."""
    mod, addr = fr.module, fr.address
    if len(mod) and int(mod.max()) < (1 << 13) and int(addr.max()) < (1 << 48):
        key = ((mod + 1) << 49) | (addr.astype(np.int64) << 1) | fr.exact.astype(np.int64)
        uk, inv = np.unique(key, return_inverse=True)
        return (inv.reshape(-1).astype(np.int64), (uk >> 49) - 1,
                (uk >> 1) & ((1 << 48) - 1), (uk & 1).astype(bool))
    rows = np.stack([mod, addr.astype(np.int64), fr.exact.astype(np.int64)], axis=1)
    ids = _row_ids(rows)
    urows = np.zeros((int(ids.max()) + 1 if len(ids) else 0, 3), dtype=np.int64)
    urows[ids] = rows
    return ids, urows[:, 0], urows[:, 1], urows[:, 2].astype(bool)


def mark_gil_wait(path: list[Key], gil: frozenset[tuple[int, int]]) -> list[Key]:
    """A path whose frames below its innermost Python frame include CPython's ``take_gil``
    (``gil``: (module, address) of those frames) ends there with a ``<GIL wait>``
    placeholder: the thread was waiting for the GIL at that Python line, which is what a
    user needs to see, not the condition variable and futex frames ``take_gil`` waits in
    (cut). The frames between the line and ``take_gil`` stay: they say what gave the GIL up
    (``time.sleep``, a read, the evaluation loop's periodic hand-over)."""
    py = [i for i, k in enumerate(path) if k[0] == _PYTHON]
    for j in range(py[-1] + 1 if py else 0, len(path)):
        k = path[j]
        if k[0] == _NATIVE and (k[1], k[2]) in gil:
            return [*path[:j + 1], (_PLACEHOLDER, -1, int(md.Placeholder.GIL_WAIT), 0)]
    return path


def _row_ids(rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The index of each row among the distinct rows of ``rows`` (n, k)."""
    n = len(rows)
    if not n:
        return np.zeros(0, dtype=np.int64)
    # lexsort and a cumulative sum: np.unique(axis=0) sorts rows as opaque bytes, 20x slower
    o = np.lexsort(rows.T[::-1])
    srt = rows[o]
    new = np.ones(n, dtype=bool)
    new[1:] = (srt[1:] != srt[:-1]).any(axis=1)
    ids = np.empty(n, dtype=np.int64)
    ids[o] = np.cumsum(new) - 1
    return ids


def merge_paths(native: list[Key], is_eval: list[bool], complete: bool,
                groups: list[list[Key]]) -> tuple[list[Key], str]:
    """One sample's merged path, root first, and '' or 'partial' or 'unmatched'.

    ``native`` and ``is_eval`` are the unwound frames leaf first; ``groups`` the Python frames
    of each evaluation activation, innermost activation first, each group leaf first. The k-th
    evaluation frame from the leaf is replaced by the k-th group. The native frames above the
    outermost replaced one (the interpreter's entry: ``_start`` ... ``PyEval_EvalCode``, or
    a thread's start) are left out, so that every path of a Python thread starts at its
    outermost Python frame, whether or not the unwinding reached the thread's entry. Groups
    left without an evaluation frame (the unwinding stopped below them) come first, above the
    native frames that were recovered: the path is then *partial* (native frames between them
    are unknown); evaluation frames left without a group make it *unmatched*."""
    evals = [i for i, e in enumerate(is_eval) if e]  # leaf first
    npair = min(len(evals), len(groups))
    state = ""
    if groups and npair == len(groups):
        # every Python activation found its evaluation frame: what lies above the outermost
        # (left out) need not have been unwound; the capture does not even copy it
        complete = True
    if len(evals) < len(groups) or not complete:
        state = "partial"
    elif len(evals) > len(groups):
        state = "unmatched"
    path: list[Key] = []
    for g in reversed(groups[npair:]):
        path.extend(reversed(g))
    if npair:
        pair = {evals[k]: k for k in range(npair)}
        top = evals[npair - 1]
    else:
        pair = {}
        top = len(native) - 1
        if not groups and not complete:
            path.append((_PARTIAL, -1, 0, 0))
    for i in range(top, -1, -1):
        k = pair.get(i)
        if k is None:
            path.append(native[i])
        else:
            path.extend(reversed(groups[k]))
    return path, state


OWN_MODULES = ("_callpath_walk", "_callpath_native")  # the profiler's shared objects
OWN_FILES = frozenset({"sampler.py", "walk.py", "measfile.py", "timer.py", "native_capture.py",
                       "sitecustomize.py"})  # sampler.RUNTIME_FILES, its capture and its shim


def own_code(file: str) -> bool:
    """Whether a Python file is the sampler's own: one of its runtime files in the directory
    that holds the sampler (or its bootstrap, ``shim/``, below it)."""
    name = os.path.basename(file)
    if name not in OWN_FILES:
        return False
    here = os.path.dirname(file)
    if name == "sitecustomize.py":
        here = os.path.dirname(here)
    return os.path.exists(os.path.join(here, "sampler.py")) and \
        os.path.exists(os.path.join(here, "native_capture.py"))


class PathClasses(dict[Key, str]):
    """One letter per frame key, computed the first time a key is seen, so that
    :func:`readable_path` reads a path as a string (its runs found by ``str`` methods and a
    regular expression in C, not by a Python step per frame: a PyTorch loop's merged paths
    are ~100 frames deep, thousands of them): ``O`` the profiler's own (a frame of
    ``own_modules`` or a Python frame of ``own_codes``), ``I`` the interpreter's native
    frame, ``X`` another native frame at an exact pc, ``N`` another native frame at a return
    address, ``P`` a Python frame, ``H`` a placeholder, ``U`` anything else (an unknown
    frame, the mark of a partial path)."""

    def __init__(self, interpreter: frozenset[int], own_modules: frozenset[int],
                 own_codes: frozenset[int]) -> None:
        super().__init__()
        self.sets = (interpreter, own_modules, own_codes)

    def __missing__(self, k: Key) -> str:
        interpreter, own_modules, own_codes = self.sets
        kind = k[0]
        if kind == _NATIVE:
            c = "O" if k[1] in own_modules else "I" if k[1] in interpreter else \
                "X" if k[3] & md.NodeFlag.EXACT_PC else "N"
        elif kind == _PYTHON:
            c = "O" if k[1] in own_codes else "P"
        else:
            c = "H" if kind == _PLACEHOLDER else "U"
        self[k] = c
        return c


_INTERPRETER_RUN = re.compile("I+")


def readable_path(path: list[Key], interpreter: frozenset[int], own_modules: frozenset[int],
                  own_codes: frozenset[int], keep_interpreter: bool = False,
                  forwarding: Callable[[int, int], bool] | None = None,
                  through_pointer: Callable[[int, int], bool] | None = None,
                  classes: PathClasses | None = None) -> list[Key]:
    """A merged path (root first) as a user reads it.

    The profiler never appears: the path ends before its first frame of the profiler's own
    code (its shared objects, ``own_modules``, or its Python files, ``own_codes``), and the
    interpreter's frames that led there (the signal's handling) go with it; a path that is
    the profiler's alone comes back empty. Unless ``keep_interpreter``, two kinds of call
    machinery are elided between two frames of interest:

    - the interpreter's own native frames (those of the modules in ``interpreter``: the ones
      that hold ``_PyEval_EvalFrameDefault``, libpython or a statically linked python
      executable) that lead to a Python frame (the evaluation loop, vectorcall, slot
      wrappers: Python calling Python through C) or to an extension's function, which the
      interpreter calls through a pointer (``through_pointer(module, address)`` of the
      run's last frame: ``_PyObject_MakeTpCall``, ``cfunction_call``), so that Python frames
      follow each other and the extension hangs under the Python line that called it. The
      interpreter's other frames stay: its own C code where the time is spent and what it
      calls directly (``list_sort_impl`` and ``memmove``, ``_PyObject_Malloc``, ``take_gil``
      with its ``<GIL wait>``);
    - a library's trampolines: a native frame that ``forwarding(module, address)`` calls a
      stub or a dispatcher (``forwarding.forwards``) and whose callee is in the same module
      (PyTorch's ``at::_ops::addmm::call``, ``c10::impl::wrap_kernel_functor_unboxed_``)
      and that has a caller in the path (a native thread's outermost frame, ``__clone3``,
      stays).

    The innermost frame always stays. ``classes`` (made of the same three sets) may be shared
    by the calls of one merge."""
    if classes is None:
        classes = PathClasses(interpreter, own_modules, own_codes)
    text = "".join(map(classes.__getitem__, path))
    cut = text.find("O")
    if cut >= 0:
        # the interpreter's frames that led to the profiler's first frame go with it
        text = text[:cut].rstrip("I")
        path = path[:len(text)]
    n = len(path)
    if keep_interpreter or n < 2:
        return path
    last = n - 1
    # the spans to leave out, in order: each run of the interpreter's frames that leads to a
    # Python frame (or an unknown one), or to another module's native frame that the run's
    # last frame called through a pointer (a method, a type slot: the extension's function),
    # not directly (the C library)
    gone: list[tuple[int, int]] = []
    for m in _INTERPRETER_RUN.finditer(text):
        i, j = m.span()
        if j >= n:
            continue
        c = text[j]
        if c in "PU" or (c in "NX" and through_pointer is not None and
                         not path[j - 1][3] & md.NodeFlag.EXACT_PC and
                         through_pointer(path[j - 1][1], path[j - 1][2])):
            gone.append((i, j))
    if forwarding is not None:
        # a library's trampoline: a native frame at a return address (not the outermost nor
        # the innermost) whose callee is a native frame of the same module
        at = text.find("N", 1, last)
        while at >= 0:
            k, nxt = path[at], path[at + 1]
            if text[at + 1] in "NXI" and nxt[1] == k[1] and forwarding(k[1], k[2]):
                gone.append((at, at + 1))
            at = text.find("N", at + 1, last)
        gone.sort()
    if not gone:
        return path
    keep: list[Key] = []
    prev = 0
    for i, j in gone:
        keep.extend(path[prev:i])
        prev = j
    keep.extend(path[prev:])
    return keep


class Forwarding:
    """``forwarding.forwards`` per (module, return address), each asked once per merge."""

    def __init__(self, elves: list[ElfInfo | None],
                 cache: forwarding.ForwardCache | None = None) -> None:
        self.elves = elves
        self.memo: dict[tuple[int, int], bool] = {}
        self.pointer_memo: dict[tuple[int, int], bool] = {}
        #: the answers of earlier runs, per module identity (the caller saves it)
        self.cache = cache

    def __call__(self, module: int, address: int) -> bool:
        got = self.memo.get((module, address))
        if got is None:
            elf = self.elves[module] if 0 <= module < len(self.elves) else None
            got = elf is not None and (self.cache.forwards(elf, address) if self.cache
                                       else forwarding.forwards(elf, address))
            self.memo[(module, address)] = got
        return got

    def through_pointer(self, module: int, address: int) -> bool:
        """``forwarding.calls_through_pointer`` per (module, return address)."""
        got = self.pointer_memo.get((module, address))
        if got is None:
            elf = self.elves[module] if 0 <= module < len(self.elves) else None
            got = elf is not None and (
                self.cache.calls_through_pointer(elf, address) if self.cache
                else forwarding.calls_through_pointer(elf, address))
            self.pointer_memo[(module, address)] = got
        return got


def forward_cache() -> forwarding.ForwardCache | None:
    """The per-user cache of trampoline answers, beside the unwind rows (None where that
    cache is turned off)."""
    from callpath.measure.recipes import cache_dir
    d = cache_dir()
    return forwarding.ForwardCache(d) if d is not None else None


def _compiler() -> cfi.Compiler:
    """The native sampler's unwinder as ``callpath run`` sets it up: CFI, and unwind recipes
    from the machine code where a module has none (issue 22), in the ``CALLPATH_UNWIND``
    mode."""
    try:
        from callpath.measure import recipes
        from callpath.measure.postmortem import unwind_mode
        mode = unwind_mode()
        return cfi.Compiler(cfi.RowTable(), recipes=recipes.RecipeStore().get,
                            mode=mode, cache=cfi.row_cache(mode))
    except (ImportError, AttributeError, TypeError):
        return cfi.Compiler(cfi.RowTable())


#: samples from which the merge unwinds in two processes (a PyTorch loop's 26k samples of ~20
#: native frames each: 0.45 s of unwinding in one)
PARALLEL_MIN = 8192


#: ``(modules, module, address, exact)`` of a process's unwound frames: ``module`` indices into
#: its modules, link-time addresses, sampled pcs (not return addresses) marked ``exact``
FramesHook = Callable[[list[md.Module], npt.NDArray[np.int64], npt.NDArray[np.uint64],
                       npt.NDArray[np.bool_]], None]


def merge_process(out: Path, notes_path: Path, keep_interpreter: bool = False,
                  on_frames: FramesHook | None = None) -> ProcessMerge:
    """Merge one process image's capture into its process file (rewritten in place); the
    interpreter's frames between Python frames are elided unless ``keep_interpreter``
    (``readable_path``). ``on_frames``, when given, sees the unwound native frames before
    they are merged (``callpath profile`` analyses their procedures meanwhile)."""
    base = notes_path.name[len("native-"):-len(".json")]
    pfile = out / f"process-{base}.cpm"
    samples_path = notes_path.with_suffix(".samples")
    proc = md.read_process(pfile)
    res = ProcessMerge(proc.pid, interpreter_frames="kept" if keep_interpreter else "elided")
    notes = _read_notes(notes_path)
    res.lost = int(notes["end"].get("lost", 0))
    res.handler_ns = int(notes["end"].get("handler_ns", 0))
    res.writer_ns = int(notes["end"].get("writer_ns", 0))
    if not samples_path.exists():
        res.fallback = "no native samples were written"
        return res
    rec = read_records(samples_path)
    n = len(rec.tid)
    res.samples = n
    mm, mods = _module_map(notes["maps"], out)
    compiler = _compiler()
    saved = rec.regs[:, [3, 2, 4, 5, 6, 7]]  # rbx rbp r12 r13 r14 r15
    # in two processes, unless callpath profile's structure children use the other core
    fr = unwind.unwind_parallel(rec.words, rec.regs[:, 0].copy(), rec.regs[:, 1].copy(),
                                saved, rec.stack0, rec.nwords, mm, compiler,
                                workers=1 if on_frames is not None else 2,
                                high=(rec.high_at, rec.high_n, rec.high0),
                                min_samples=PARALLEL_MIN)
    if compiler.cache is not None:
        compiler.cache.save()
    if on_frames is not None:
        on_frames(mods, fr.module, fr.address, fr.exact)
    fwd_cache = forward_cache()
    # one small integer per distinct native frame: a sample's frames as the bytes of a slice
    # of these are the key of its merged path (a tuple of tuples built per sample cost more
    # than the merge it saved); the evaluation loop's frames found per distinct frame
    frame_ids, umod, uaddr, uexact = _native_ids(fr)
    ueval, ugil = eval_ranges(umod, (uaddr - (~uexact)).astype(np.uint64), mm.elves,
                              fwd_cache)
    is_eval = ueval[frame_ids]
    gil = frozenset(zip(umod[ugil].tolist(), uaddr[ugil].tolist(), strict=True))
    if int(rec.npy.sum()) and not is_eval.any():
        # no activation of the evaluation loop named in any native stack (a stripped or
        # unknown interpreter build): nothing says where the Python frames belong
        res.fallback = ("no frame of CPython's evaluation loop (_PyEval_EvalFrameDefault) "
                        "found in the native stacks of this interpreter build")
        samples_path.unlink()
        notes_path.unlink()
        return res
    # the interpreter's modules: those that hold its evaluation loop; the profiler's own
    interpreter = frozenset(int(m) for m in np.unique(umod[ueval]).tolist() if m >= 0)
    own_modules = frozenset(m.index for m in mods
                            if os.path.basename(m.path).startswith(OWN_MODULES))
    own_codes = frozenset(i for i, c in enumerate(proc.pycode) if own_code(c.file))
    forwards = Forwarding(mm.elves, fwd_cache)
    # native frames per sample, leaf first: each sample's frames are depths 0 .. nframes-1,
    # so a frame's place is its sample's first place plus its depth (no sort)
    bounds = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(fr.nframes, out=bounds[1:])
    order = np.empty(len(fr.sample), dtype=np.int64)
    order[bounds[fr.sample] + fr.depth] = np.arange(len(fr.sample), dtype=np.int64)
    feval = is_eval[order].tolist()
    complete = fr.complete.tolist()
    # Python frames per sample, grouped by evaluation activation
    ps, pci, pline, pentry, pinc = _python_frames(rec, notes, proc.pycode)
    pbounds = np.searchsorted(ps, np.arange(n + 1))
    py_rows = np.stack([pci, pline, pentry, pinc], axis=1)
    py_ids = _row_ids(py_rows)
    # each distinct Python frame record's (key, is_entry, incomplete) made once
    upy = np.zeros((int(py_ids.max()) + 1 if len(py_ids) else 0, 4), dtype=np.int64)
    upy[py_ids] = py_rows
    uitems = [((_PYTHON, c, ln, 0) if c >= 0 else (_UNKNOWN, -1, ln, 0), e, i)
              for c, ln, e, i in upy.tolist()]
    pitems = list(map(uitems.__getitem__, py_ids.tolist()))
    nat_ids = frame_ids[order]
    # each distinct native frame's key made once, and every frame a reference to it: a
    # sample's native keys are then a slice of ``fkeys`` (a copy in C), not a tuple built
    # per frame
    exact_flag = int(md.NodeFlag.EXACT_PC)
    ukeys = [(_NATIVE if m >= 0 else _UNKNOWN, m, a, exact_flag if x else 0)
             for m, a, x in zip(umod.tolist(), uaddr.tolist(), uexact.tolist(), strict=True)]
    fkeys = list(map(ukeys.__getitem__, nat_ids.tolist()))
    classes = PathClasses(interpreter, own_modules, own_codes)
    # weights: per thread, the time and CPU time since its previous sample
    period = int(notes["start"].get("period_ns", 1_000_000))
    order_t = np.lexsort((rec.time, rec.tid))
    t_sorted, c_sorted, tid_sorted = rec.time[order_t], rec.cpu[order_t], rec.tid[order_t]
    first = np.ones(n, dtype=bool)
    first[1:] = tid_sorted[1:] != tid_sorted[:-1]
    wall = np.where(first, period, np.diff(t_sorted, prepend=0))
    cpu = np.where(first, np.minimum(c_sorted, period), np.diff(c_sorted, prepend=0))
    wall_of = np.empty(n, dtype=np.int64)
    cpu_of = np.empty(n, dtype=np.int64)
    wall_of[order_t] = wall
    cpu_of[order_t] = np.maximum(cpu, 0)
    idle_a = cpu_of * IDLE_CPU_SHARE < wall_of
    # threads: the main thread first, then in order of their first sample
    main_tid = int(notes["start"].get("main_tid", proc.pid))
    tids_by_first = [int(t) for t in tid_sorted[first][np.argsort(t_sorted[first])].tolist()]
    tids = [main_tid] + [t for t in tids_by_first if t != main_tid]
    names = {int(t.info.get("tid", -1)): str(t.info.get("name", "")) for t in proc.threads}
    for tid, comm in notes["comm"].items():  # native-only threads: the kernel's name
        if not names.get(tid):
            names[tid] = comm
    trees: list[dict[tuple[int, Key], int]] = [{} for _ in tids]
    nodes: list[list[tuple[int, Key]]] = [[] for _ in tids]
    stats = [{"samples": 0, "idle_samples": 0, "cpu_time_ns": 0, "wall_time_ns": 0,
              "partial": 0, "unmatched": 0, "python_samples": 0} for _ in tids]

    def fresh(s: int) -> tuple[list[Key], str, bool]:
        """Sample ``s``'s merged path, its state and whether it has Python frames."""
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        plo, phi = int(pbounds[s]), int(pbounds[s + 1])
        groups: list[list[Key]] = [[]]
        for key, entry, inc in pitems[plo:phi]:
            if not inc:
                groups[-1].append(key)
            if entry:
                groups.append([])
        if not groups[-1]:
            groups.pop()
        evl = feval[lo:hi]
        natk = fkeys[lo:hi]
        if not complete[s] and natk and natk[-1][0] == _UNKNOWN:
            # a return address outside every module: the step that read it went wrong, so
            # that frame is not evidence of a caller
            natk.pop()
            evl.pop()
        path, state = merge_paths(natk, evl, complete[s], groups)
        if gil and path:
            path = mark_gil_wait(path, gil)
        path = readable_path(path, interpreter, own_modules, own_codes, keep_interpreter,
                             forwards, forwards.through_pointer, classes)
        return path, state, phi > plo

    # samples with the same frames (native ids, Python records, completeness) have the same
    # merged path: one class per distinct frames, its path made once (a PyTorch loop's 26k
    # samples have ~4k); a repeat sample (the thread has not run since its previous sample:
    # same pc and sp, no CPU time, the record did not copy the stack again) takes the class
    # of its thread's last sample that was not a repeat, and is lost without one
    repeat = (rec.flags & REPEAT) != 0
    fresh_s = np.flatnonzero(~repeat)
    nb, pb = nat_ids.tobytes(), py_ids.tobytes()
    b8, p8 = (bounds * 8).tolist(), (pbounds * 8).tolist()
    first_of: dict[tuple[bytes, bytes, bool], int] = {}
    cls_fresh = [first_of.setdefault((nb[b8[i]:b8[i + 1]], pb[p8[i]:p8[i + 1]], complete[i]),
                                     len(first_of)) for i in fresh_s.tolist()]
    cls = np.full(n, -1, dtype=np.int64)
    cls[fresh_s] = cls_fresh
    by_thread = np.argsort(rec.tid, kind="stable")
    start_t = np.ones(n, dtype=bool)
    start_t[1:] = rec.tid[by_thread][1:] != rec.tid[by_thread][:-1]
    group_start = np.maximum.accumulate(np.where(start_t, np.arange(n), 0))
    last_fresh = np.maximum.accumulate(np.where(~repeat[by_thread], np.arange(n), -1))
    found = last_fresh >= group_start
    took = np.full(n, -1, dtype=np.int64)
    took[by_thread[found]] = cls[by_thread[last_fresh[found]]]
    res.lost += int((took < 0).sum())
    # each class's path from its first sample
    reps = np.full(len(first_of), -1, dtype=np.int64)
    reps[cls[fresh_s][::-1]] = fresh_s[::-1]
    state_code = {"": 0, "partial": 1, "unmatched": 2}
    paths: list[list[Key]] = []
    cstate = np.zeros(len(reps), dtype=np.int64)
    cpython = np.zeros(len(reps), dtype=bool)
    cempty = np.zeros(len(reps), dtype=bool)
    for c, r in enumerate(reps.tolist()):
        path, state, has_python = fresh(r)
        paths.append(path)
        cstate[c] = state_code[state]
        cpython[c] = has_python
        cempty[c] = not path
    ok = took >= 0
    hidden = ok.copy()
    hidden[ok] = cempty[took[ok]]  # the profiler's own code only (its flush, its exit)
    res.hidden += int(hidden.sum())
    kept = np.flatnonzero(ok & ~hidden)
    partial_mask = np.zeros(n, dtype=bool)
    partial_mask[fresh_s] = (cstate[cls[fresh_s]] == 1) & ~fr.complete[fresh_s]
    # per sample: its thread's slot and leaf node (-1: lost or hidden), its state (1
    # partial, 2 unmatched) and whether it has Python frames; the counts, the statistics
    # and the traces are sums over these arrays
    tid_order = np.array(tids, dtype=np.int64)
    slot_sorted = np.argsort(tid_order)
    slot_all = slot_sorted[np.searchsorted(tid_order[slot_sorted], rec.tid)]
    # one tree insertion per distinct (thread, class, idle), in the order of first samples
    # (the order of the nodes in the process file)
    combo = (slot_all[kept] * len(reps) + took[kept]) * 2 + idle_a[kept]
    ucombo, cfirst, cinv = np.unique(combo, return_index=True, return_inverse=True)
    cnode = np.zeros(len(ucombo), dtype=np.int64)
    for u in np.argsort(cfirst, kind="stable").tolist():
        v = int(ucombo[u])
        th, c, is_idle = v // 2 // len(reps), v // 2 % len(reps), v % 2
        path = paths[c]
        tree, nl = trees[th], nodes[th]
        node = 0
        last = len(path) - 1
        for d, key in enumerate(path):
            if d == last and is_idle:
                key = (key[0], key[1], key[2], key[3] | md.NodeFlag.IDLE)
            child = tree.get((node, key))
            if child is None:
                child = len(nl) + 1
                tree[(node, key)] = child
                nl.append((node, key))
            node = child
        cnode[u] = node
    slot_s = np.full(n, -1, dtype=np.int64)
    node_s = np.full(n, -1, dtype=np.int64)
    state_s = np.zeros(n, dtype=np.int64)
    python_s = np.zeros(n, dtype=bool)
    slot_s[kept] = slot_all[kept]
    node_s[kept] = cnode[cinv.reshape(-1)]
    state_s[kept] = cstate[took[kept]]
    python_s[kept] = cpython[took[kept]]
    counts, traces = _sums(tids, stats, slot_s, node_s, state_s, python_s, idle_a,
                           cpu_of, wall_of, rec.time)
    # why the unwinding stopped, for the samples whose merged path is partial
    for code, cnt in zip(*np.unique(fr.reason[partial_mask],
                                    return_counts=True), strict=True):
        name = unwind.REASONS.get(int(code), "other")
        res.reasons[name] = res.reasons.get(name, 0) + int(cnt)
    res.cpu_ns = sum(st["cpu_time_ns"] for st in stats)
    res.partial = sum(st["partial"] for st in stats)
    res.unmatched = sum(st["unmatched"] for st in stats)
    res.threads = len(tids)
    res.native_only_threads = sum(1 for st in stats if st["samples"] and not
                                  st["python_samples"])
    if forwards.cache is not None:
        forwards.cache.save()
    _write(out, proc, base, mods, tids, names, nodes, counts, stats, res,
           traces if proc.info.get("trace") else None)
    samples_path.unlink()
    notes_path.unlink()
    return res


def _sums(tids: list[int], stats: list[dict[str, int]], slot: npt.NDArray[np.int64],
          node: npt.NDArray[np.int64], state: npt.NDArray[np.int64],
          python: npt.NDArray[np.bool_], idle: npt.NDArray[np.bool_],
          cpu: npt.NDArray[np.int64], wall: npt.NDArray[np.int64],
          time: npt.NDArray[np.int64]) -> tuple[list[list[tuple[int, int, int, int]]],
                                                 list[npt.NDArray[np.int64]]]:
    """Per thread (``slot``; -1: a sample left out): its leaves' sample counts and CPU and
    wall time, in the order each leaf was first reached (the process file's order), its
    statistics (added to ``stats``) and its trace, (time, leaf) rows in sample order."""
    counts: list[list[tuple[int, int, int, int]]] = []
    traces: list[npt.NDArray[np.int64]] = []
    for th in range(len(tids)):
        sel = np.flatnonzero(slot == th)
        nd = node[sel]
        leaves, first, inv = np.unique(nd, return_index=True, return_inverse=True)
        k = np.bincount(inv, minlength=len(leaves))
        c = np.zeros(len(leaves), dtype=np.int64)
        w = np.zeros(len(leaves), dtype=np.int64)
        np.add.at(c, inv, cpu[sel])
        np.add.at(w, inv, wall[sel])
        o = np.argsort(first, kind="stable")
        counts.append(list(zip(leaves[o].tolist(), k[o].tolist(), c[o].tolist(),
                               w[o].tolist(), strict=True)))
        traces.append(np.stack([time[sel], nd], axis=1))
        st = stats[th]
        st["samples"] += len(sel)
        st["idle_samples"] += int(idle[sel].sum())
        st["cpu_time_ns"] += int(cpu[sel].sum())
        st["wall_time_ns"] += int(wall[sel].sum())
        st["python_samples"] += int(python[sel].sum())
        st["partial"] += int((state[sel] == 1).sum())
        st["unmatched"] += int((state[sel] == 2).sum())
    return counts, traces


def _write(out: Path, proc: md.ProcessProfile, base: str, mods: list[md.Module],
           tids: list[int], names: dict[int, str], nodes: list[list[tuple[int, Key]]],
           counts: list[list[tuple[int, int, int, int]]], stats: list[dict[str, int]],
           res: ProcessMerge, traces: list[npt.NDArray[np.int64]] | None) -> None:
    staging = out / STAGING
    staging.mkdir(exist_ok=True)
    pid_s, gen_s = base.rsplit("-", 1)
    info = dict(proc.info)
    info["native_merge"] = {"samples": res.samples, "partial": res.partial,
                            "unmatched": res.unmatched, "lost": res.lost,
                            "hidden": res.hidden, "interpreter_frames": res.interpreter_frames,
                            "partial_reasons": res.reasons}
    node_id = int(info.get("node_id", 0))
    rank = info.get("rank")
    # only the modules that frames name: struct analyses every module a process file lists
    used = sorted({k[1] for nl in nodes for _, k in nl if k[0] == _NATIVE})
    renum = {old: new for new, old in enumerate(used)}
    mods = [md.Module(renum[m.index], m.path, m.start, m.end, m.offset, m.vaddr, m.build_id,
                      m.saved) for m in mods if m.index in renum]
    nodes = [[(p, (k[0], renum[k[1]], k[2], k[3]) if k[0] == _NATIVE else k) for p, k in nl]
             for nl in nodes]
    with md.ProcessWriter(staging, int(pid_s), int(gen_s)) as w:
        w.process(**info)
        w.metrics(proc.metrics or [])
        w.modules(mods)
        w.pycode(proc.pycode)
        for th, tid in enumerate(tids):
            w.thread(th, tid=tid, ids=md.context_ids(node_id, rank if isinstance(rank, int)
                                                     else None, th),
                     index=th, name=names.get(tid, "MainThread" if th == 0 else ""))
            nl = nodes[th]
            arr = np.zeros(len(nl) + 1, dtype=md.NODE_DTYPE)
            arr[0] = (-1, int(md.NodeKind.ROOT), 0, 0, -1, 0, 0)
            if nl:
                par = np.array([p for p, _ in nl], dtype=np.int64)
                keys = np.array([k for _, k in nl], dtype=np.int64)
                arr["parent"][1:] = par
                arr["kind"][1:] = keys[:, 0]
                arr["module"][1:] = keys[:, 1]
                arr["address"][1:] = keys[:, 2].astype(np.uint64)
                arr["flags"][1:] = keys[:, 3]
            w.nodes(th, arr)
            cn = counts[th]
            cnt = np.zeros(2 * len(cn), dtype=md.COUNT_DTYPE)
            for i, (node, k, cpu, wall) in enumerate(cn):
                cnt[2 * i] = (node, 0, k, float(cpu))
                cnt[2 * i + 1] = (node, 1, k, float(wall))
            w.counts(th, cnt)
            if traces is not None and len(traces[th]):
                tr = np.zeros(len(traces[th]), dtype=md.TRACE_DTYPE)
                tv = traces[th]
                tr["time"] = tv[:, 0].astype(np.uint64)
                tr["node"] = tv[:, 1]
                w.trace(th, tr[np.argsort(tr["time"], kind="stable")])
            w.stats(th, **stats[th])
    os.replace(staging / md.process_file_name(int(pid_s), int(gen_s)),
               out / md.process_file_name(int(pid_s), int(gen_s)))
    shutil.rmtree(staging, ignore_errors=True)


def merge_directory(out: Path, keep_interpreter: bool = False) -> list[ProcessMerge]:
    """Merge every process image's native capture in a measurement directory. A process whose
    capture did not start keeps its Python-only paths (its metadata says why)."""
    results = []
    for notes in sorted(out.glob("native-*.json")):
        results.append(merge_process(out, notes, keep_interpreter))
    return results


def fallbacks(out: Path) -> list[str]:
    """The distinct reasons why processes kept Python-only paths (said once by the launcher)."""
    reasons: set[str] = set()
    for f in sorted(out.glob(md.PROCESS_GLOB)):
        try:
            info = md.read_process(f).info
        except (OSError, FormatError):
            continue
        how = str(info.get("native", ""))
        if how.startswith("python only"):
            reasons.add(how)
    return sorted(reasons)
