"""``callpath run --pid PID [--duration S]``: measure a process that is already running.

Kept apart from ``cli/run.py`` so that launching and attaching change independently; the
measurement directory written is the one ``run`` writes, so ``struct``, ``prof`` and
``profile`` read it unchanged.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from callpath.errors import CallpathError

if TYPE_CHECKING:
    from callpath.measure.remote_python import RemotePython


def run_attached(args: argparse.Namespace, cmd: list[str]) -> int:
    """Attach to ``args.pid``, sample it, unwind post-mortem, print the summary."""
    from callpath.cli.run import _mark_complete, _progress, fresh_path
    from callpath.measure import attach_pid as attach

    pid = int(args.pid)
    if cmd:
        raise CallpathError(f"--pid {pid}: expected no command (the process is already "
                            f"running), got {' '.join(cmd)!r}")
    if getattr(args, "module", None) is not None:
        raise CallpathError("--pid and -m: expected one of them (-m starts a Python module)")
    attach.check_pid(pid)
    if args.event and getattr(args, "native", False):
        raise CallpathError(f"--pid {pid}: -e and --native: expected one of them (-e samples "
                            "native call paths alone; --native adds native frames to the "
                            "Python paths of a Python process)")
    if not args.event and _is_python(pid):
        from callpath.measure.remote_python import RemotePython

        try:
            remote = RemotePython(pid)
        except CallpathError as e:  # another version, no symbols: its native paths instead
            sys.stderr.write(f"callpath: {e}; measuring its native call paths instead\n")
        except PermissionError as e:
            raise attach.access_error(pid, e.errno or 1, "read the memory of") from None
        else:
            return _attach_python(args, pid, remote)
    from callpath.measure import perf_events as events
    from callpath.measure import postmortem
    from callpath.measure import run_summary as summary

    if getattr(args, "native", False):
        raise CallpathError(f"--pid {pid}: --native is for Python processes (this one runs no "
                            "CPython 3.11-3.13)")
    specs = [events.parse_event(e) for e in (args.event or [events.DEFAULT_EVENT])]
    if args.output:
        out = Path(args.output)
    else:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip() or "program"
        except OSError:
            name = "program"
        out = fresh_path(f"callpath-{name.replace('/', '_')}-{pid}-measurements")
    opts = attach.AttachOptions(specs, out, duration=args.duration, trace=args.trace,
                                stack_size=args.stack_size)
    how = f"for {args.duration:g} s" if args.duration else "until it exits or Ctrl-C"
    if sys.stderr.isatty():
        sys.stderr.write(f"callpath: attached to process {pid}, sampling {how}\n")
    result = attach.attach(pid, opts)
    for spec, reason in result.failed:
        sys.stderr.write(f"callpath: event {spec.name} not measured: {reason}\n")
    _progress("unwinding call stacks ...")
    res = postmortem.finish(out, _progress)
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[K")
    _mark_complete(out, res, None)
    ev = ", ".join(e.spec.name for e in result.events)
    end = "exited" if result.exited else "kept running (detached)"
    sys.stderr.write(f"callpath: attached to process {pid} ({result.threads} threads) for "
                     f"{result.wall_s:.2f} s, sampled on {ev}; the process {end}.\n")
    summary.print_summary(out, res, None, args.top, sys.stderr)
    return 0


#: samples per second of a Python process read from outside (py-spy's default too): each
#: sample reads every thread's stack, and the reads cost the measured program nothing but
#: memory bandwidth; the sampler's own CPU grows with the rate
REMOTE_FREQUENCY = 100.0


def _attach_python(args: argparse.Namespace, pid: int, remote: RemotePython) -> int:
    """A CPython 3.11-3.13 process: Python call paths with lines, read from its memory."""
    from callpath.cli.run import fresh_path
    from callpath.measure.remote_sampler import attach_python

    native = bool(getattr(args, "native", False))
    frequency = REMOTE_FREQUENCY
    name = Path(f"/proc/{pid}/comm").read_text().strip() if os.path.exists(
        f"/proc/{pid}/comm") else "python"
    out = Path(args.output) if args.output else fresh_path(
        f"callpath-{name.replace('/', '_')}-{pid}-measurements")
    res, pairing = attach_python(
        pid, out, duration=args.duration, frequency=frequency, remote=remote, native=native,
        keep_interpreter=bool(getattr(args, "keep_interpreter_frames", False)),
        stack_size=int(getattr(args, "stack_size", 0) or 0))
    end = "exited" if res.exited else "kept running (detached)"
    ver = ".".join(map(str, remote.version))
    sys.stderr.write(
        f"callpath: read the Python stacks of process {pid} (Python {ver}, {res.threads} "
        f"threads) {res.ticks} times in {res.wall_s:.2f} s: {res.samples} thread samples, "
        f"{res.unreadable} unreadable (changed while read); the process {end}.\n")
    if pairing is not None:
        from callpath.measure.remote_native import describe

        sys.stderr.write(f"callpath: native stacks: {describe(pairing)}.\n")
    sys.stderr.write(f"callpath: measurement directory: {out}\n")
    return 0


def _is_python(pid: int) -> bool:
    """Whether ``pid`` runs CPython (its executable or a libpython mapped)."""
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False
    return exe.startswith("python") or "libpython3" in maps
