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
                   help="parallel workers (default: the number of cores)")
    p.add_argument("--no-cache", action="store_true",
                   help="do not read or write the per-user structure cache")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from callpath.structure.driver import (
        Job,
        ProgressBar,
        build_id_of,
        cache_key,
        run_jobs,
        user_cache_dir,
    )

    workers = args.jobs or os.cpu_count() or 1
    if len(args.inputs) == 1 and os.path.isdir(args.inputs[0]):
        return _run_measdir(Path(args.inputs[0]), args, workers)
    for x in args.inputs:
        if os.path.isdir(x):
            raise CallpathError(f"{x}: a measurement directory must be the only input")
    jobs = []
    for x in args.inputs:
        cache = [] if args.no_cache else [
            user_cache_dir() / (cache_key(x, build_id_of(x)) + ".hpcstruct")]
        jobs.append(Job(x, os.path.abspath(x), cache))
    results = run_jobs(jobs, workers, ProgressBar())
    return _write(results, args.output, per_input_dir=Path.cwd())


def _write(results: Sequence[object], output: str | None, per_input_dir: Path | None) -> int:
    from callpath.formats.hpcstruct import write_hpcstruct, write_hpcstruct_file
    from callpath.structure.driver import Result

    status = 0
    good = []
    for r in results:
        assert isinstance(r, Result)
        if r.error is not None:
            sys.stderr.write(f"callpath struct: {r.error}\n")
            status = 2
        elif r.structure is not None:
            good.append(r)
    if output == "-":
        write_hpcstruct([r.structure for r in good if r.structure is not None], sys.stdout)
    elif output is not None:
        if good:
            write_hpcstruct_file([r.structure for r in good if r.structure is not None], output)
    elif per_input_dir is not None:
        for r in good:
            assert r.structure is not None
            dest = per_input_dir / (os.path.basename(r.job.path) + ".hpcstruct")
            write_hpcstruct_file([r.structure], dest)
            sys.stderr.write(f"wrote {dest}\n") if sys.stderr.isatty() else None
    return status


def _run_measdir(d: Path, args: argparse.Namespace, workers: int) -> int:
    from callpath.formats import measdir
    from callpath.structure.driver import Job, ProgressBar, build_id_of, cache_key, run_jobs
    from callpath.structure.driver import user_cache_dir as ucd

    m = measdir.read(d)
    seen: dict[str, Job] = {}
    for proc in m.processes:
        for mod in proc.modules:
            path = str(d / mod.saved) if mod.saved else mod.path
            if path in seen or not path or path.startswith("["):
                continue
            if not os.path.isfile(path):
                sys.stderr.write(f"callpath struct: {path}: load module not found, skipped\n")
                continue
            key = cache_key(mod.path, mod.build_id or build_id_of(path))
            cache = [d / "structs" / f"{key}.hpcstruct"]
            if not args.no_cache:
                cache.append(ucd() / f"{key}.hpcstruct")
            seen[path] = Job(path, mod.path, cache)
        for code in proc.pycode:
            f = code.file
            if f in seen or not f.endswith(".py") or not os.path.isfile(f):
                continue
            key = cache_key(f, None)
            cache = [d / "structs" / f"{key}.hpcstruct"]
            seen[f] = Job(f, f, cache)
    results = run_jobs(list(seen.values()), workers, ProgressBar())
    status = _write(results, args.output, per_input_dir=None)
    ok = sum(1 for r in results if r.error is None)
    if sys.stderr.isatty():
        sys.stderr.write(f"{ok} of {len(results)} modules in {d / 'structs'}\n")
    return status
