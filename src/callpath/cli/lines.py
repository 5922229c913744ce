"""``callpath lines DB``: PerfVisS's source-line × context views in the terminal.

A thin shell over :mod:`callpath.analysis.lines` (the same functions the viewer's Lines tab
calls) and :mod:`callpath.present.lines_text` (tables) / :mod:`callpath.present.lines_png`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, TextIO

from callpath.cli.argtypes import int_range

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from callpath.analysis.lines import LineMatrix
    from callpath.model import Experiment


DRAWN_CONTEXTS = 16  # text and PNG overviews compress more contexts than this into bins


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "lines", help="cost per source line and execution context (PerfVisS)",
        description="The cost of every source line in every execution context (PerfVisS): "
        "a detail table (a column per context, the source line, min and max with the "
        "contexts that have them), the ranked procedures, the compressed overview of the "
        "whole program, the machine instructions of lines, as text, JSON or CSV, or drawn "
        "as PNG.")
    p.add_argument("database", help="database directory")
    p.add_argument("--metric", "-m", default=None,
                   help="metric by name, prefix or index (default: the metric that holds the "
                   "time, GPUOP, CPUTIME ..., as the viewer's Lines tab opens)")
    p.add_argument("--file", default=None, metavar="PATH",
                   help="only this source file (recorded path, unique suffix or base name)")
    p.add_argument("--from", dest="line_from", type=int_range("a line number", 0), default=None,
                   metavar="LINE", help="first line (with --file; every line of the range is "
                   "printed, zero lines included)")
    p.add_argument("--to", dest="line_to", type=int_range("a line number", 0), default=None,
                   metavar="LINE", help="last line (default: --from + 39)")
    p.add_argument("--group", choices=("none", "rank", "node"), default="none",
                   help="columns: each context, the threads of each rank summed, or the "
                   "ranks of each node summed")
    p.add_argument("--contexts", default=None, metavar="TEXT",
                   help="only the execution contexts whose label contains TEXT (the Thread "
                   "view's selection, as 'report --threads')")
    p.add_argument("--contexts-regex", action="store_true",
                   help="--contexts TEXT is a regular expression")
    p.add_argument("--format", "-f", choices=("text", "json", "csv"), default="text")
    p.add_argument("--ranked", type=int_range("a non-negative number", 0), default=None,
                   metavar="N", help="print the N procedures with the highest cost "
                   "(rank, procedure, file, sum, percent)")
    g = p.add_argument_group("overview")
    g.add_argument("--overview", action="store_true",
                   help="print (or with --png draw) the compressed overview of all lines")
    g.add_argument("--skip", type=int_range("a non-negative number of lines", 0), default=50,
                   metavar="N", help="skip runs of more than N lines without cost (50)")
    g.add_argument("--bin", type=int_range("a positive number of lines", 1), default=4,
                   metavar="B", help="reduce bins of B consecutive lines to one (4)")
    g.add_argument("--reduce", choices=("max", "sum"), default="max",
                   help="how a bin is reduced (max keeps peaks visible; default)")
    g.add_argument("--strip-lines", type=int_range("a positive number of lines", 1), default=80,
                   metavar="L", help="cut the overview into strips of L rows (80)")
    g.add_argument("--context-bins", type=int_range("a positive number of bins", 1), default=None,
                   metavar="K", help="compress the contexts into K bins by their maximum "
                   "(text and PNG: 16 bins when there are more than 16 contexts)")
    g.add_argument("--top-contexts", type=int_range("a positive number", 1), default=None,
                   metavar="N", help="keep the N contexts with the highest values per row")
    g = p.add_argument_group("drawing and instructions")
    g.add_argument("--png", default=None, metavar="FILE",
                   help="draw the detail window (or the overview with --overview) as PNG")
    g.add_argument("--normalize", choices=("window", "program"), default="window",
                   help="PNG colours relative to the hottest cell of the window or of the "
                   "program")
    g.add_argument("--instructions", action="store_true",
                   help="print the machine instructions of the --from/--to lines of --file "
                   "(disassembled from the load module) with their cost where the database "
                   "has instruction-level data")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    import callpath
    from callpath.analysis import lines as L
    from callpath.analysis.time_metric import time_metric
    from callpath.errors import CallpathError
    from callpath.present import lines_text as P

    if args.png:
        from callpath.formats.detect import refuse_overwriting
        refuse_overwriting(args.png, args.database, "--png")
    exp = callpath.open(args.database)
    if not exp.metrics:
        raise CallpathError(f"{args.database}: the database has no metrics")
    # name, prefix or index; by default the metric the viewer's Lines tab opens on
    metric: str | int = time_metric([m.name for m in exp.metrics]) if args.metric is None \
        else args.metric
    m = L.build_line_matrix(exp, metric, args.group, args.contexts,
                            contexts_regex=args.contexts_regex)
    out: TextIO = sys.stdout
    if m.n_rows == 0:
        raise CallpathError(f"{args.database}: the database has no source-line scopes (it was "
                            "attributed without structure, or has no line information)")
    if args.ranked is not None:
        P.write_ranked(L.ranked_procedures(m, args.ranked), args.format, out)
        return 0
    if args.overview:
        bins = args.context_bins
        if bins is None and args.top_contexts is None and m.n_cols > DRAWN_CONTEXTS and (
                args.png or args.format == "text"):
            bins = DRAWN_CONTEXTS  # a drawing of 1,024 columns per strip is unreadable
            sys.stderr.write(f"callpath lines: {m.n_cols} contexts drawn as {bins} bins by "
                             "their maximum (--context-bins / --top-contexts to choose)\n")
        ov = L.overview(m, args.skip, args.bin, args.reduce, args.strip_lines, bins,
                        args.top_contexts)
        if args.png:
            from callpath.present.lines_png import save_overview_png

            outlines = []
            if args.line_from is not None:
                a, _ = _range(m, args)
                outlines.append((int(a[0]), int(a[-1]), "gold"))
            top = L.ranked_procedures(m, 1)
            if top:
                outlines.append((top[0]["first_row"], top[0]["last_row"], "yellow"))
            p = save_overview_png(m, ov, args.png, outlines=outlines)
            out.write(f"{p}\n")
            return 0
        if args.format == "json":
            import json

            json.dump(P.overview_records(m, ov), out, indent=1)
            out.write("\n")
        elif args.format == "csv":
            import csv

            doc = P.overview_records(m, ov)
            w = csv.writer(out, lineterminator="\n")
            w.writerow(["strip", "row", "first_row", "last_row", "file", "line",
                        *doc["columns"]])
            for r in doc["rows"]:
                w.writerow([r["strip"], r["row"], r["first_row"], r["last_row"], r["file"],
                            r["line"], *(P.csv_value(v) for v in r["values"])])
        else:
            P.write_overview_text(m, ov, out)
        return 0
    rows, ranged = _range(m, args)
    if args.instructions:
        if not ranged:
            raise CallpathError("--instructions needs --file and --from (the lines to show)")
        _instructions(exp, m, rows, args.format, out)
        return 0
    if args.png:
        from callpath.present.lines_png import save_detail_png

        if not ranged:
            rows = rows[:60]
        p = save_detail_png(m, rows, args.png, normalize=args.normalize)
        out.write(f"{p}\n")
        return 0
    rows = np.asarray(rows, dtype=np.int64)
    if args.format == "json":
        P.write_json_lines(m, rows, out)
    elif args.format == "csv":
        P.write_csv_lines(m, rows, out)
    else:
        P.write_text_lines(m, rows, out)
    return 0


def _range(m: LineMatrix, args: argparse.Namespace
           ) -> tuple[npt.NDArray[np.int64], bool]:
    """Rows to show, and whether a range was asked for: --from/--to of --file (every line,
    zero lines included), or every line with cost (of --file, or of the program)."""
    import numpy as np

    from callpath.analysis import lines as L
    from callpath.errors import CallpathError

    fi: int | None = None
    if args.file is not None:
        fi = L.file_index(m, args.file)
    elif args.line_from is not None or args.line_to is not None:
        if len(m.files) != 1:
            raise CallpathError(f"--from/--to need --file: the database has lines in "
                                f"{len(m.files)} files")
        fi = 0
    if args.line_from is None and args.line_to is None:
        rows = m.nz_rows
        if fi is not None:
            rows = rows[m.file_of_row[rows] == fi]
        return np.asarray(rows, dtype=np.int64), False
    assert fi is not None
    lo, hi = int(m.file_start[fi]), int(m.file_start[fi + 1])
    lines = m.line_of_row[lo:hi]
    first = args.line_from if args.line_from is not None else int(lines[0])
    last = args.line_to if args.line_to is not None else first + 39
    if last < first:
        raise CallpathError(f"--to {last} is before --from {first}")
    a = lo + int(np.searchsorted(lines, first))
    b = lo + int(np.searchsorted(lines, last, side="right"))
    if b <= a:
        raise CallpathError(f"lines {first}..{last} of {m.file_labels[fi]} are not on the line "
                            f"axis (it has lines {int(lines[0])}..{int(lines[-1])})")
    return np.arange(a, b, dtype=np.int64), True


def _instructions(exp: Experiment, m: LineMatrix, rows: npt.NDArray[np.int64], fmt: str,
                  out: TextIO) -> None:
    import json

    from callpath.analysis import lines as L

    f = int(m.file_of_row[rows[0]])
    first, last = int(m.line_of_row[rows[0]]), int(m.line_of_row[rows[-1]])
    centre = (first + last) // 2
    listing = L.line_instructions(exp, m.files[f], centre, around=(last - first + 1) // 2)
    if fmt == "json":
        json.dump({"file": m.file_labels[f], "first_line": first, "last_line": last,
                   "reason": listing.reason, "instructions": list(listing)}, out, indent=1)
        out.write("\n")
        return
    if listing.reason:
        out.write(f"no instructions: {listing.reason}\n")
        return
    for ins in listing:
        cost = "" if ins.get("cost") is None else f"{ins['cost']:>10g}"
        out.write(f"{ins['line']:>6}  {ins['address']:>#12x}  {cost:>10}  {ins['text']}\n")
