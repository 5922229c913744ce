"""``callpath filters``: manage the global, persistent filter set that every view applies
(hpcviewer's Filter window: add, edit, delete, enable)."""

from __future__ import annotations

import argparse
import sys

from callpath.errors import CallpathError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("filters", help="manage the saved filters that elide tree nodes",
                       description="The filter set is global (all databases) and saved in "
                       "$XDG_CONFIG_HOME/callpath/filters.json. Types: self (elide the node, "
                       "keep its children), descendants (elide its subtree), "
                       "self-and-descendants (elide both).")
    acts = p.add_subparsers(dest="action", metavar="ACTION")
    acts.add_parser("list", help="show the filters, numbered")
    a = acts.add_parser("add", help="add a filter")
    a.add_argument("pattern", help="glob pattern matched against whole scope names")
    a.add_argument("--type", default="self",
                   help="self, descendants or self-and-descendants (default: self)")
    a.add_argument("--disabled", action="store_true", help="add it disabled")
    e = acts.add_parser("edit", help="change a filter's pattern or type")
    e.add_argument("number", type=int)
    e.add_argument("--pattern")
    e.add_argument("--type")
    for name, text in (("remove", "delete a filter"), ("enable", "enable a filter"),
                       ("disable", "disable a filter")):
        x = acts.add_parser(name, help=text)
        x.add_argument("number", type=int, help="its number in 'callpath filters list'")
    acts.add_parser("clear", help="delete every filter")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from callpath.analysis.tree_filters import (
        Filter,
        FilterType,
        filters_path,
        load_filters,
        save_filters,
    )

    fs = load_filters()
    action = args.action or "list"
    if action == "list":
        if not fs:
            sys.stdout.write(f"no filters ({filters_path()})\n")
        for i, f in enumerate(fs, 1):
            state = "on " if f.enabled else "off"
            sys.stdout.write(f"{i:>3}  {state}  {f.type.value:<21}  {f.pattern}\n")
        return 0
    if action == "add":
        fs.append(Filter(args.pattern, FilterType.parse(args.type), not args.disabled))
    elif action == "clear":
        fs = []
    else:
        k = args.number
        if not 1 <= k <= len(fs):
            raise CallpathError(f"no filter {k}: expected 1..{len(fs)} (see 'callpath filters "
                                "list')" if fs else f"no filter {k}: the filter set is empty")
        f = fs[k - 1]
        if action == "remove":
            del fs[k - 1]
        elif action == "enable":
            fs[k - 1] = replace(f, enabled=True)
        elif action == "disable":
            fs[k - 1] = replace(f, enabled=False)
        else:  # edit
            fs[k - 1] = Filter(args.pattern or f.pattern,
                               FilterType.parse(args.type) if args.type else f.type, f.enabled)
    path = save_filters(fs)
    sys.stdout.write(f"{len(fs)} filter(s) saved in {path}\n")
    return 0
