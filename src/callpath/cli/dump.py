"""``callpath dump --pid PID``: print every thread's current call path once (like py-spy dump).

For a program that hangs: which thread waits where. Every thread shows its scheduler state and
the kernel function it waits in (``/proc/PID/task/TID/wchan``), and its native frames: each
thread is held for the instant it takes to copy its registers and stack
(``measure.thread_snapshot``), and unwound afterwards. Python processes (CPython 3.11-3.13)
show each thread's Python frames with file and line, read from the interpreter's memory while
the threads are held, merged with the native frames as ``run --native`` merges them (the
native code below the Python line that called it; CPython's frames between two Python frames
left out). ``--no-native`` reads the Python frames alone, without holding the threads.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from callpath.errors import CallpathError

if TYPE_CHECKING:
    from callpath.measure.remote_python import Code, PyThread, RemotePython
    from callpath.measure.thread_snapshot import Unwound


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "dump", help="print the current call path of every thread of a running process",
        description="Print every thread of the running process PID with its state and, for "
        "CPython 3.11-3.13, its Python call path with file and line (read from the process's "
        "memory), merged with its native frames (each thread is held for an instant to copy "
        "its registers and stack). See docs/run.md.")
    p.add_argument("-p", "--pid", type=int, required=True, metavar="PID",
                   help="the process to inspect")
    p.add_argument("--no-native", action="store_true",
                   help="Python frames only, read without holding the threads")
    p.set_defaults(func=run)


_STATES = {"R": "running", "S": "sleeping", "D": "disk wait", "T": "stopped",
           "t": "traced", "Z": "zombie", "I": "idle"}


def _task(pid: int, tid: int) -> tuple[str, str, str]:
    """(name, state, wchan) of a thread, as /proc says."""
    base = Path(f"/proc/{pid}/task/{tid}")
    try:
        name = (base / "comm").read_text().strip()
        state = (base / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "", "", ""
    try:
        wchan = (base / "wchan").read_text().strip()
    except OSError:
        wchan = ""
    return name, _STATES.get(state, state), "" if wchan == "0" else wchan


def run(args: argparse.Namespace) -> int:
    import tempfile

    from callpath.measure import attach_pid as attach
    from callpath.measure.remote_python import RemotePython

    pid = int(args.pid)
    attach.check_pid(pid)
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError as e:
        raise attach.access_error(pid, e.errno or 0, "inspect") from None
    note = ""
    remote: RemotePython | None = None
    try:
        remote = RemotePython(pid)
    except CallpathError as e:
        note = str(e).split(": ", 1)[-1]
    except PermissionError as e:
        raise attach.access_error(pid, e.errno or 1, "read the memory of") from None
    tids = attach.tids_of(pid)
    tasks = {tid: _task(pid, tid) for tid in tids}  # before holding: that makes them "traced"
    threads: list[PyThread] = []
    unwound = None
    with tempfile.TemporaryDirectory(prefix="callpath-dump-") as scratch:
        states = []
        if not getattr(args, "no_native", False):
            from callpath.measure.thread_snapshot import hold, unwind_held

            with hold(pid, tids) as held:
                states = list(held.threads.values())
                if states and all(s.refused for s in states):
                    # ptrace refused where reading /proc was not (Yama, a seccomp filter)
                    raise attach.access_error(pid, 1, "hold the threads of")
                threads = _python_threads(pid, remote)
            unwound = unwind_held(pid, states, Path(scratch))
        else:
            threads = _python_threads(pid, remote)
        if remote is not None:
            note = f"Python {'.'.join(map(str, remote.version))}"
        held_errors = {s.tid: s.error for s in states if s.error}
        py = {t.native_id: t for t in threads}
        out = sys.stdout
        out.write(f"Process {pid}: {exe} ({note})\n")
        for tid in tids:
            name, state, wchan = tasks[tid]
            where = f", in {wchan}" if wchan else ""
            main = " (main)" if tid == pid else ""
            out.write(f"\nThread {tid}{main} \"{name}\": {state}{where}\n")
            for line in _thread_lines(py.get(tid), unwound, tid, held_errors.get(tid, "")):
                out.write(line + "\n")
        out.flush()
    return 0


def _python_threads(pid: int, remote: RemotePython | None) -> list[PyThread]:
    from callpath.measure import attach_pid as attach

    if remote is None:
        return []
    try:
        return remote.threads()
    except PermissionError as e:
        raise attach.access_error(pid, e.errno or 1, "inspect") from None
    except ProcessLookupError:
        raise attach.access_error(pid, 3) from None


def _thread_lines(t: PyThread | None, unwound: Unwound | None, tid: int,
                  error: str) -> list[str]:
    """One thread's frames, innermost first: merged Python and native frames where both were
    read, else those that were."""

    python = [f"    {f.code.name} ({f.code.file}:{f.line})" for f in t.frames] if t else []
    if t is not None and t.error:
        python = [f"    (the Python stack changed while read: {t.error}; dump again)"]
    native = unwound.frames.get(tid) if unwound is not None else None
    if native is None:
        lines = python
        if t is not None and not t.error and not t.frames:
            lines = ["    (no Python frame: the thread runs no Python code now)"]
        if error:
            lines = [*lines, f"    (no native frames: {error})"]
        return lines
    assert unwound is not None
    if t is None or t.error or not t.frames:
        keys, _evl, complete = native
        lines = python if t is not None and t.error else []
        if t is not None and not t.error:
            lines = ["    (no Python frame: the thread runs no Python code now)"]
        return lines + [_frame(k, unwound, None) for k in keys] + \
            ([] if complete else ["    (the native stack could not be unwound further)"])
    from callpath.measure.remote_native import merged_path

    codes = list(dict.fromkeys(f.code for f in t.frames))
    index = {c: i for i, c in enumerate(codes)}
    stack = tuple((index[f.code], f.line, f.entry) for f in t.frames)
    path, state = merged_path(stack, native, unwound.interpreter, False)
    if state == "unmatched":
        return python + ["    (native frames, not matched with the Python frames above:)"] + \
            [_frame(k, unwound, codes) for k in native[0]]
    return [_frame(k, unwound, codes) for k in reversed(path)]


def _frame(k: tuple[int, int, int, int], unwound: Unwound, codes: list[Code] | None) -> str:
    from callpath.formats import measdir as md

    kind, mod, addr, flags = k
    if kind == int(md.NodeKind.PYTHON) and codes is not None:
        c = codes[mod]
        return f"    {c.name} ({c.file}:{addr})"
    if kind == int(md.NodeKind.NATIVE):
        m = unwound.modules[mod]
        elf = unwound.elves[mod]
        a = addr if flags & int(md.NodeFlag.EXACT_PC) else addr - 1
        sym = elf.symbolize(a) if elf is not None else None  # type: ignore[attr-defined]
        where = os.path.basename(m.path)
        return f"    {sym} ({where})" if sym else f"    {where}+{a:#x}"
    if kind == int(md.NodeKind.PARTIAL):
        return "    (the native stack could not be unwound further)"
    return f"    {addr:#x} (in no module)"
