"""``callpath prof``: attribute measurements to program structure and write a database
(like ``hpcprof``).

``callpath prof MEASDIR... [-S STRUCTFILE]... -o DBDIR`` reads HPCToolkit measurement
directories (``*.hpcrun``, ``*.hpctrace``, ``structs/*.hpcstruct``), merges every thread,
process and rank into one calling context tree and writes an HPCToolkit v4 database with the
sources that exist copied into it. See docs/prof.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from callpath.errors import CallpathError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "prof", help="attribute measurements to structure and write a database (like hpcprof)",
        description="Map every sampled call path through the recovered structure (procedures, "
        "inlined code, loops, lines), merge all execution contexts, and write an HPCToolkit v4 "
        "database.")
    p.add_argument("measdirs", nargs="+", metavar="MEASDIR",
                   help="measurement directories: callpath run / the Python sampler, or "
                   "HPCToolkit's (*.hpcrun, *.hpctrace)")
    p.add_argument("-S", "--structure", action="append", default=[], metavar="STRUCTFILE",
                   help="also use this structure file (repeatable); MEASDIR/structs/ is "
                   "always searched")
    p.add_argument("-o", "--output", required=True, metavar="DBDIR",
                   help="database directory to write (replaced if it holds a database)")
    p.add_argument("--ignore-structs", action="store_true",
                   help="attribute to load module addresses only, like hpcprof "
                   "--ignore-structs")
    p.add_argument("--no-struct-on-demand", action="store_true",
                   help="callpath measurements: do not recover the structure of the "
                   "procedures the samples touched in modules without a structure file; "
                   "attribute them by their symbol tables instead")
    p.add_argument("--no-cache", action="store_true",
                   help="callpath measurements: keep on-demand structure only in MEASDIR/"
                   "structs, not in the per-user cache ($XDG_CACHE_HOME/callpath/structs)")
    p.add_argument("--no-sources", action="store_true",
                   help="do not copy source files into the database")
    p.add_argument("--title", default=None, help="database title (default: the program name)")
    p.add_argument("-j", "--jobs", type=int, default=None,
                   help="worker processes for the reduction (default: the number of cores); "
                   "the database does not depend on it")
    p.add_argument("-M", "--metric", action="append", default=[], choices=["sum", "stats"],
                   help="summary statistics over execution contexts: 'sum' (default) or "
                   "'stats' (also count, sum of squares, min and max, from which mean, standard "
                   "deviation and coefficient of variation follow), like hpcprof -M")
    p.add_argument("--instructions", action="store_true",
                   help="keep each sampled instruction address as an instruction scope under "
                   "its line (v4 instruction contexts): cost per instruction in 'callpath "
                   "lines --instructions' and the viewer's assembler pane (callpath "
                   "measurements only)")
    p.add_argument("--keep-launchers", action="store_true",
                   help="keep the processes that launched the MPI ranks (mpiexec, its proxies, "
                   "a job script's shell) as execution contexts; left out by default")
    p.add_argument("--mpi", action="store_true",
                   help="reduce across the ranks of an MPI job (mpirun -n N callpath prof "
                   "--mpi ...; needs mpi4py); rank 0 writes the database")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from callpath.attribute.hpctk import is_hpctoolkit_measurements, prof_hpctoolkit
    from callpath.attribute.prof_measdir import is_callpath_measurements, prof_measdir
    from callpath.formats.v4.writer import write_v4

    dirs = [Path(d) for d in args.measdirs]
    kinds = set()
    for d in dirs:
        if not d.is_dir():
            raise CallpathError(f"{d}: not a directory (expected a measurement directory)")
        if is_callpath_measurements(d):
            kinds.add("callpath")
        elif is_hpctoolkit_measurements(d):
            kinds.add("hpctoolkit")
        else:
            raise CallpathError(f"{d}: neither measurement.json nor *.hpcrun profiles in this "
                                "directory (expected a measurement directory)")
    if len(kinds) > 1:
        raise CallpathError("callpath and HPCToolkit measurement directories cannot be "
                            "combined in one database")
    structs = [Path(s) for s in args.structure]
    for s in structs:
        if not s.is_file():
            raise CallpathError(f"-S {s}: no such structure file")
    from callpath.formats.v4.writer import check_output_directory

    out = check_output_directory(args.output)
    if out.exists() and not out.is_dir():
        raise CallpathError(f"-o {out}: exists and is not a directory")
    if args.jobs is not None and args.jobs < 1:
        raise CallpathError(f"-j {args.jobs}: expected a positive number of workers")
    from callpath.attribute.reduce import workers_default

    extra: dict[str, Any] = {}
    if getattr(args, "instructions", False):
        if "callpath" not in kinds:
            raise CallpathError("--instructions applies to callpath measurement directories "
                                "(HPCToolkit's hpcprof keeps instruction contexts itself)")
        extra["instructions"] = True
    if "callpath" in kinds:
        extra["keep_launchers"] = args.keep_launchers
        extra["on_demand"] = not args.no_struct_on_demand
        extra["user_cache"] = not args.no_cache
        extra["notify"] = _notifier(args.mpi)
    reduce = prof_measdir if "callpath" in kinds else prof_hpctoolkit
    exp = reduce(dirs, structs, ignore_structs=args.ignore_structs, title=args.title,
                 workers=args.jobs or workers_default(), mpi=args.mpi,
                 stats="stats" in args.metric, **extra)
    if exp is None:  # an MPI rank other than 0: its share went to rank 0
        return 0
    write_v4(exp, out, copy_sources=not args.no_sources)
    n_ctx = len(exp.contexts)
    sys.stdout.write(f"callpath prof: {len(exp.cct)} contexts from {n_ctx} execution "
                     f"context{'s' if n_ctx != 1 else ''} written to {out}\n")
    return 0


def _notifier(mpi: bool) -> Callable[[str], None]:
    """A one-line note on stderr, from rank 0 only under --mpi (every rank decides alike)."""
    def note(msg: str) -> None:
        if mpi:
            from mpi4py import MPI
            if MPI.COMM_WORLD.Get_rank() != 0:
                return
        sys.stderr.write(f"callpath prof: {msg}\n")
    return note
