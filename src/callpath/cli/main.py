"""The ``callpath`` command: parses arguments and turns user errors into one line, exit 2."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from callpath import __version__
from callpath.errors import CallpathError

# One module per subcommand, each with ``add_parser(sub)`` that registers its parser and sets
# ``func``. Modules must import their heavy dependencies inside functions, so that building the
# parser (every invocation) stays cheap. A subcommand whose module does not exist yet is listed
# with its one-line purpose, so that --help shows the whole tool.
COMMANDS = {
    "run": "measure a program by sampling (like hpcrun)",
    "struct": "recover program structure from binaries (like hpcstruct)",
    "prof": "attribute measurements to structure and write a database (like hpcprof)",
    "profile": "run + struct + prof in one command",
    "report": "print a view of a database in the terminal",
    "filters": "manage the saved filters that elide tree nodes",
    "view": "open a database in the browser viewer (like hpcviewer)",
    "diff": "compare two databases: base, new, delta, ratio",
    "merge": "merge databases: one column per input and the spread",
    "lines": "cost per source line and execution context (PerfVisS)",
    "export": "write a database as speedscope, pprof, Chrome trace or folded stacks",
    "import": "read folded stacks, speedscope, pprof or perf script output into a database",
    "dump": "print the current call path of every thread of a running process",
}
# Subcommands whose module name differs from the command (``import`` is a Python keyword).
MODULES = {"import": "import_"}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """Usage errors: one line and exit status 2, like every other user error."""
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``command``, that subcommand's alone, its module the only one
    imported (every command line pays for the modules imported here: ``callpath run`` starts
    the program after them)."""
    parser = _Parser(prog="callpath", description="Call path performance analysis: measure, "
                     "recover structure, attribute, and view.")
    parser.add_argument("--version", action="version", version=f"callpath {__version__}")
    sub: argparse._SubParsersAction[argparse.ArgumentParser] = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, text in COMMANDS.items():
        if command is not None and name != command:
            continue
        try:
            module = importlib.import_module(f"callpath.cli.{MODULES.get(name, name)}")
        except ModuleNotFoundError as e:
            if e.name != f"callpath.cli.{MODULES.get(name, name)}":
                raise
            p = sub.add_parser(name, help=f"{text} (not yet available)", add_help=False)
            p.add_argument("rest", nargs=argparse.REMAINDER)
            p.set_defaults(func=_planned(name))
        else:
            module.add_parser(sub)
    return parser


def _planned(name: str):  # type: ignore[no-untyped-def]
    def run(args: argparse.Namespace) -> int:
        raise CallpathError(f"'callpath {name}' is not yet available in this version")
    return run


def _reopen_closed_std_streams() -> None:
    """Put /dev/null on standard input, output or error when the caller closed it
    ('callpath report DB >&-'). Python then has ``sys.stdout = None`` and the first print
    raised AttributeError (a traceback); worse, the next file callpath opened would get
    descriptor 1, and whatever a measured program or a stray print wrote to its standard
    output would land in that file. With no reader the output is dropped, as when the
    reader of a pipe goes away (BrokenPipeError below)."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            if getattr(sys, name) is None:
                setattr(sys, name, open(fd, "r" if fd == 0 else "w",  # noqa: SIM115
                                        closefd=False, encoding="utf-8"))


def main(argv: Sequence[str] | None = None) -> int:
    _reopen_closed_std_streams()
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words[0] if words and words[0] in COMMANDS else None)
    args = parser.parse_args(words)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except CallpathError as e:
        sys.stderr.write(f"callpath: error: {e}\n")
        return 2
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`): not an error of ours.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as e:
        # A file the user named cannot be read or written (a missing folder, no permission,
        # a full disk): one line naming it, like every other user error.
        where = f"{e.filename}: " if e.filename else ""
        sys.stderr.write(f"callpath: error: {where}{e.strerror or e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("callpath: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
