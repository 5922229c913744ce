"""``callpath dump --pid PID``: print every thread's current call path once (like py-spy dump).

For a program that hangs: which thread waits where. Python processes (CPython 3.11-3.13) show
each thread's Python frames with file and line, read from the interpreter's memory without
stopping it (``measure.remote_python``); every thread also shows its scheduler state and the
kernel function it waits in (``/proc/PID/task/TID/wchan``), which for a native program is the
part of the answer that needs no stop.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from callpath.errors import CallpathError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "dump", help="print the current call path of every thread of a running process",
        description="Print every thread of the running process PID with its state and, for "
        "CPython 3.11-3.13, its Python call path with file and line (read from the process's "
        "memory; the process is not stopped). See docs/run.md.")
    p.add_argument("-p", "--pid", type=int, required=True, metavar="PID",
                   help="the process to inspect")
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
    from callpath.measure import attach
    from callpath.measure.remote_python import RemotePython

    pid = int(args.pid)
    attach.check_pid(pid)
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError as e:
        raise attach.access_error(pid, e.errno or 0, "inspect") from None
    py: dict[int, list[str]] = {}
    note = ""
    try:
        remote = RemotePython(pid)
    except CallpathError as e:
        note = str(e).split(": ", 1)[-1]
    except PermissionError as e:
        raise attach.access_error(pid, e.errno or 1, "read the memory of") from None
    else:
        try:
            threads = remote.threads()
        except PermissionError as e:
            raise attach.access_error(pid, e.errno or 1, "inspect") from None
        except ProcessLookupError:
            raise attach.access_error(pid, 3) from None
        for t in threads:
            lines = [f"    {f.code.name} ({f.code.file}:{f.line})" for f in t.frames]
            if t.error:
                lines = [f"    (the stack changed while read: {t.error}; dump again)"]
            elif not lines:
                lines = ["    (no Python frame: the thread runs no Python code now)"]
            py[t.native_id] = lines
        ver = ".".join(map(str, remote.version))
        note = f"Python {ver}"
    out = sys.stdout
    out.write(f"Process {pid}: {exe} ({note})\n")
    for tid in attach.tids_of(pid):
        name, state, wchan = _task(pid, tid)
        where = f", in {wchan}" if wchan else ""
        main = " (main)" if tid == pid else ""
        out.write(f"\nThread {tid}{main} \"{name}\": {state}{where}\n")
        for line in py.get(tid, []):
            out.write(line + "\n")
    out.flush()
    return 0
