"""``callpath profile [run options] -- CMD ARGS``: measure, recover structure, attribute.

The steps of ``callpath run`` and ``callpath prof`` in one command, then the top of the report
and the commands that open the result. Structure is recovered on demand by ``prof``: only the
procedures the samples touched, cached per build-id (``structure/ondemand.py``), so a library
that is mapped but never sampled is never analysed. A Python script (``CMD`` ending in ``.py``,
or ``--python``) is measured by the Python sampler instead of perf_event sampling. A module
whose structure cannot be recovered is reported and attributed by address; the database is
still written. The time of each phase (measure, structure, attribute, write) is printed at the
end, so that a user sees where the time after the program goes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

from callpath.cli.run import fresh_path
from callpath.errors import CallpathError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "profile", help="run + struct + prof in one command",
        description="Measure CMD (callpath run, or the Python sampler for a .py script), "
        "recover the structure of every module it used, write the database, and print the "
        "top of its report.")
    p.add_argument("-e", "--event", action="append", default=[], metavar="EVENT",
                   help="event to sample (native programs; see callpath run); repeatable")
    p.add_argument("-t", "--trace", action="store_true", help="also record a trace")
    p.add_argument("-m", "--measurements", metavar="MEASDIR", default=None,
                   help="measurement directory (default: callpath-CMD-measurements[-N])")
    p.add_argument("-o", "--output", metavar="DBDIR", default=None,
                   help="database directory (default: callpath-CMD-database[-N])")
    p.add_argument("--python", action="store_true",
                   help="CMD is a Python program: measure it with the Python sampler")
    p.add_argument("--native", action="store_true",
                   help="Python programs: merge native call stacks below the Python frames")
    p.add_argument("--keep-interpreter-frames", action="store_true",
                   help="with --native: keep CPython's own call machinery and a library's "
                   "trampolines (elided by default)")
    p.add_argument("-F", "--frequency", type=int, default=None,
                   help="Python sampler: samples per second (default 1000)")
    p.add_argument("-d", "--depth", type=int, default=16,
                   help="depth of the report printed at the end (default 16)")
    p.add_argument("-p", "--pid", type=int, default=None, metavar="PID",
                   help="measure the running process PID instead of starting CMD (see "
                   "callpath run --pid)")
    from callpath.cli.run import _duration

    p.add_argument("--duration", type=_duration, default=None, metavar="S",
                   help="with --pid: stop after S seconds (default: at its exit or Ctrl-C)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if getattr(args, "pid", None) is not None:
        cmd = _attached_name(args.pid, cmd)
    if not cmd:
        raise CallpathError("no program to run: expected 'callpath profile [options] -- CMD "
                            "ARGS'")
    if args.depth < 1:
        raise CallpathError(f"-d {args.depth}: expected a positive depth")
    if args.keep_interpreter_frames and not args.native:
        raise CallpathError("--keep-interpreter-frames: expected with --native (it keeps "
                            "CPython's frames of the merged native paths)")
    python = (args.python or cmd[0].endswith(".py")) and getattr(args, "pid", None) is None
    name = os.path.basename(cmd[0]).removesuffix(".py") or "program"
    meas = Path(args.measurements) if args.measurements else fresh_path(
        f"callpath-{name}-measurements")
    db = Path(args.output) if args.output else fresh_path(f"callpath-{name}-database")
    if args.output is not None:
        # before the program runs: a database directory that cannot take the database would
        # otherwise be found only after the whole measurement
        from callpath.formats.v4.writer import check_output_directory

        check_output_directory(args.output)
        if db.resolve() == meas.resolve():
            raise CallpathError(f"-o {args.output}: is also the measurement directory (-m); "
                                "expected two different directories")
        created = not db.exists()
        try:  # a file in the way, a read-only parent: said before, not after, the run
            db.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CallpathError(f"{db}: cannot create the database directory: "
                                f"{e.strerror or e}") from None
    else:
        created = False
    try:
        return _measure_and_write(cmd, meas, db, args, python)
    finally:
        if created:  # the directory made for a database that did not come: not left behind
            with contextlib.suppress(OSError):
                db.rmdir()  # only when empty


def _measure_and_write(cmd: list[str], meas: Path, db: Path, args: argparse.Namespace,
                       python: bool) -> int:
    import time

    t0 = time.perf_counter()
    status = _measure(cmd, meas, args, python)
    phases: dict[str, float] = {"measure": time.perf_counter() - t0}
    if not (meas / "measurement.json").is_file():
        if status != 0:  # the Python sampler refused (no such script, a bad -F) and said why
            return status
        raise CallpathError(f"{meas}: the measurement was not written (the program could not "
                            "be measured)")
    merge, ahead, ended = _after_program(meas)
    if merge is not None:  # --native of Python: its stacks merged after the program
        phases["measure"] = max(phases["measure"] - merge - ahead, 0.0)
        phases["merge"] = merge
    from callpath.attribute.prof_measdir import prof_measdir
    from callpath.attribute.reduce import workers_default
    from callpath.formats.v4.writer import write_v4

    def note(msg: str) -> None:
        sys.stderr.write(f"callpath profile: {msg}\n")

    exp = prof_measdir([meas], [], workers=workers_default(), notify=note, phases=phases)
    assert exp is not None  # None only for MPI ranks other than 0
    if ahead:  # the Python sources' structure, built beside the merge, waited for after it
        phases["structure"] = phases.get("structure", 0.0) + ahead
    t1 = time.perf_counter()
    write_v4(exp, db)
    phases["write"] = time.perf_counter() - t1
    from callpath.cli.main import main as cli_main

    sys.stdout.write(f"\ncallpath profile: database {db} ({len(exp.cct)} contexts, "
                     f"{len(exp.contexts)} execution contexts)\n\n")
    sys.stdout.flush()
    t2 = time.perf_counter()
    cli_main(["report", str(db), "-d", str(args.depth), "-t", "1"])
    phases["report"] = time.perf_counter() - t2
    q = shlex.quote(str(db))
    sys.stdout.write(f"\nFull report:  callpath report {q}\nViewer:       callpath view {q}\n")
    after = f" ({time.time() - ended:.2f} s after the program)" if ended is not None else ""
    sys.stdout.write("Time:         " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items())
                     + after + "\n")
    return status


def _after_program(meas: Path) -> tuple[float | None, float, float | None]:
    """From the Python sampler's measurement.json: how long its ``--native`` merge took after
    the program (``native_merge_s``; None where there was none), how long it then waited for
    the structure built beside it (``structure_ahead_s``), and when the program ended
    (``program_end_time``, the epoch; None where it is not recorded)."""
    import json

    try:
        head = json.loads((meas / "measurement.json").read_text())
        got = [head.get("native_merge_s"), head.get("structure_ahead_s"),
               head.get("program_end_time")]
    except (OSError, ValueError, AttributeError):
        return None, 0.0, None
    merge, ahead, ended = (float(v) if isinstance(v, (int, float)) else None for v in got)
    return merge, ahead or 0.0, ended


def _measure(cmd: list[str], meas: Path, args: argparse.Namespace, python: bool) -> int:
    if python and not any(e.startswith("gpu=") for e in args.event):
        argv = [sys.executable, "-m", "callpath.measure.python", "-o", str(meas)]
        if args.trace:
            argv.append("-t")
        if args.native:
            argv += ["--native", "--structure-ahead", "--native-top", "0"]
        if args.keep_interpreter_frames:
            argv.append("--keep-interpreter-frames")
        if args.frequency is not None:  # 0 too: the sampler says why it is refused
            argv += ["-F", str(args.frequency)]
        if cmd[0].endswith(".py"):
            argv += cmd
        elif os.path.basename(cmd[0]).startswith("python"):
            argv += cmd[1:]
        else:
            argv += cmd
        env = dict(os.environ)
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        return _run_sampler(argv, env)
    from callpath.cli import run as run_cli

    # callpath run's own parser fills in every option it has (defaults included)
    parser = argparse.ArgumentParser(prog="callpath")
    run_cli.add_parser(parser.add_subparsers(dest="command_name"))
    argv = ["run", "-o", str(meas), "--top", "0"] + (["--native"] if args.native else [])
    if args.keep_interpreter_frames:
        argv.append("--keep-interpreter-frames")
    for event in args.event:
        argv += ["-e", event]
    if args.trace:
        argv.append("-t")
    if getattr(args, "pid", None) is not None:
        argv += ["--pid", str(args.pid)]
        if args.duration is not None:
            argv += ["--duration", str(args.duration)]
        ns = parser.parse_args(argv)
        return int(ns.func(ns))
    ns = parser.parse_args([*argv, "--", *cmd])
    # a Python program's --native merge: its Python sources' structure built beside it
    ns.structure_ahead = bool(args.native)
    return int(ns.func(ns))


def _run_sampler(argv: list[str], env: dict[str, str]) -> int:
    """Run the Python sampler's launcher to its end; its exit status.

    Ctrl-C reaches the program through the terminal's process group, and the launcher
    outlives it to write the measurement (and merge ``--native`` stacks): this process waits
    for the launcher too, ignoring SIGINT meanwhile, and goes on to the database and the
    report, as ``perf record`` and ``py-spy record`` write what they recorded. Meanwhile it
    imports what it needs after the program (0.1-0.2 s that would otherwise come after it)."""
    import signal

    try:
        proc = subprocess.Popen(argv, env=env)
    except OSError as e:
        raise CallpathError(f"cannot start the Python sampler: {e}") from None
    old = None
    with contextlib.suppress(ValueError):  # not the main thread: signals left alone
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _import_the_rest()
        return proc.wait()
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)


#: what the steps after the measurement import (attribution, on-demand structure and its ELF
#: and x86 readers, the database writer, the report): 0.2 s of imports, made while the
#: program runs instead of after it
_AFTER_THE_PROGRAM = ("callpath.attribute.prof_measdir", "callpath.structure.ondemand",
                      "callpath.structure.binary", "callpath.structure.symbols",
                      "callpath.formats.v4.writer", "callpath.formats.v4.reader",
                      "callpath.cli.main", "callpath.present.viewreport",
                      "callpath.analysis.topdown", "elftools.elf.elffile", "iced_x86")


def _import_the_rest() -> None:
    """Import :data:`_AFTER_THE_PROGRAM`. An import that fails here fails again where it is
    needed, and is reported there."""
    import importlib

    for name in _AFTER_THE_PROGRAM:
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _attached_name(pid: int, cmd: list[str]) -> list[str]:
    """With --pid, the process's name stands for CMD in the default directory names."""
    from callpath.measure.attach_pid import check_pid

    if cmd:
        raise CallpathError(f"--pid {pid}: expected no command (the process is already "
                            f"running), got {' '.join(cmd)!r}")
    check_pid(pid)
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip().replace("/", "_")
    except OSError:
        name = ""
    return [f"{name or 'program'}-{pid}"]
