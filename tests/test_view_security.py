"""The viewer's security model against REAL servers, with raw HTTP requests (a socket, so
that no client normalises the path): the token on non-loopback binds, the Host check on
loopback binds, path traversal on static files in every spelling, sources limited to the
files a database records, and no write except the saved derived metrics."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from callpath.view.app import STATIC_DIR
from callpath.view.server import BackgroundServer
from conftest import ROOT, kill_group, run_cli
from view_support import copy_database, database_sources, post_json, serve

SECRET = "callpath-secret-marker-0123456789"


def raw(port: int, target: bytes, *, host: bytes = b"127.0.0.1", method: bytes = b"GET",
        headers: dict[bytes, bytes] | None = None, body: bytes = b"",
        connect: str = "127.0.0.1") -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request exactly as written; returns (status, headers, body)."""
    head = [method + b" " + target + b" HTTP/1.1", b"Host: " + host + b":" + str(port).encode(),
            b"Connection: close"]
    for k, v in (headers or {}).items():
        head.append(k + b": " + v)
    if body:
        head.append(b"Content-Length: " + str(len(body)).encode())
    with socket.create_connection((connect, port), timeout=30) as s:
        s.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    top, _, rest = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        hdrs.setdefault(k.strip().lower(), v.strip())
    return status, hdrs, rest


@pytest.fixture(scope="module")
def static_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A static folder with a normal file, and symlinks that escape it (to a secret file
    and to a folder outside)."""
    base = tmp_path_factory.mktemp("static")
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    st = base / "static"
    st.mkdir()
    (st / "index.html").write_text("<!doctype html><title>t</title>")
    (st / "ok.js").write_text("export const ok = 1;\n")
    (st / "sub").mkdir()
    (st / "sub" / "deep.css").write_text("body {}\n")
    (st / "link.js").symlink_to(outside / "secret.txt")
    (st / "out").symlink_to(outside)
    (base / "secret.txt").write_text(SECRET)
    return st


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("secdbs")
    return [copy_database(p, base) for p in database_sources()]


@pytest.fixture(scope="module")
def open_server(dbs: list[Path], static_dir: Path) -> BackgroundServer:
    with BackgroundServer.start([str(p) for p in dbs], static_dir=static_dir) as s:
        yield s


@pytest.fixture(scope="module")
def token_server(dbs: list[Path], static_dir: Path) -> BackgroundServer:
    """Bound to every address (0.0.0.0), reached through 127.0.0.1: not a loopback bind,
    so the token is required."""
    with BackgroundServer.start([str(p) for p in dbs], host="0.0.0.0",
                                static_dir=static_dir) as s:
        yield s


# ---- the token ------------------------------------------------------------------------


TARGETS = [b"/", b"/?token=wrong", b"/static/ok.js", b"/api/databases",
           b"/api/db/0/children", b"/api/db/1/trace/meta", b"/api/filters"]


@pytest.mark.parametrize("target", TARGETS)
def test_non_loopback_bind_refuses_requests_without_the_token(token_server: BackgroundServer,
                                                              target: bytes) -> None:
    status, _, body = raw(token_server.port, target)
    assert status == 403 and b"token" in body
    status, _, _ = raw(token_server.port, target,
                       headers={b"X-Callpath-Token": b"x" + token_server.token.encode()})
    assert status == 403
    status, _, _ = raw(token_server.port, target, headers={
        b"Cookie": b"callpath_token=" + token_server.token.encode()[:-1]})
    assert status == 403


def test_the_token_works_in_query_header_and_cookie(token_server: BackgroundServer) -> None:
    tok = token_server.token
    assert tok and len(tok) >= 24
    port = token_server.port
    status, hdrs, _ = raw(port, b"/?token=" + tok.encode())
    assert status == 200
    cookie = hdrs["set-cookie"]
    assert cookie.startswith(f"callpath_token={tok}") and "HttpOnly" in cookie
    assert "samesite=strict" in cookie.lower()
    assert raw(port, b"/api/databases?token=" + tok.encode())[0] == 200
    assert raw(port, b"/api/databases", headers={b"X-Callpath-Token": tok.encode()})[0] == 200
    assert raw(port, b"/api/databases",
               headers={b"Cookie": b"callpath_token=" + tok.encode()})[0] == 200
    assert raw(port, b"/static/ok.js?token=" + tok.encode())[0] == 200


def primary_address() -> str | None:
    """A non-loopback address of this machine (a UDP connect sends nothing)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))
        addr = s.getsockname()[0]
        if not addr.startswith("127."):
            return str(addr)
    return None


def test_bound_to_the_primary_address_the_token_is_required(dbs: list[Path]) -> None:
    addr = primary_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    with serve(dbs[:1], host=addr) as s:
        assert s.token
        assert raw(s.port, b"/api/databases", host=addr.encode(), connect=addr)[0] == 403
        assert raw(s.port, b"/api/databases?token=" + s.token.encode(), host=addr.encode(),
                   connect=addr)[0] == 200


def test_loopback_bind_answers_only_to_loopback_host_names(open_server: BackgroundServer
                                                           ) -> None:
    port = open_server.port
    assert raw(port, b"/api/databases")[0] == 200
    assert raw(port, b"/api/databases", host=b"localhost")[0] == 200
    status, _, body = raw(port, b"/api/databases", host=b"evil.example")
    assert status == 403 and b"localhost" in body


# ---- static files ----------------------------------------------------------------------


TRAVERSALS = [
    b"/static/../secret.txt", b"/static/../../etc/passwd", b"/static/..%2fsecret.txt",
    b"/static/%2e%2e/secret.txt", b"/static/%2E%2E%2Fsecret.txt", b"/static/.%2e/secret.txt",
    b"/static/%252e%252e/secret.txt", b"/static/%252e%252e%252fsecret.txt",
    b"/static/..%5csecret.txt", b"/static/..\\secret.txt", b"/static/sub/..\\..\\secret.txt",
    b"/static//etc/passwd", b"/static/%2fetc%2fpasswd", b"/static/%2Fetc/passwd",
    b"/static/ok.js%00", b"/static/ok.js%00.png", b"/static/sub/../../secret.txt",
    b"/static/./ok.js", b"/static/link.js", b"/static/out/secret.txt",
    b"/static/C:/secret.txt", b"/static/%c0%ae%c0%ae/secret.txt",
    b"/static/..%c0%afsecret.txt", b"/static/sub/%2e%2e/%2e%2e/secret.txt",
    b"/%2e%2e/secret.txt", b"/static/" + (b"../" * 20) + b"etc/passwd",
]


@pytest.mark.parametrize("target", TRAVERSALS)
def test_static_traversal_in_every_spelling_is_refused(open_server: BackgroundServer,
                                                       target: bytes) -> None:
    status, _, body = raw(open_server.port, target)
    assert status in (400, 403, 404), (target, status)
    assert SECRET.encode() not in body and b"root:" not in body


def test_static_files_inside_are_served(open_server: BackgroundServer) -> None:
    status, hdrs, body = raw(open_server.port, b"/static/ok.js")
    assert status == 200 and body == b"export const ok = 1;\n"
    assert hdrs["content-type"].startswith("text/javascript")
    assert raw(open_server.port, b"/static/sub/deep.css")[0] == 200
    assert raw(open_server.port, b"/static/missing.js")[0] == 404


def test_server_starts_without_a_front_end(dbs: list[Path], tmp_path: Path) -> None:
    with BackgroundServer.start([str(dbs[0])], static_dir=tmp_path / "none") as s:
        status, _, body = raw(s.port, b"/")
        assert status == 404 and b"front end is not installed" in body
        assert raw(s.port, b"/api/databases")[0] == 200


# ---- sources ---------------------------------------------------------------------------


@pytest.mark.parametrize("node", [b"../../etc/passwd", b"%2fetc%2fpasswd", b"/etc/passwd",
                                  b"t1%00", b"p0.0%2f..", b"t-1", b"t99999999999999999999"])
def test_source_takes_node_keys_never_paths(open_server: BackgroundServer, node: bytes
                                            ) -> None:
    status, _, body = raw(open_server.port, b"/api/db/2/source?node=" + node)
    assert status in (400, 404) and b"root:" not in body
    assert len(json.loads(body)["error"].splitlines()) == 1


def test_a_copied_source_that_links_outside_the_database_is_refused(tmp_path: Path) -> None:
    db = copy_database(database_sources()[2], tmp_path)
    secret = tmp_path / "secret.c"
    secret.write_text(SECRET)
    (db / "src" / "cpi.c").unlink()
    (db / "src" / "cpi.c").symlink_to(secret)
    with serve([db]) as s:
        find = json.loads(raw(s.port, b"/api/db/0/find?q=main&word=1")[2])
        key = find["matches"][0][-1].encode()
        status, _, body = raw(s.port, b"/api/db/0/source?node=" + key)
    assert status == 404 and SECRET.encode() not in body


# ---- writes ----------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_the_server_writes_nothing_but_the_saved_derived_metrics(tmp_path: Path) -> None:
    paths = [copy_database(p, tmp_path) for p in database_sources()]
    before = {str(p): snapshot(p) for p in paths}
    with serve(paths) as s:
        port = s.port
        for db in range(3):
            for view in ("top-down", "bottom-up", "flat"):
                for ep in ("columns", "children", "hotpath", "find?q=a&", "csv", "plot"):
                    sep = "" if ep.endswith("&") else "?"
                    raw(port, f"/api/db/{db}/{ep}{sep}view={view}".encode())
        for ep in ("meta", "frame", "depth?ctx=0&", "callpath", "summary", "stats"):
            sep = "" if ep.endswith("&") else "?"
            raw(port, f"/api/db/1/trace/{ep}{sep}width=10".encode())
        # POSTs the browser would not send are refused before anything is written
        doc = json.dumps([{"name": "n", "formula": "$0"}]).encode()
        assert raw(port, b"/api/db/0/derived/save", method=b"POST", body=doc,
                   headers={b"Content-Type": b"text/plain"})[0] == 415
        assert raw(port, b"/api/db/0/derived/save", method=b"POST", body=doc, headers={
            b"Content-Type": b"application/json", b"Origin": b"http://evil.example"})[0] == 403
        assert raw(port, b"/api/db/0/derived/save", method=b"GET")[0] == 405
        status, _ = post_json(s.url, "/api/db/1/derived/save", [{"name": "n", "formula": "$0"}])
        assert status == 200
    after = {str(p): snapshot(p) for p in paths}
    for p in paths:
        added = set(after[str(p)]) - set(before[str(p)])
        changed = {k for k in before[str(p)] if after[str(p)].get(k) != before[str(p)][k]}
        assert not changed
        assert added == ({str(Path("callpath") / "derived-metrics.json")}
                         if p == paths[1] else set())


# ---- the command -------------------------------------------------------------------------


def test_port_in_use_and_port_zero_are_one_line_errors(dbs: list[Path]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        proc = run_cli("view", str(dbs[0]), "--port", str(port), "--no-browser")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and f":{port}" in proc.stderr
    proc = run_cli("view", str(dbs[0]), "--port", "0", "--no-browser")
    assert proc.returncode == 2 and "1..65535" in proc.stderr
    proc = run_cli("view", str(dbs[0].parent / "missing.d"), "--no-browser")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1


def test_the_command_prints_a_url_with_a_token_for_a_non_loopback_bind(dbs: list[Path]
                                                                       ) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "callpath", "view", str(dbs[0]), "--host",
                             "0.0.0.0", "--no-browser"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "callpath view printed nothing in 120 s"
        line = proc.stdout.readline()
        m = re.search(r"http://[^:/]+:(\d+)/\?token=([A-Za-z0-9_-]+)", line)
        assert m, line
        port, tok = int(m.group(1)), m.group(2)
        status = None
        for _ in range(1200):  # uvicorn starts listening just after the line is printed
            try:
                status = raw(port, b"/api/databases")[0]
                break
            except OSError:
                time.sleep(0.05)
        assert status == 403
        assert raw(port, f"/api/databases?token={tok}".encode())[0] == 200
    finally:
        kill_group(proc)  # type: ignore[arg-type]


def test_static_dir_default_is_the_package_folder() -> None:
    assert STATIC_DIR.name == "static" and STATIC_DIR.parent.name == "view"


def test_a_browser_is_opened_only_where_a_display_exists(dbs: list[Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from callpath.view.server import _has_display

    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    if sys.platform.startswith("linux"):
        assert not _has_display()  # a login node over SSH: no console browser in our tty
    monkeypatch.setenv("DISPLAY", ":0")
    assert _has_display()
    # with a display, the browser named by $BROWSER gets the URL
    marker = tmp_path / "opened.txt"
    fake = tmp_path / "browser.sh"
    fake.write_text(f"#!/bin/sh\necho \"$1\" > {marker}\n")
    fake.chmod(0o755)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), DISPLAY=":0", BROWSER=f"{fake} %s")
    proc = subprocess.Popen([sys.executable, "-m", "callpath", "view", str(dbs[0]), "--port",
                             str(_free_port())], stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready
        url = re.search(r"http://\S+", proc.stdout.readline())
        assert url
        for _ in range(2400):
            if marker.exists() and marker.read_text().strip():
                break
            time.sleep(0.05)
        assert marker.read_text().strip() == url.group(0)
    finally:
        kill_group(proc)  # type: ignore[arg-type]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
