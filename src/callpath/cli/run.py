"""``callpath run [-e EVENT]... [-t] [-o MEASDIR] -- CMD ARGS``: measure a native program."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from callpath.errors import CallpathError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run", help="measure a program by sampling (like hpcrun)",
        description="Run CMD under perf_event sampling (every thread and child process), unwind "
        "the call stacks post-mortem, and write a measurement directory. Default event: "
        "cpu-clock every 1 ms of CPU time (1 kHz).",
        epilog="EVENT is REALTIME (or wall: wall-clock time on and off CPU, and where threads "
        "wait), a software event (cpu-clock, task-clock, page-faults, "
        "context-switches, ...), a hardware event (cycles, instructions, cache-misses, "
        "branch-misses, ...) or a raw code rHEX, optionally with @PERIOD or @fFREQUENCY "
        "(e.g. cpu-clock@500000, cycles@f2000). See docs/run.md.")
    p.add_argument("-e", "--event", action="append", default=[], metavar="EVENT",
                   help="event to sample; repeat for several metrics")
    p.add_argument("-t", "--trace", action="store_true",
                   help="also record a trace: (time, calling context) of every sample")
    p.add_argument("-o", "--output", metavar="MEASDIR", default=None,
                   help="measurement directory (default: callpath-CMD-measurements[-N])")
    p.add_argument("--list-events", action="store_true",
                   help="list the events and whether this machine can open them")
    from callpath.measure.perf import DEFAULT_STACK_SIZE

    p.add_argument("--stack-size", type=_stack_size, default=DEFAULT_STACK_SIZE, metavar="BYTES",
                   help="bytes of user stack copied per sample for unwinding (default "
                   f"{DEFAULT_STACK_SIZE}; "
                   "raise it when the summary reports paths cut short: deep recursion, big "
                   "stack frames, Python interpreters need 32768)")
    p.add_argument("--switch-limit", type=_switch_limit, default=2000, metavar="N",
                   help="-e REALTIME: every context switch gets its call path while the "
                   "program switches less than N times a second; above, they are sampled "
                   "(default 2000; each sampled switch copies the stack)")
    p.add_argument("--top", type=int, default=10, metavar="N",
                   help="procedures in the closing flat summary (0: none)")
    p.add_argument("-m", "--module", metavar="MODULE", default=None,
                   help="measure the Python module MODULE (as 'python -m MODULE ARGS')")
    p.add_argument("--native", action="store_true",
                   help="Python programs: one call path through Python and native code (the "
                   "native stack of every sample is unwound and merged below the Python "
                   "frames; docs/python-measurement.md)")
    p.add_argument("--keep-interpreter-frames", action="store_true",
                   help="with --native: keep every frame: CPython's own frames between two "
                   "Python frames or before an extension (the evaluation loop, vectorcall, "
                   "slot wrappers) and a library's trampolines (dispatchers, wrappers), "
                   "which are elided by default")
    p.add_argument("--finish", metavar="MEASDIR", default=None,
                   help="only post-process MEASDIR (a run whose launcher was killed)")
    p.add_argument("-p", "--pid", type=int, default=None, metavar="PID",
                   help="measure the running process PID (every thread, and threads it "
                   "starts) instead of starting CMD; it keeps running (docs/run.md)")
    p.add_argument("--duration", type=_duration, default=None, metavar="S",
                   help="with --pid: stop after S seconds (default: when the process exits "
                   "or on Ctrl-C)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS")
    p.set_defaults(func=run)


def _duration(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {s!r}") from None
    if not 0 < v < 1e9:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {s!r}")
    return v


def _stack_size(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of bytes, got {s!r}") from None
    if not 0 <= v <= 60000 or v % 8:
        raise argparse.ArgumentTypeError(f"expected a multiple of 8 in 0..60000, got {s!r}")
    return v


def _switch_limit(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected switches per second, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more switches per second, got {s!r}")
    return v


def fresh_path(base: str) -> Path:
    """``base``, else ``base-2``, ``base-3``, ...: the first that does not exist, so that a
    default output never overwrites an earlier measurement or database."""
    p = Path(base)
    n = 2
    while p.exists():
        p = Path(f"{base}-{n}")
        n += 1
    return p


def _default_output(cmd: list[str]) -> Path:
    return fresh_path(f"callpath-{os.path.basename(cmd[0]) or 'program'}-measurements")


def _progress(msg: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(f"\rcallpath: {msg}\x1b[K")
        sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    from callpath.measure import perf_events as events

    if args.list_events:
        from callpath.measure import perf_launch as launch

        probed = launch.probe_events(events.all_events())
        for spec, reason in probed:
            kind = {events.TYPE_SOFTWARE: "software", events.TYPE_HARDWARE: "hardware"}.get(
                spec.type, "raw")
            state = "available" if reason is None else f"unavailable: {reason}"
            print(f"{spec.name:26} {kind:9} {state}")
        # REALTIME: the CPU clock and context switches counted in the kernel
        missing = [f"{s.name}: {r}" for s, r in probed
                   if s.name in ("cpu-clock", launch.SWITCH_EVENT) and r is not None]
        state = "available" if not missing else f"unavailable: {'; '.join(missing)}"
        print(f"{'REALTIME (wall)':26} {'software':9} {state} (wall-clock and off-CPU time)")
        from callpath.measure.gpu.library import unavailable

        why = unavailable()
        print(f"{'gpu=nvidia':26} {'gpu':9} "
              f"{'available' if why is None else 'unavailable: ' + why}")
        print("raw codes: rHEX (e.g. r01c2), with @PERIOD or @fFREQUENCY")
        return 0
    if getattr(args, "keep_interpreter_frames", False) and not args.native:
        raise CallpathError("--keep-interpreter-frames: expected with --native (it keeps "
                            "CPython's frames of the merged native paths)")
    if getattr(args, "pid", None) is not None and any(e.startswith("gpu") for e in args.event):
        raise CallpathError(f"--pid {args.pid}: GPU events are measured only for programs "
                            "callpath starts (expected -e gpu=... without --pid)")
    gpu_kind = None
    if any(e.startswith("gpu") for e in args.event):  # its module costs every run 0.05 s
        from callpath.measure.gpu import session as gpu_session

        args.event, gpu_kind = gpu_session.split_events(list(args.event))
    if gpu_kind is not None and not args.finish:
        out_gpu = Path(args.output) if args.output else None
        status = _run_with_gpu(args, out_gpu)
        return status
    if args.finish:
        from callpath.measure import postmortem
        from callpath.measure import run_summary as summary

        out = Path(args.finish)
        res = postmortem.finish(out, _progress)
        _mark_complete(out, res, None)
        summary.print_summary(out, res, None, args.top, sys.stderr)
        if any(out.glob("gpu-*.raw")):  # -e gpu=nvidia records the launcher left behind
            import json

            from callpath.measure.gpu import session as gpu_session

            raw = json.loads((out / "measurement.json").read_text()).get("raw") or {}
            for line in gpu_session.finish(out, bool(raw.get("trace"))):
                sys.stderr.write(f"callpath: {line}\n")
        return 0
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if getattr(args, "pid", None) is not None:
        from callpath.cli.attach import run_attached

        return run_attached(args, cmd)
    if getattr(args, "duration", None) is not None:
        raise CallpathError("--duration: only with --pid (a program started by callpath runs "
                            "to its end)")
    if args.module is not None:
        return _run_python([args.module, *cmd], True, args)
    if not cmd:
        raise CallpathError("no program to run: expected 'callpath run [options] -- CMD ARGS'")
    from callpath.measure.python.start import is_python_target, mpi_python_target

    if is_python_target(cmd) or (args.native and mpi_python_target(cmd)):
        return _run_python(cmd, False, args)
    # not before: its numpy delays a Python program's start (0.23 -> 0.15 s here)
    from callpath.measure import perf_launch as launch

    texts = args.event or [events.DEFAULT_EVENT]
    clocks = [c for c in (events.parse_realtime(e) for e in texts) if c is not None]
    if len(clocks) > 1:
        raise CallpathError("-e REALTIME given twice: expected it once (with @PERIOD for its "
                            "CPU clock)")
    specs = clocks + [events.parse_event(e) for e in texts if events.parse_realtime(e) is None]
    if clocks and any(s.name in events.CLOCKS or s.name == launch.SWITCH_EVENT
                      for s in specs[1:]):
        raise CallpathError("-e REALTIME measures CPU time and context switches itself: "
                            "expected no other cpu-clock, task-clock or context-switches event")
    out = Path(args.output) if args.output else _default_output(cmd)
    opts = launch.RunOptions(specs, out, trace=args.trace, stack_size=args.stack_size,
                             realtime=bool(clocks), switch_limit=args.switch_limit)
    result = launch.run(cmd, opts)
    for spec, reason in result.failed:
        sys.stderr.write(f"callpath: event {spec.name} not measured: {reason}\n")
    _progress("unwinding call stacks ...")
    from callpath.measure import postmortem
    from callpath.measure import run_summary as summary

    res = postmortem.finish(out, _progress)
    if sys.stderr.isatty():
        sys.stderr.write("\r\x1b[K")
    _mark_complete(out, res, result.exit_status)
    summary.print_summary(out, res, result, args.top, sys.stderr)
    return _shell_status(result.exit_status)


def _run_with_gpu(args: argparse.Namespace, out: Path | None) -> int:
    """``-e gpu=nvidia``: the same run with callpath's CUPTI library injected into every CUDA
    process (measure.gpu.session), then its records converted into the measurement."""
    from callpath.measure.gpu import session as gpu_session

    if out is None:
        cmd = [c for c in args.command if c != "--"] or ["program"]
        name = args.module or next((w for w in cmd[1:] if w.endswith(".py")), cmd[0])
        out = _default_output([name])
        args.output = str(out)
    from callpath.formats.measdir_header import check_new_directory

    check_new_directory(out)
    gpu_session.prepare(out, native=bool(getattr(args, "native", False)))
    try:
        status = run(args)
    finally:
        for line in gpu_session.finish(
                out, bool(args.trace), bool(getattr(args, "keep_interpreter_frames", False))):
            sys.stderr.write(f"callpath: {line}\n")
    return status


def _run_python(cmd: list[str], module: bool, args: argparse.Namespace) -> int:
    """A Python program goes to the in-process Python sampler (Python call paths with file and
    line; docs/python-measurement.md). Its rate comes from a CPU-time event's frequency or
    period (``cpu-clock@f500``, ``cpu-clock@2000000``); other events need the native sampler."""
    from callpath.measure import perf_events as events
    from callpath.measure.python.start import DEFAULT_NATIVE_STACK, run_python

    frequency = 1000.0
    for text in args.event:
        # the Python sampler measures CPU and wall-clock time (REALTIME) of every thread anyway
        spec = events.parse_realtime(text) or events.parse_event(text)
        if spec.name not in ("cpu-clock", "task-clock"):
            raise CallpathError(f"event {text!r}: Python programs are sampled on CPU time; "
                                "expected cpu-clock or task-clock (with @fHZ or @PERIOD_NS)")
        if spec.frequency:
            frequency = float(spec.frequency)
        elif spec.period:
            frequency = 1e9 / float(spec.period)
    name = cmd[0] if module else next((w for w in cmd[1:] if w.endswith(".py")), cmd[0])
    out = Path(args.output) if args.output else _default_output([name])
    return run_python(cmd, module=module, out_dir=out, frequency=frequency, trace=args.trace,
                      native=bool(getattr(args, "native", False)),
                      native_stack=max(args.stack_size, DEFAULT_NATIVE_STACK),
                      keep_interpreter=bool(getattr(args, "keep_interpreter_frames", False)),
                      # set by ``callpath profile``, which reads the structure right after
                      structure_ahead=bool(getattr(args, "structure_ahead", False)),
                      # --top 0 (callpath profile's): no hottest native procedures either
                      native_top=0 if getattr(args, "top", 10) == 0 else 5)


def _shell_status(status: int) -> int:
    """The program's status as a shell reports it: 128+N when killed by signal N."""
    if status < 0:
        return 128 + (-status)
    return status


def _mark_complete(out: Path, res: Any, exit_status: int | None) -> None:
    import json

    from callpath.formats import measdir
    header = json.loads((out / measdir.HEADER_FILE).read_text())
    metrics = [measdir.MetricInfo.from_json(m) for m in header.pop("metrics")]
    for k in ("format", "version"):
        header.pop(k, None)
    header["status"] = "complete"
    if exit_status is not None:
        header["exit_status"] = exit_status
        if exit_status < 0:
            header["signal"] = signal.Signals(-exit_status).name
    header["summary"] = {
        "samples": res.samples, "partial": res.partial, "lost": res.lost,
        "throttled": res.throttled, "undecodable": res.bad,
        "partial_reasons": res.partial_reasons,
        "contexts": [{"pid": t.pid, "tid": t.tid, "thread": t.index, "rank": t.rank,
                      "samples": t.samples, "partial": t.partial,
                      **({"wall_ns": t.time.wall, "cpu_ns": t.time.cpu,
                          "offcpu_ns": round(t.time.off), "blocked_ns": round(t.time.blocked),
                          **({"offcpu_estimated_ns": round(t.time.estimated_off),
                              "estimated_from_ns": t.time.estimated_from - t.time.start}
                             if t.time.estimated else {})}
                         if t.time is not None else {})} for t in res.threads]}
    if res.switch_samples:
        header["summary"]["switch_samples"] = res.switch_samples
        header["summary"]["switches"] = res.switches
    measdir.write_header(out, metrics, **header)
