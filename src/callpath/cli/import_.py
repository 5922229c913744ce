"""``callpath import FILE -o DB``: another tool's profile as a callpath (HPCToolkit v4)
database, so that every view, comparison and export works on it.

Folded stacks, speedscope JSON, pprof ``profile.proto`` (gzipped or not) and ``perf script``
output, recognised by content (:mod:`callpath.formats.import_detect`).
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "import", help="read folded stacks, speedscope, pprof or perf script output into a "
        "database",
        description="Read a profile written by another tool (folded stacks, speedscope JSON, "
        "pprof profile.proto gzipped or not, 'perf script' output; recognised by content) and "
        "write it as a callpath database (HPCToolkit's v4 format).")
    p.add_argument("file", help="the profile to read")
    p.add_argument("--output", "-o", required=True, help="database directory to write")
    p.add_argument("--title", default=None, help="the database's title (default: the file "
                   "name)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from callpath.formats.import_build import build
    from callpath.formats.import_detect import read_profile
    from callpath.formats.v4.writer import write_v4

    fmt, ss = read_profile(args.file)
    if args.title:
        ss.title = args.title
    exp = build(ss)
    out = write_v4(exp, args.output, copy_sources=False)
    n = int((ss.values != 0).any(axis=1).sum())
    sys.stderr.write(f"callpath: imported {n} stacks ({fmt}) into {out}: {len(exp.cct)} "
                     f"contexts, {len(exp.contexts)} execution contexts, metrics "
                     f"{', '.join(m.name for m in exp.metrics)}\n")
    return 0
