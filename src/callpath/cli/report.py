"""``callpath report DB``: the top-down tree in the terminal, or as JSON."""

from __future__ import annotations

import argparse
import sys

import callpath
from callpath.errors import CallpathError
from callpath.present.report import render_contexts, render_json, render_text, visible_nodes


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("report", help="print the top-down calling context tree of a database",
                       description="Print the top-down tree of a database (HPCToolkit v4 or "
                       "experiment.xml) with inclusive and exclusive values.")
    p.add_argument("database", help="database directory")
    p.add_argument("--metric", "-m", default=None,
                   help="metric name (or unique prefix, or index); default: the first")
    p.add_argument("--depth", "-d", type=_non_negative_int, default=None,
                   help="show nodes at most this deep (the root is depth 0)")
    p.add_argument("--threshold", "-t", type=_percent, default=0.0,
                   help="hide nodes whose inclusive value is below PCT percent of the root")
    p.add_argument("--format", "-f", choices=("text", "json"), default="text")
    p.add_argument("--contexts", action="store_true",
                   help="list the execution contexts (threads, ranks) instead of the tree")
    p.set_defaults(func=run)


def _non_negative_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {s!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {s!r}")
    return v


def _percent(s: str) -> float:
    try:
        v = float(s.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage 0..100, got {s!r}") from None
    if not 0 <= v <= 100:
        raise argparse.ArgumentTypeError(f"expected a percentage 0..100, got {s!r}")
    return v


def run(args: argparse.Namespace) -> int:
    exp = callpath.open(args.database)
    out = sys.stdout
    if args.contexts:
        render_contexts(exp, out)
        return 0
    if not exp.metrics:
        raise CallpathError(f"{args.database}: the database has no metrics to report")
    key: str | int = 0 if args.metric is None else args.metric
    if isinstance(key, str) and key.isdigit() and not any(m.name == key for m in exp.metrics):
        key = int(key)
    metric = exp.metric(key)
    inclusive = exp.inclusive(metric)
    nodes = visible_nodes(exp, inclusive, args.depth, args.threshold)
    if args.format == "json":
        render_json(exp, nodes, out)
    else:
        render_text(exp, metric, nodes, out, inclusive, exp.exclusive(metric))
    return 0
