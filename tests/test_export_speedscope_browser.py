"""The speedscope export opened in speedscope's own web app (the npm package ``speedscope``,
its ``dist/release`` served from a local directory) in Debian's Chromium driven by Playwright,
as tests/test_view_browser.py drives the viewer. The app must load the file without an error
and show the expected frames in its Sandwich view (a DOM table of every frame by name) and the
profile names in its profile selector.

The package is installed by this test into ``.cache/npm-speedscope`` (ignored by git) with npm;
the test skips with the reason when npm, the network or Chromium is missing.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import callpath
from conftest import ROOT, run_cli, shared_path
from test_view_browser import browser  # noqa: F401  (Debian's Chromium, launched once)

playwright_sync = pytest.importorskip(
    "playwright.sync_api", exc_type=ImportError,
    reason="the Python package playwright is not installed or does not import")

CACHE = ROOT / ".cache" / "npm-speedscope"
VERSION = "1.25.0"


def _release() -> Path:
    rel = CACHE / "node_modules" / "speedscope" / "dist" / "release"
    if (rel / "index.html").exists():
        return rel
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed (Debian: apt-get install npm), so speedscope's web "
                    "app cannot be fetched")
    CACHE.mkdir(parents=True, exist_ok=True)
    r = subprocess.run([npm, "install", "--prefix", str(CACHE), "--no-audit", "--no-fund",
                        f"speedscope@{VERSION}"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 or not (rel / "index.html").exists():
        pytest.skip(f"npm could not install speedscope: {r.stderr.strip()[-200:]}")
    return rel


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("speedscope-site")
    shutil.copytree(_release(), root, dirs_exist_ok=True)
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize("db,frames", [
    ("small.d", ["main", "caller", "spinsleep"]),
    ("loops-cputime-t.d", ["main._omp_fn.0", "func1", "func2", "test_separated_loops"]),
])
def test_speedscope_app_shows_the_frames(site: tuple[str, Path], browser: Any, db: str,  # noqa: F811
                                         frames: list[str]) -> None:
    base, root = site
    src = shared_path("hpctoolkit", "dbase", db)
    out = root / f"{db}.speedscope.json"
    run_cli("export", str(src), "--to", "speedscope", "-o", str(out), check=True)
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_default_timeout(20000)
    try:
        page.goto(f"{base}/index.html#profileURL={base}/{out.name}")
        page.get_by_text("Sandwich").first.click()
        for name in frames:
            page.get_by_text(name, exact=True).first.wait_for()
        text = page.inner_text("body")
        # the summary first, then one profile per execution context
        n = 1 + len(callpath.open(src).contexts)
        assert "summary: CPUTIME (sec)" in text and f"(1/{n})" in text
        assert "Something went wrong" not in text and "Unrecognized format" not in text
        shot = ROOT / "tests" / "artifacts" / "speedscope"
        shot.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot / f"{db}.png"))
    finally:
        ctx.close()
    assert not errors, errors
