"""``callpath view DB [DB...]``: hpcviewer in the browser, served from this machine.

Heavy imports (starlette, uvicorn, numpy) happen inside :func:`run`, so ``callpath --help``
stays fast.
"""

from __future__ import annotations

import argparse

from callpath.cli.argtypes import int_range

_port = int_range("a port number 1..65535", 1, 65535)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "view", help="open databases in the browser viewer (like hpcviewer)",
        description="Serve an interactive viewer of one or more databases (Top-down, "
        "Bottom-up and Flat views, source, per-context plots, traces) on this machine, "
        "print its address and open a browser. On a cluster: run it on the login node with "
        "--no-browser and reach it through 'ssh -L 8765:localhost:8765 login-node'.")
    p.add_argument("databases", nargs="+", metavar="DB", help="database directories")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other address "
                   "requires the access token printed with the URL)")
    p.add_argument("--port", type=_port, default=None,
                   help="port to listen on (default: 8765, or the next free one up to 8784)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser")
    p.add_argument("--share", action="store_true",
                   help="open a live shared session and print its link and a read-only "
                   "guest link (see docs/view.md, 'Shared sessions')")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from callpath.view.server import serve

    return serve(args.databases, args.host, args.port, not args.no_browser,
                 share=args.share)
