"""``callpath struct``: recover program structure (like ``hpcstruct``).

``callpath struct BINARY... [-o FILE]`` writes HPCToolkit structure XML (one ``<name>.hpcstruct``
per input, or every module into FILE); ``callpath struct MEASDIR`` analyses every load module
(and Python source) a measurement used, once per build-id, in parallel, caching the results in
``MEASDIR/structs/``. A module that cannot be analysed is reported on its own line and the
others are still written; the exit status is then 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from callpath.errors import CallpathError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "struct", help="recover program structure from binaries (like hpcstruct)",
        description="Recover procedures, inlined code, loop nests and source lines from ELF "
        "binaries (and Python sources), and write them as HPCToolkit structure XML.")
    p.add_argument("inputs", nargs="+", metavar="BINARY|MEASDIR",
                   help="ELF load modules or .py files; or one measurement directory")
    p.add_argument("-o", "--output", default=None,
                   help="write every module into this file ('-' for standard output); by "
                   "default each BINARY goes to ./<name>.hpcstruct")
    p.add_argument("-j", "--jobs", type=int, default=None,
                   help="parallel workers, also within one large module and for writing "
                   "its structure file (default: the number of cores, of which a single "
                   "module uses the idle ones)")
    p.add_argument("--no-cache", action="store_true",
                   help="do not read or write the per-user structure cache")
    p.add_argument("--debug-root", action="append", default=[], metavar="DIR",
                   help="also look for separate debug files under DIR (as under /usr/lib/debug: "
                   "DIR/.build-id/xx/rest.debug, DIR/<binary's dir>/<debuglink>); repeatable; "
                   "also set by CALLPATH_DEBUG_ROOT (':'-separated)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="one line per module: analysed, from the cache, or failed")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from callpath.structure.driver import (
        Job,
        ProgressBar,
        cache_key,
        module_identity,
        run_jobs,
        user_cache_dir,
    )

    if args.jobs is not None and args.jobs < 1:
        raise CallpathError(f"-j {args.jobs}: expected a positive number of workers")
    workers = args.jobs or os.cpu_count() or 1
    if args.output not in (None, "-"):
        _refuse_overwriting_inputs(args.output, args.inputs)
    if args.debug_root:
        for r in args.debug_root:
            if not os.path.isdir(r):
                raise CallpathError(f"--debug-root {r}: not a directory")
        old = os.environ.get("CALLPATH_DEBUG_ROOT", "")
        # Through the environment, so that the worker processes see it too.
        os.environ["CALLPATH_DEBUG_ROOT"] = os.pathsep.join(
            [os.path.abspath(r) for r in args.debug_root] + ([old] if old else []))
    if len(args.inputs) == 1 and os.path.isdir(args.inputs[0]):
        return _run_measdir(Path(args.inputs[0]), args, workers)
    for x in args.inputs:
        if os.path.isdir(x):
            raise CallpathError(f"{x}: a measurement directory must be the only input")
    jobs = []
    for x in args.inputs:
        cache = [] if args.no_cache or x.endswith(".py") else [
            user_cache_dir() / (cache_key(x, *module_identity(x)) + ".hpcstruct")]
        jobs.append(Job(x, os.path.abspath(x), cache))
    results = run_jobs(jobs, workers, ProgressBar(), explicit=args.jobs is not None)
    return _write(results, args.output, per_input_dir=Path.cwd(), verbose=args.verbose,
                  jobs=_write_jobs(args, workers))


def _refuse_overwriting_inputs(output: str, inputs: Sequence[str]) -> None:
    """'struct -o prog prog' wrote the XML over the binary it analysed: an output that is an
    input, or a file at the top of an input measurement directory (its measurement.json and
    profiles), is refused before anything is read."""
    if not output:
        raise CallpathError("-o '': expected a file name ('-' for standard output)")
    out = Path(output).resolve()
    if not out.exists():
        return
    for x in inputs:
        if os.path.isdir(x):
            if out.parent == Path(x).resolve():
                raise CallpathError(f"-o {output}: would overwrite a file of the measurement "
                                    f"directory {x}; expected a path outside it")
        elif os.path.exists(x) and os.path.samefile(out, x):
            raise CallpathError(f"-o {output}: is the input {x}; expected another file for "
                                "the structure")


def _write_jobs(args: argparse.Namespace, workers: int) -> int:
    """Processes that may write one large structure file: as many as ``-j`` asked for, else
    the idle cores (as for the analysis, driver.run_jobs)."""
    from callpath.structure.driver import idle_cores

    return workers if args.jobs is not None else idle_cores(workers)


def _write(results: Sequence[object], output: str | None, per_input_dir: Path | None,
           verbose: bool = False, jobs: int = 1) -> int:
    from callpath.formats.hpcstruct import write_hpcstruct, write_hpcstruct_file
    from callpath.structure.driver import Result

    status = 0
    good = []
    for r in results:
        assert isinstance(r, Result)
        if r.error is not None:
            sys.stderr.write(f"callpath struct: {r.error}\n")
            status = 2
        else:
            for note in r.notes or ():
                sys.stderr.write(f"callpath struct: {note}\n")
            if r.structure is not None:
                good.append(r)
            if verbose:
                how = "from the cache" if r.cached else "analysed"
                sys.stderr.write(f"callpath struct: {r.job.name}: {how}\n")
    if output == "-":
        write_hpcstruct([r.structure for r in good if r.structure is not None], sys.stdout,
                        jobs=jobs)
    elif output is not None:
        if good:
            write_hpcstruct_file([r.structure for r in good if r.structure is not None], output,
                                 jobs=jobs)
    elif per_input_dir is not None:
        for r in good:
            assert r.structure is not None
            dest = per_input_dir / (os.path.basename(r.job.path) + ".hpcstruct")
            write_hpcstruct_file([r.structure], dest, jobs=jobs)
            sys.stderr.write(f"wrote {dest}\n") if sys.stderr.isatty() else None
    return status


def _run_measdir(d: Path, args: argparse.Namespace, workers: int) -> int:
    from callpath.structure.driver import ProgressBar, measurement_jobs, run_jobs, write_index

    jobs = measurement_jobs(d, user_cache=not args.no_cache)
    if args.output is None:  # only MEASDIR/structs/ is wanted: cache hits need no parsing
        for j in jobs:
            j.need_structure = False
    results = run_jobs(jobs, workers, ProgressBar(), explicit=args.jobs is not None)
    write_index(d, results)
    status = _write(results, args.output, per_input_dir=None, verbose=args.verbose,
                    jobs=_write_jobs(args, workers))
    ok = sum(1 for r in results if r.error is None)
    if sys.stderr.isatty() or args.verbose:
        sys.stderr.write(f"callpath struct: {ok} of {len(results)} modules in "
                         f"{d / 'structs'}\n")
    return status
