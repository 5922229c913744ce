"""``callpath diff BASE NEW -o DB``: a database comparing two runs (base, new, delta, ratio).

The comparison itself lives in :mod:`callpath.analysis.compare`, the writing of the comparison
database (shared with ``callpath merge`` and the viewer's Compare) in
:mod:`callpath.engine.comparison`; this module is the command line.
"""

from __future__ import annotations

import argparse
import os


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "diff", help="compare two databases: base, new, delta and ratio columns",
        description="Match the calling contexts of two databases by what they are (procedure "
        "names, load module file names, call, loop and statement lines along the path from "
        "the root) and write a database whose metrics are 'M [base]' and 'M [new]' for each "
        "metric M, with the derived metrics 'M [delta] (I|E)' (new - base) and "
        "'M [ratio] (I|E)' (new / base). A context found in one run only has 0 in the other.")
    p.add_argument("base", metavar="BASE", help="the reference database")
    p.add_argument("new", metavar="NEW", help="the database compared with it")
    p.add_argument("-o", "--output", required=True, metavar="DB",
                   help="directory of the comparison database to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from callpath.engine.comparison import write_comparison

    out = write_comparison([args.base, args.new], args.output, diff=True)
    print(f"wrote {out}: 'callpath report {os.fspath(out)}' or 'callpath view "
          f"{os.fspath(out)}'")
    return 0
