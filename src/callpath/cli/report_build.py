"""The work behind ``callpath report``: assemble source, columns and view from the options
through the engine's composition (:mod:`callpath.engine.compose`, as the viewer does), then
print rows, a hot path, Find results, per-context statistics or a plot."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

import numpy as np

from callpath.analysis.columns import ColumnDef, ColumnSet
from callpath.analysis.derived import DerivedMetric, load_derived, save_derived
from callpath.analysis.flat import FlatView
from callpath.analysis.navigate import FindOptions, expand, find, flattened_top, hot_path
from callpath.analysis.source import select_contexts
from callpath.analysis.time_metric import time_metric
from callpath.analysis.topdown import View
from callpath.analysis.tree_filters import Filter, elide_lineless, load_filters
from callpath.analysis.viewconfig import (
    ColumnSpec,
    expand_columns,
    load_predefined,
    load_view_configs,
    offered,
)
from callpath.engine.compose import columns_of, open_for_find, source_of, view_of
from callpath.errors import CallpathError
from callpath.model import Experiment
from callpath.present import viewreport


def print_view_configs(exp: Experiment, out: TextIO) -> None:
    names = [m.name for m in exp.metrics]
    for v in load_predefined():
        ok, why = offered(v, names)
        out.write(f"{v.name}: {'offered' if ok else 'not offered'}"
                  f"{'' if ok else ' -- ' + why}\n")


def _config_specs(exp: Experiment, items: list[str]) -> list[ColumnSpec]:
    specs: list[ColumnSpec] = []
    names = [m.name for m in exp.metrics]
    predefined = None
    for item in items:
        if Path(item).exists() or item.endswith(".xml"):
            views = load_view_configs(item)
        else:
            predefined = predefined if predefined is not None else load_predefined()
            views = [v for v in predefined if _slug(v.name) == _slug(item)]
            if not views:
                known = ", ".join(repr(v.name) for v in predefined)
                raise CallpathError(f"view configuration {item!r}: no such file and no "
                                    f"predefined view of that name (predefined: {known})")
        for v in views:
            specs.extend(expand_columns(v, exp.contexts, names, exp.id_names))
    return specs


def _slug(name: str) -> str:
    """'CPU time' and 'cpu-time' name the same predefined view."""
    return "-".join("".join(c if c.isalnum() else " " for c in name.lower()).split())


def _derived(args: argparse.Namespace) -> list[DerivedMetric]:
    formats = {}
    for item in args.derived_format:
        name, sep, fmt = item.partition("=")
        if not sep:
            raise CallpathError(f"--derived-format {item!r}: expected NAME=FORMAT")
        formats[name.strip()] = fmt
    percent = {n.strip() for n in args.derived_percent}
    out = []
    for text in args.derived:
        name = text.partition("=")[0].strip()
        out.append(DerivedMetric.from_assignment(text, formats.get(name, "scientific"),
                                                 name in percent))
    unknown = (set(formats) | percent) - {d.name for d in out}
    if unknown:
        raise CallpathError(f"--derived-format/--derived-percent name {sorted(unknown)[0]!r}: "
                            "expected the name of a --derived metric")
    return out


def _comparison_columns(columns: ColumnSet) -> list[ColumnDef]:
    """The inclusive ``[base]``, ``[new]`` and ``[delta]`` columns of the first metric of a
    database written by ``callpath diff``, else []: the text report showed only the
    ``[base]`` columns of a comparison by default."""
    titles = [c.title for c in columns.columns]
    base = next((t for t in titles if t.endswith(" [base] (I)")), None)
    if base is None:
        return []
    stem = base.removesuffix(" [base] (I)")
    want = [f"{stem} [{side}] (I)" for side in ("base", "new", "delta")]
    found = [c for w in want for c in columns.columns if c.title == w]
    return found if len(found) == 3 else []


def _opening_columns(columns: ColumnSet, view: View, show_empty: bool) -> list[ColumnDef]:
    """The text report's columns when none is asked for: the inclusive and exclusive
    columns of the metric the viewer opens on (:mod:`callpath.analysis.time_metric`: GPUOP,
    CPUTIME ..., non-zero in this view), less a column that is zero at every node unless
    ``show_empty``. A GPU database opened on its first metric, zero everywhere."""
    measured = [c for c in columns.columns if c.metric is not None and c.derived is None]
    incl = [c for c in measured if c.scope == "inclusive"]
    if not incl:
        return list(columns.columns[:2])

    def nonzero(i: int) -> bool:
        return bool(np.any(columns.values(view, incl[i]) != 0))

    chosen = incl[time_metric([columns.source.metrics[c.metric].name for c in incl if
                               c.metric is not None], nonzero)]
    cols = [c for c in measured if c.metric == chosen.metric]
    if show_empty:
        return cols
    shown = [c for c in cols if np.any(columns.values(view, c) != 0)]
    return shown or cols[:1]


def _selected_columns(columns: ColumnSet, view: View, args: argparse.Namespace,
                      new: list[DerivedMetric]) -> list[ColumnDef]:
    if args.columns is not None:
        keys = [k.strip() for k in args.columns.split(",") if k.strip()]
        if not keys:  # '' or ',,': a report of no column would have nothing to sort or show
            raise CallpathError(f"--columns {args.columns!r}: expected a comma-separated list "
                                "of columns ($n or title; see --list-metrics)")
        return [columns.resolve(k) for k in keys]
    cols: list[ColumnDef] = []
    for key in args.metric or []:
        key = int(key) if key.isdigit() and not any(m.name == key for m in columns.source.metrics) \
            else key
        cols.extend(columns.for_metric(key))
    if not cols:
        # JSON and CSV carry every measured metric; the text report the one that holds the
        # time (as the viewer opens), or a comparison's base, new and delta (what a user who
        # just ran `diff` wants to see)
        every = args.format in ("json", "csv")
        cols = [c for c in columns.columns if c.metric is not None] if every \
            else _comparison_columns(columns) or _opening_columns(
                columns, view, getattr(args, "empty_columns", False))
    for c in columns.columns:
        if c.spec is not None and c.spec.visible and c not in cols:
            cols.append(c)
        if c.derived is not None and c.derived in new and c not in cols:
            cols.append(c)
    return cols


def build_report(exp: Experiment, args: argparse.Namespace, out: TextIO) -> int:
    profiles = None
    if args.threads is not None:
        profiles = select_contexts(exp, args.threads, regex=args.threads_regex)
        if not profiles:
            labels = ", ".join(exp.context_label(c) for c in exp.contexts[:8])
            raise CallpathError(f"--threads {args.threads!r} selects no execution context "
                                f"(they are: {labels}{', ...' if len(exp.contexts) > 8 else ''})")
    filters = [] if args.no_saved_filters else load_filters()
    filters += [Filter.parse(s) for s in args.filter]
    source = source_of(exp, profiles, filters)
    if not getattr(args, "keep_lineless", True):
        source = elide_lineless(source)

    db = Path(args.database)
    saved = [] if args.no_saved_derived else load_derived(db)
    if args.remove_derived:
        names = {n.strip() for n in args.remove_derived}
        missing = names - {d.name for d in saved}
        if missing:
            raise CallpathError(f"--remove-derived {sorted(missing)[0]!r}: no derived metric "
                                "of that name is saved with the database")
        saved = [d for d in saved if d.name not in names]
        save_derived(db, saved)
    new = _derived(args)
    clash = {d.name for d in new} & {d.name for d in saved}
    saved = [d for d in saved if d.name not in clash]  # a new definition replaces a saved one
    columns = columns_of(source, [*saved, *new], _config_specs(exp, args.view_config))
    if args.save_derived:
        path = save_derived(db, [*saved, *new])
        out.write(f"saved {len(saved) + len(new)} derived metric(s) in {path}\n")

    if args.list_metrics:
        for c in columns.columns:
            extra = f" = {c.derived.formula}" if c.derived is not None else ""
            out.write(f"{c.ref:>5}  {c.title}{extra}\n")
        return 0

    view = view_of(args.view, source)
    cols = _selected_columns(columns, view, args, new)
    sort_col = columns.resolve(args.sort) if args.sort else cols[0]
    start = view.find_stable(args.zoom) if args.zoom is not None else 0

    def values() -> viewreport.F64:
        return columns.values(view, sort_col)

    if args.stats is not None or args.plot is not None:
        return _per_context(columns, view, cols, args, out)
    if getattr(args, "flame", False):
        return _flame(columns, view, cols[0], start, args, out)

    if args.find:
        opts = FindOptions(args.find, args.find_case, args.find_word, args.find_regex)
        open_for_find(view, args.depth)
        hits = find(view, opts)
        rows = [(int(n), 0) for n in hits]
        if not rows:
            out.write(f"no node of the {view.name} view matches {args.find!r}\n")
            return 1
    elif args.hot_path is not None:
        top = start if args.hot_path < 0 else view.find_stable(args.hot_path)
        hot = hot_path(view, top, values, args.hot_threshold)
        rows = [(n, i) for i, n in enumerate(hot)]
    elif args.flatten and isinstance(view, FlatView):
        vals = values()
        top = flattened_top(view, start, args.flatten, vals,
                            descending=not args.ascending).tolist()
        rows = [(start, 0)]
        sub_depth = None if args.depth is None else max(args.depth - 1, 0)
        for t in top:
            rows.extend((n, d + 1) for n, d in expand(
                view, t, values, depth=sub_depth, threshold=args.threshold,
                descending=not args.ascending, total=float(vals[start])))
    else:
        rows = expand(view, start, values, depth=args.depth, threshold=args.threshold,
                      descending=not args.ascending, sort=not args.unsorted)
    if args.format == "json":
        viewreport.render_json(columns, view, cols, rows, out)
    elif args.format == "csv":
        viewreport.render_csv(columns, view, cols, rows, out)
    else:
        viewreport.render_text(columns, view, cols, rows, out)
    return 0


def _flame(columns: ColumnSet, view: View, col: ColumnDef, start: int,
           args: argparse.Namespace, out: TextIO) -> int:
    from callpath.present.flamesvg import flame_svg

    if not args.output:
        raise CallpathError("--flame needs -o FILE.svg for the image")
    if not args.metric and not args.columns:  # a comparison: the new run, coloured by delta
        side = col.title.replace(" [base] (I)", " [new] (I)")
        col = next((c for c in columns.columns if c.title == side), col)
    kind = "flame graph" if view.name == "top-down" else "icicle"
    title = f"{Path(args.database).name}: {view.name} {kind}"
    svg = flame_svg(columns, view, col, start, title=title)
    Path(args.output).write_text(svg, encoding="utf-8")
    out.write(f"wrote {args.output}\n")
    return 0


def _per_context(columns: ColumnSet, view: View, cols: list[ColumnDef],
                 args: argparse.Namespace, out: TextIO) -> int:
    from callpath.analysis.percontext import context_values

    node = view.find_stable(args.stats if args.stats is not None else args.plot)
    col = cols[0]
    data = context_values(columns, view, node, col)
    if args.plot is not None:
        if not args.output:
            raise CallpathError("--plot needs -o FILE.png for the image")
        from callpath.present.plots import save_plot
        path = save_plot(data, args.kind, args.output, title=f"{view.label(node)} — {col.title}",
                         metric=col.title)
        out.write(f"wrote {path}\n")
        return 0
    st = data.statistics()
    out.write(f"{col.title} at {view.label(node)} ({view.name} node {args.stats})\n")
    width = max(len(lab) for lab in data.labels)
    for lab, v in zip(data.labels, data.values.tolist(), strict=True):
        out.write(f"  {lab:<{width}}  {v:.6g}\n")
    for k, v in st.as_dict().items():
        out.write(f"{k:>8}: {v:.6g}\n")
    return 0
