"""Shared helpers for the viewer's tests (API, security and browser tests).

``view_server`` (module scope) starts a REAL uvicorn server in a thread on a free loopback
port, serving copies of the real databases (copies, because saving derived metrics writes
into a database): id 0 = ``small.d``, 1 = ``loops-cputime-t.d`` (4 threads, traces),
2 = the Hatchet cpi database (experiment.xml, 4 ranks, a copied source file). It yields a
:class:`callpath.view.server.BackgroundServer`: ``.url`` is ``http://127.0.0.1:PORT``
(no trailing slash), ``.token`` is None, ``.dbs[i].path`` the database copies.

Interface (stable, used by tests/test_view_*.py and the browser tests):
``view_server`` fixture (import ``view_server_fixture``), ``serve(paths, host=...,
token=...)`` context manager, ``copy_database(src, dst_dir)``,
``get_json(base_url, path, **params)``, ``get_text(base_url, path, **params)``,
``post_json(base_url, path, doc, **params)``, ``VIEW_DATABASES`` (names in id order),
``trace_painted(page)`` (the browser tests: wait for the trace frame of the current window),
``TcpRelay(port)`` (a loopback TCP forwarder whose connections a test can cut).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import struct
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from callpath.view.server import BackgroundServer
from conftest import shared_path

# no sandbox as root in CI; /tmp instead of /dev/shm, which containers keep small
CHROME_ARGS = ["--no-sandbox", "--disable-dev-shm-usage"]


def trace_painted(pg: Any) -> None:
    """Waits until the trace canvas shows the current window (its frame has been painted).
    The window changes at once on a click, but the canvas, the ruler and ``data-frame`` are
    drawn only when that window's frame has come from the server: reading them after a fixed
    pause read an older frame whenever the request took longer (a loaded machine)."""
    pg.wait_for_function("""() => { const t = window.__callpath.trace, w = t.win;
        return document.getElementById('tr-canvas').dataset.frame ===
            `${Math.floor(w.t0)},${Math.ceil(w.t1)},${w.c0},${w.c1},${t.depth}`; }""")


def chromium() -> str:
    """Debian's Chromium for the browser tests, or a skip with the reason."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium on this machine (Debian: apt-get install chromium)")

VIEW_DATABASES = ["small.d", "loops-cputime-t.d", "hpctoolkit-cpi-database"]


def database_sources() -> list[Path]:
    return [shared_path("hpctoolkit", "dbase", "small.d"),
            shared_path("hpctoolkit", "dbase", "loops-cputime-t.d"),
            shared_path("hatchet", "hpctoolkit-cpi-database")]


def copy_database(src: Path, dst_dir: Path) -> Path:
    dst = dst_dir / src.name
    shutil.copytree(src, dst)
    return dst


@contextmanager
def serve(paths: list[Path] | list[str], host: str = "127.0.0.1", token: str | None = None
          ) -> Iterator[BackgroundServer]:
    server = BackgroundServer.start([str(p) for p in paths], host=host, port=0, token=token)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module", name="view_server")
def view_server_fixture(tmp_path_factory: pytest.TempPathFactory
                        ) -> Iterator[BackgroundServer]:
    base = tmp_path_factory.mktemp("viewdbs")
    paths = [copy_database(p, base) for p in database_sources()]
    with serve(paths) as server:
        yield server


# Import either name into a test module; importing ``view_server_fixture`` (marked as an
# intended unused import) keeps ruff quiet about test parameters named ``view_server``.
# Both register the fixture ``view_server``.
view_server = view_server_fixture


def _url(base: str, path: str, params: dict[str, Any]) -> str:
    enc = {k: (json.dumps(v) if isinstance(v, list | dict) else str(v))
           for k, v in params.items() if v is not None}
    return base + path + ("?" + urllib.parse.urlencode(enc) if enc else "")


def get_text(base: str, path: str, **params: Any) -> tuple[int, str]:
    """GET; returns (status, body text) for any status. List/dict params are sent as JSON."""
    try:
        with urllib.request.urlopen(_url(base, path, params), timeout=60) as r:
            return r.status, r.read().decode("utf-8")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8")


def get_json(base: str, path: str, **params: Any) -> Any:
    """GET a JSON endpoint that must succeed (200)."""
    status, text = get_text(base, path, **params)
    assert status == 200, f"{path} {params}: {status} {text}"
    return json.loads(text)


def post_json(base: str, path: str, doc: Any, **params: Any) -> tuple[int, Any]:
    req = urllib.request.Request(_url(base, path, params), data=json.dumps(doc).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class TcpRelay:
    """A TCP forwarder from a free port on 127.0.0.1 to ``127.0.0.1:port``, standing for the
    network between one browser and the viewer: a test cuts it to see what the page does
    when its connections drop without a goodbye.

    Bytes are passed on unchanged (the Host header names the relay's port; the viewer's
    loopback check is on the host, not the port). :meth:`drop` resets every relayed
    connection at both ends (SO_LINGER 0, so the peers see a reset, never a FIN or a
    WebSocket close frame); ``drop(server_notices=False)`` resets only the browser's side
    and sends nothing more upstream, so the server's socket stays open as after a laptop
    slept or changed networks; ``refusing`` set, new connections are reset as soon as they
    are accepted (the network still down); :meth:`hold` stops passing anything, in either
    direction, EOF included (a silent network, while the server may go away behind it).
    A connection whose upstream cannot be reached (the server stopped) is reset too.
    Runs its own event loop in a thread."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.refusing = False
        self.held = False
        self.accepted = 0
        self._open: list[asyncio.StreamWriter] = []  # the browser's ends of live connections
        self._upstream: list[asyncio.StreamWriter] = []  # the server's ends of them
        self._silent: set[asyncio.StreamWriter] = set()  # server's ends left half-open
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True,
                                        name="tcp-relay")
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the relay did not start")

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port: int = self._server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> None:
        self.accepted += 1
        if self.refusing:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            _reset(writer)
            return
        ends = [writer, up_writer]
        self._open += [writer]
        self._upstream.append(up_writer)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        for w in ends:  # both directions ended (or were reset): done with this connection
            if w in self._open or w in self._upstream or w in self._silent:
                for group in (self._open, self._upstream):
                    if w in group:
                        group.remove(w)
                self._silent.discard(w)
                w.close()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Passes src to dst until src ends. Once dst is reset, src is still read (and
        what comes is lost): a server end left half-open stays open until the server
        closes it."""
        with contextlib.suppress(Exception):  # src reset by drop(): this direction ends
            while data := await src.read(1 << 16):
                if self.held or dst in self._silent or dst.transport.is_closing():
                    continue
                with contextlib.suppress(Exception):
                    dst.write(data)
                    await dst.drain()
            if not self.held and dst not in self._silent and not dst.transport.is_closing():
                dst.write_eof()

    def _call(self, fn: Any) -> None:
        async def run() -> None:
            fn()
        asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def hold(self) -> None:
        """Nothing passes any more until :meth:`drop` (the connections stay open)."""
        self.held = True

    def drop(self, server_notices: bool = True) -> None:
        """Resets every relayed connection at the browser's end, and at the server's too
        unless ``server_notices`` is False (then the server's ends are kept open and sent
        nothing more); new connections work again (unless ``refusing``)."""
        def reset_all() -> None:
            for w in self._open:
                _reset(w)
            self._open.clear()
            if server_notices:
                for w in [*self._upstream, *self._silent]:
                    _reset(w)
                self._silent.clear()
            else:
                self._silent.update(self._upstream)
            self._upstream.clear()
            self.held = False
        self._call(reset_all)

    def close(self) -> None:
        self.drop()
        self._call(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> TcpRelay:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Closes a connection with a TCP reset: SO_LINGER on with a zero timeout."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
