"""``python -m callpath.measure.python [-o DIR] [-F HZ] [-t] [-m MOD | SCRIPT | python ...] ARGS``.

A stand-alone front end to :func:`callpath.measure.python.start.run_python`, the function that
``callpath run`` calls for Python targets. User errors print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from callpath.errors import CallpathError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m callpath.measure.python",
        description="Measure a Python program (and every Python process it starts) by sampling.")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help="measurement directory (default: callpath-NAME-measurements[-N])")
    p.add_argument("-F", "--frequency", type=float, default=1000.0,
                   help="samples per second, wall-clock (default 1000)")
    p.add_argument("-t", "--trace", action="store_true", help="also record a trace of samples")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary at the end")
    p.add_argument("--native", action="store_true",
                   help="merge the native stack of every sample below its Python frames")
    p.add_argument("--keep-interpreter-frames", action="store_true",
                   help="with --native: keep the interpreter's call machinery and a "
                   "library's trampolines (elided by default)")
    # callpath profile's: build the Python sources' structure beside the --native merge
    p.add_argument("--structure-ahead", action="store_true", help=argparse.SUPPRESS)
    # callpath profile's too: its report follows, the summary names no native procedure
    p.add_argument("--native-top", type=int, default=5, help=argparse.SUPPRESS)
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a module, like python -m")
    p.add_argument("program", nargs=argparse.REMAINDER,
                   help="SCRIPT ARGS, or a python command line")
    args = p.parse_args(argv)
    target = [args.module, *args.program] if args.module else list(args.program)
    if target and target[0] == "--":
        target = target[1:]
    if args.keep_interpreter_frames and not args.native:
        sys.stderr.write("callpath: error: --keep-interpreter-frames: expected with --native "
                         "(it keeps CPython's frames of the merged native paths)\n")
        return 2
    from callpath.measure.python.start import run_python
    out = args.output
    if out is None:  # like callpath run: callpath-NAME-measurements[-N]
        name = Path(target[0]).stem if target else "python"
        out = Path(f"callpath-{name}-measurements")
        n = 1
        while out.exists():
            n += 1
            out = Path(f"callpath-{name}-measurements-{n}")
    try:
        return run_python(target, module=bool(args.module), out_dir=out,
                          frequency=args.frequency, trace=args.trace, summary=not args.quiet,
                          native=args.native, keep_interpreter=args.keep_interpreter_frames,
                          structure_ahead=args.structure_ahead and args.native,
                          native_top=args.native_top)
    except CallpathError as e:
        sys.stderr.write(f"callpath: error: {e}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
