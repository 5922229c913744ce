"""``callpath diff BASE NEW -o DB``: a database comparing two runs (base, new, delta, ratio).

The comparison itself lives in :mod:`callpath.analysis.compare`; this module opens the inputs,
writes the union as a v4 database and saves its derived metrics beside it. ``callpath merge``
shares :func:`write_comparison`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path


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


def write_comparison(paths: Sequence[str], out: str, *, diff: bool) -> Path:
    """Open the databases at ``paths``, compare them and write the result at ``out`` with its
    derived metrics saved beside it (as ``callpath report --save-derived`` does)."""
    from callpath.analysis.compare import compare, database_tags
    from callpath.analysis.derived import save_derived
    from callpath.errors import CallpathError
    from callpath.formats.detect import open_experiment
    from callpath.formats.v4.writer import write_v4

    target = Path(out).resolve()
    for p in paths:
        if Path(p).resolve() == target:
            raise CallpathError(f"{out}: the output would overwrite the input database {p}")
    inputs = [open_experiment(p) for p in paths]
    tags = ["base", "new"] if diff else database_tags(paths)
    exp, derived = compare(inputs, tags, diff=diff)
    write_v4(exp, out)
    save_derived(out, derived)
    return Path(out)


def run(args: argparse.Namespace) -> int:
    out = write_comparison([args.base, args.new], args.output, diff=True)
    print(f"wrote {out}: 'callpath report {os.fspath(out)}' or 'callpath view "
          f"{os.fspath(out)}'")
    return 0
