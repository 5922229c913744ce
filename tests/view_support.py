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
``trace_painted(page)`` (the browser tests: wait for the trace frame of the current window).
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
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
