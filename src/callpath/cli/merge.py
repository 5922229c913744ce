"""``callpath merge DB DB... -o DB``: hpcviewer's "merge databases": one column per input
(named by its database folder) and the spread across them."""

from __future__ import annotations

import argparse
import os


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "merge", help="merge databases: one column per input and their spread",
        description="Match the calling contexts of several databases by what they are and "
        "write a database whose metrics are 'M [NAME]' for each metric M and input folder "
        "NAME, with the derived metric 'M [spread] (I|E)' (max - min over the inputs).")
    p.add_argument("databases", nargs="+", metavar="DB", help="database directories (2 or more)")
    p.add_argument("-o", "--output", required=True, metavar="DB",
                   help="directory of the merged database to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from callpath.engine.comparison import write_comparison
    from callpath.errors import CallpathError

    if len(args.databases) < 2:
        raise CallpathError("merge needs at least two databases")
    out = write_comparison(args.databases, args.output, diff=False)
    print(f"wrote {out}: 'callpath report {os.fspath(out)}' or 'callpath view "
          f"{os.fspath(out)}'")
    return 0
