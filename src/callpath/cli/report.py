"""``callpath report DB``: any view of a database in the terminal, as JSON or as CSV.

A thin shell over :mod:`callpath.analysis`: it builds the tree source (thread selection,
filters), the columns (metrics, derived metrics, view configurations), the view, and asks
the analysis layer which rows to show; :mod:`callpath.present.viewreport` formats them.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

import callpath
from callpath.cli.argtypes import int_range
from callpath.errors import CallpathError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report", help="print a view of a database (top-down, bottom-up, flat)",
        description="Print a view of a database (HPCToolkit v4 or experiment.xml): the "
        "Top-down calling context tree, the Bottom-up callers view, or the Flat static "
        "structure, with inclusive and exclusive values, derived metrics, filters, the hot "
        "call path, a thread selection and CodeAnalyst view configurations.")
    p.add_argument("database", help="database directory")
    g = p.add_argument_group("view")
    g.add_argument("--view", "-v", choices=("top-down", "bottom-up", "flat"),
                   default="top-down", help="which view (default: top-down)")
    g.add_argument("--depth", "-d", type=_non_negative_int, default=None,
                   help="expand at most this many levels below the start node")
    g.add_argument("--threshold", "-t", type=_percent, default=0.0,
                   help="hide nodes whose value (sort column) is below PCT percent of the "
                   "start node's")
    g.add_argument("--zoom", "-z", type=int, default=None, metavar="NODE",
                   help="start at this node (its 'id' in --format json output)")
    g.add_argument("--flatten", type=_non_negative_int, default=0, metavar="N",
                   help="Flat view: replace top-level scopes by their children N times")
    g.add_argument("--hot-path", nargs="?", const=-1, type=int, default=None, metavar="NODE",
                   help="show the hot call path from NODE (default: the start node)")
    g.add_argument("--hot-threshold", type=_percent, default=50.0, metavar="PCT",
                   help="a child continues the hot path if it has PCT percent of its "
                   "parent's value (default 50)")
    g.add_argument("--find", metavar="TEXT", help="list the nodes whose name matches TEXT")
    g.add_argument("--find-case", action="store_true", help="--find is case sensitive")
    g.add_argument("--find-word", action="store_true", help="--find matches whole words")
    g.add_argument("--find-regex", action="store_true", help="--find TEXT is a regex")
    g = p.add_argument_group("columns")
    g.add_argument("--metric", "-m", action="append", default=None,
                   help="show this metric's inclusive and exclusive columns (name, prefix, "
                   "index or derived-metric name; repeatable; default: the metric that holds "
                   "the time, GPUOP, CPUTIME ..., as the viewer opens)")
    g.add_argument("--empty-columns", action="store_true",
                   help="keep the default columns that are zero at every node (hidden, as "
                   "in the viewer)")
    g.add_argument("--columns", "-c", default=None, metavar="LIST",
                   help="comma-separated columns by $n or title (see --list-metrics)")
    g.add_argument("--list-metrics", action="store_true",
                   help="list the columns with their $n numbers and exit")
    g.add_argument("--sort", "-s", default=None, metavar="COLUMN",
                   help="sort children by this column (default: the first shown)")
    g.add_argument("--ascending", action="store_true", help="sort in increasing order")
    g.add_argument("--unsorted", action="store_true",
                   help="keep children in tree order (preorder) instead of sorting them")
    g.add_argument("--derived", action="append", default=[], metavar="NAME=FORMULA",
                   help="add a derived metric, e.g. 'IPC=$2/$0' ($n: column at the node, "
                   "@n: at the root); repeatable")
    g.add_argument("--derived-format", action="append", default=[], metavar="NAME=FORMAT",
                   help="display format of a derived metric: 'scientific', 'percent' or a "
                   "printf format such as '%%6.2f'")
    g.add_argument("--derived-percent", action="append", default=[], metavar="NAME",
                   help="annotate a derived metric with its percent of the formula applied "
                   "to the aggregates")
    g.add_argument("--save-derived", action="store_true",
                   help="save the --derived metrics with the database (they reappear when "
                   "it is reopened)")
    g.add_argument("--remove-derived", action="append", default=[], metavar="NAME",
                   help="remove a saved derived metric from the database")
    g.add_argument("--no-saved-derived", action="store_true",
                   help="ignore the derived metrics saved with the database")
    g.add_argument("--view-config", action="append", default=[], metavar="FILE|NAME",
                   help="add the columns of a CodeAnalyst view configuration (a file, or "
                   "the name of a predefined view; see --list-view-configs)")
    g.add_argument("--list-view-configs", action="store_true",
                   help="list the predefined view configurations and whether this database "
                   "has the events each needs")
    g = p.add_argument_group("selection")
    g.add_argument("--filter", action="append", default=[], metavar="GLOB[:TYPE]",
                   help="elide nodes whose name matches GLOB; TYPE is self (default), "
                   "descendants or self-and-descendants; repeatable")
    g.add_argument("--no-saved-filters", action="store_true",
                   help="ignore the saved filter set ('callpath filters')")
    g.add_argument("--keep-lineless", action="store_true",
                   help="keep the rows of line 0 ('[lib.so]:0', 'loop at [lib.so]:0': code "
                   "without line information), which are elided by default so that a "
                   "library's call path is as deep as its frames")
    g.add_argument("--threads", metavar="TEXT",
                   help="Thread view: sum only over the execution contexts whose label "
                   "contains TEXT (e.g. 'THREAD 0')")
    g.add_argument("--threads-regex", action="store_true",
                   help="--threads TEXT is a regular expression")
    g = p.add_argument_group("per-context values")
    g.add_argument("--stats", type=int, default=None, metavar="NODE",
                   help="print the node's value in each execution context with sum, mean, "
                   "min, max, standard deviation and coefficient of variation")
    g.add_argument("--plot", type=int, default=None, metavar="NODE",
                   help="plot the node's value across execution contexts (needs -o)")
    g.add_argument("--kind", choices=("plot", "sorted", "histogram"), default="plot",
                   help="kind of --plot graph")
    g.add_argument("--output", "-o", default=None, metavar="FILE.png",
                   help="where --plot writes its PNG (and --flame its SVG)")
    g.add_argument("--flame", action="store_true",
                   help="write a standalone SVG flame graph (Top-down; an icicle of exclusive "
                   "values in Bottom-up) of the first column from the start node to -o "
                   "FILE.svg; coloured by the delta on a 'callpath diff' database")
    p.add_argument("--format", "-f", choices=("text", "json", "csv"), default="text")
    p.add_argument("--contexts", action="store_true",
                   help="list the execution contexts (threads, ranks) instead of a view")
    p.add_argument("--notes", action="store_true",
                   help="list the notes saved with the database (made in the viewer)")
    p.set_defaults(func=run)


_non_negative_int = int_range("a non-negative integer", 0)


def _percent(s: str) -> float:
    try:
        v = float(s.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage 0..100, got {s!r}") from None
    if not 0 <= v <= 100:
        raise argparse.ArgumentTypeError(f"expected a percentage 0..100, got {s!r}")
    return v


def run(args: argparse.Namespace) -> int:
    from callpath.cli.report_build import build_report, print_view_configs

    if args.notes:
        from callpath.engine.notes import load_notes, render_notes
        if not os.path.isdir(args.database):
            raise CallpathError(f"{args.database}: not a database directory")
        render_notes(load_notes(args.database), sys.stdout, args.format)
        return 0
    if args.output:
        from callpath.formats.detect import refuse_overwriting
        refuse_overwriting(args.output, args.database)
    exp = callpath.open(args.database)
    out: TextIO = sys.stdout
    if args.contexts:
        from callpath.present.context_list import render_contexts
        render_contexts(exp, out)
        return 0
    if not exp.metrics:
        raise CallpathError(f"{args.database}: the database has no metrics to report")
    if args.list_view_configs:
        print_view_configs(exp, out)
        return 0
    return build_report(exp, args, out)
