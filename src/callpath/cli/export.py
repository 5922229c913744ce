"""``callpath export DB --to FORMAT -o FILE``: the database in another tool's format.

A thin shell over the renderers in :mod:`callpath.formats` (``export_*``): speedscope JSON,
pprof ``profile.proto`` (gzipped), Chrome trace-event JSON (from the traces), folded stacks.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, TextIO, cast

FORMATS = ("speedscope", "pprof", "chrome", "folded")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "export", help="write a database as speedscope, pprof, Chrome trace or folded stacks",
        description="Write a database in another tool's format: speedscope JSON (one "
        "profile per execution context and the summary), pprof profile.proto gzipped (one "
        "sample type per metric), Chrome trace-event JSON from the traces (one track per "
        "execution context; chrome://tracing and ui.perfetto.dev), folded stacks for "
        "flamegraph.pl and inferno (integer counts).")
    p.add_argument("database", help="database directory")
    p.add_argument("--to", "-t", required=True, choices=FORMATS, help="output format")
    p.add_argument("--metric", "-m", default=None,
                   help="metric (name, prefix or index; default: a sample count where the "
                   "database has one, else the first; pprof: every metric unless given)")
    p.add_argument("--contexts", default=None, metavar="SEL",
                   help="only these execution contexts (a label such as 'THREAD 0' or "
                   "'1.0', as in report --threads); speedscope: their profiles, pprof: "
                   "samples labelled by context, folded: their sum")
    p.add_argument("--contexts-regex", action="store_true", help="--contexts is a regex")
    p.add_argument("--output", "-o", required=True, help="output file ('-' for stdout, "
                   "text formats only)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import callpath
    from callpath.errors import CallpathError
    from callpath.formats import stacks

    if not args.output:
        raise CallpathError("-o '': expected a file name ('-' for standard output)")
    if args.output != "-":
        from callpath.formats.detect import refuse_overwriting
        refuse_overwriting(args.output, args.database)
    exp = callpath.open(args.database)
    contexts: list[int] | None = None
    if args.contexts is not None:
        from callpath.analysis.source import select_contexts

        contexts = select_contexts(exp, args.contexts, regex=args.contexts_regex)
        if not contexts:
            names = ", ".join(exp.context_label(p) for p in exp.contexts[:5])
            raise CallpathError(f"--contexts {args.contexts!r} matches no execution context "
                                f"of {args.database} (expected part of a label such as "
                                f"{names or 'THREAD 0'})")
    if args.to == "pprof" and args.output == "-":
        raise CallpathError("pprof output is binary: give a file with -o")
    metric = exp.metric(args.metric) if args.metric is not None \
        else stacks.default_metric(exp)
    ft = stacks.frame_tree(exp)
    title = exp.title or Path(args.database).name
    if args.to == "pprof":
        from callpath.formats.export_pprof import PprofSource, pprof_bytes

        metrics = [metric] if args.metric is not None else list(exp.metrics)
        srcs = [PprofSource(label if p is not None else None,
                            [stacks.point_values(exp, m, p) for m in metrics])
                for label, p in ([("summary", None)] if contexts is None
                                 else stacks.weight_sources(exp, contexts, summary=False))]
        t0 = int(exp.traces.min_timestamp) if exp.traces is not None else 0
        data = pprof_bytes(ft, metrics, srcs, comment=f"callpath export of {title}",
                           time_nanos=t0)
        with _replacing(args.output, "wb") as f:
            f.write(data)
        return 0
    with contextlib.ExitStack() as stack:
        out = sys.stdout if args.output == "-" else \
            cast(TextIO, stack.enter_context(_replacing(args.output, "w")))
        if args.to == "folded":
            from callpath.formats.export_folded import write_folded

            sc = write_folded(ft, stacks.selected_points(exp, metric, contexts), metric, out)
            if sc.unit != "count":
                sys.stderr.write(f"callpath: {metric.name} is not a count: folded values are "
                                 f"{sc.unit} (x{sc.factor:g})\n")
        elif args.to == "speedscope":
            from callpath.formats.export_speedscope import write_speedscope

            profiles = [(label, stacks.point_values(exp, metric, p))
                        for label, p in stacks.weight_sources(exp, contexts)]
            write_speedscope(ft, metric, profiles, out, title)
        else:
            from callpath.formats.export_chrome import write_chrome

            write_chrome(ft, out, title=title)
    return 0


@contextlib.contextmanager
def _replacing(path: str, mode: str) -> Iterator[IO[Any]]:
    """A file written under a temporary name beside ``path`` and renamed onto it once
    complete, so that an error half-way never leaves a truncated export behind."""
    from callpath.errors import CallpathError

    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        f: IO[Any] = (open(tmp, "wb") if "b" in mode  # noqa: SIM115 (closed below)
                      else open(tmp, "w", encoding="utf-8"))  # noqa: SIM115
    except OSError as e:
        raise CallpathError(f"{target}: cannot write the export: {e.strerror or e}") from None
    try:
        with f:
            yield f
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
