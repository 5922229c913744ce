"""Binding the socket and running uvicorn: in the foreground for ``callpath view``, or in a
background thread for tests, benchmarks and notebooks (:class:`BackgroundServer`).

The socket is bound before uvicorn starts, so that a port in use is one clear line
(exit 2) rather than a log record, and so that port 0 can pick a free port for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from callpath.engine.database import Database, open_databases
from callpath.errors import CallpathError
from callpath.view.app import STATIC_DIR, make_app
from callpath.view.security import is_loopback, new_token

MAX_HEAD = 4 << 20  # request line and headers: a URL holding a big state still fits
MAX_WS_MESSAGE = 128 << 10  # a shared session's message (view/share.py refuses > 64 KiB)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: any free port)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise CallpathError(f"--host {host!r}: not an address of this machine ({e.strerror})"
                            ) from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise CallpathError(f"cannot listen on {host}:{port}: {e.strerror} (choose another "
                            "--port)") from None
    sock.set_inheritable(True)
    return sock


def url_of(host: str, port: int, token: str | None) -> str:
    shown = host
    if host in ("0.0.0.0", "::"):
        shown = socket.gethostname()
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def _uvicorn_server(dbs: list[Database], host: str, token: str | None,  # type: ignore[no-untyped-def]
                    static_dir: Path = STATIC_DIR):
    import uvicorn

    app = make_app(dbs, token=token, loopback=is_loopback(host), static_dir=static_dir)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=2,
                            h11_max_incomplete_event_size=MAX_HEAD,
                            ws_max_size=MAX_WS_MESSAGE)
    return uvicorn.Server(config)


def serve(paths: list[str], host: str, port: int | None, open_browser: bool,
          out: TextIO = sys.stdout, share: bool = False) -> int:
    """``callpath view``: open the databases, bind, print the URL, serve until Ctrl-C."""
    dbs = _open(paths)
    if port is None:  # the default port, or the next free one
        sock = None
        for p in range(8765, 8785):
            with contextlib.suppress(CallpathError):
                sock = bind(host, p)
                break
        if sock is None:
            raise CallpathError(f"cannot listen on {host}: ports 8765..8784 are all in use "
                                "(choose one with --port)")
    else:
        sock = bind(host, port)
    real_port = sock.getsockname()[1]
    token = None if is_loopback(host) else new_token()
    url = url_of(host, real_port, token)
    logging.basicConfig(level=logging.WARNING, format="callpath view: %(message)s")
    out.write(f"callpath view: serving {', '.join(d.name for d in dbs)} at {url}\n")
    if token:
        out.write("callpath view: the address is not loopback: the token in this URL is "
                  "required\n")
    server = _uvicorn_server(dbs, host, token)
    if share:  # a live session from the start (view/share.py)
        links = server.config.app.share.links(server.config.app.share.create(),
                                              url.split("?")[0])
        url = links["link"]
        out.write(f"callpath view: shared session: {links['link']}\n")
        out.write(f"callpath view: read-only guest link: {links['guest_link']}\n")
    out.write("callpath view: press Ctrl-C to stop\n")
    out.flush()
    if open_browser:
        _open_browser(url)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        for db in dbs:
            db.close()
    return 0


def _open(paths: list[str]) -> list[Database]:
    """Open the databases and queue their background work: the three views of the default
    state, then the trace index."""
    return open_databases(paths, index_traces=True)


def _has_display() -> bool:
    """Whether a graphical browser could show up. Without a display (an SSH session on a
    login node) Python's webbrowser would fall back to a console browser such as w3m,
    which would take over the terminal the server prints to."""
    if sys.platform.startswith(("linux", "freebsd", "openbsd", "netbsd")):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


def _open_browser(url: str) -> None:
    """Open a browser tab when one is available; never block, never fail."""
    if not _has_display():
        return

    def go() -> None:
        with contextlib.suppress(Exception):
            import webbrowser
            webbrowser.open(url, new=2)
    threading.Thread(target=go, name="callpath-browser", daemon=True).start()


@dataclass
class BackgroundServer:
    """A real uvicorn server in a thread: ``with BackgroundServer.start([...]) as s: s.url``."""

    host: str
    port: int
    token: str | None
    dbs: list[Database]
    _server: object
    _thread: threading.Thread

    @property
    def app(self):  # type: ignore[no-untyped-def]
        """The :class:`callpath.view.app.ViewerApp` served (its ``share`` hub, for tests)."""
        return self._server.config.app  # type: ignore[attr-defined]

    @property
    def url(self) -> str:
        """The base URL (``http://127.0.0.1:PORT``) without the token or a trailing slash."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @classmethod
    def start(cls, paths: list[str], host: str = "127.0.0.1", port: int = 0,
              token: str | None = None, static_dir: Path = STATIC_DIR) -> BackgroundServer:
        """Serve in a thread; ``token`` None on a non-loopback host draws a random one."""
        dbs = _open(paths)
        sock = bind(host, port)
        if token is None and not is_loopback(host):
            token = new_token()
        server = _uvicorn_server(dbs, host, token, static_dir)
        started = threading.Event()

        def run() -> None:
            async def main() -> None:
                task = asyncio.create_task(server.serve(sockets=[sock]))
                while not server.started and not task.done():
                    await asyncio.sleep(0.01)
                started.set()
                await task
            try:
                asyncio.run(main())
            finally:
                started.set()
                sock.close()

        th = threading.Thread(target=run, name="callpath-view-server", daemon=True)
        th.start()
        started.wait(60)
        if not server.started:
            raise CallpathError("the viewer server did not start")
        return cls(host, sock.getsockname()[1], token, dbs, server, th)

    def stop(self) -> None:
        self._server.should_exit = True  # type: ignore[attr-defined]
        self._thread.join(30)
        for db in self.dbs:
            db.close()

    def __enter__(self) -> BackgroundServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
