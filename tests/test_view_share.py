"""The shared-session hub and the notes API over a REAL server (view/share.py, view/notes.py):
relay and late-join state, bad messages closing only their sender, the token on a
non-loopback bind, read-only guests, notes saved with the database and listed by
``callpath report --notes``."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from callpath.view import share
from conftest import shared_path
from view_support import copy_database, post_json, serve

websockets = pytest.importorskip("websockets", reason="the websockets package is not installed")
from websockets.sync.client import ClientConnection, connect  # noqa: E402

pytestmark = pytest.mark.filterwarnings(
    "ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")

SMALL = shared_path("hpctoolkit", "dbase", "small.d")


@pytest.fixture(scope="module")
def db_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_database(SMALL, tmp_path_factory.mktemp("sharedb"))


@pytest.fixture(scope="module")
def server(db_copy: Path) -> Iterator[Any]:
    with serve([db_copy]) as s:
        yield s


def new_session(server: Any) -> dict[str, str]:
    status, doc = post_json(server.url, "/api/share/start", {})
    assert status == 200, doc
    return dict(doc)


def join(server: Any, sid: str, name: str, **extra: str) -> tuple[ClientConnection, dict[str, Any]]:
    q = urllib.parse.urlencode({"session": sid, **extra})
    ws = connect(f"ws://127.0.0.1:{server.port}/api/share/ws?{q}", open_timeout=10)
    ws.send(json.dumps({"t": "hello", "name": name}))
    return ws, recv_kind(ws, "welcome")


def recv_kind(ws: ClientConnection, kind: str, timeout: float = 10) -> dict[str, Any]:
    while True:
        msg = json.loads(ws.recv(timeout=timeout))
        if msg["t"] == kind:
            return dict(msg)


def closed_code(ws: ClientConnection) -> int | None:
    """The close code the server sent (waits for the close)."""
    try:
        while True:
            ws.recv(timeout=10)
    except websockets.exceptions.ConnectionClosed as e:
        return e.rcvd.code if e.rcvd is not None else None


def test_relay_late_join_and_lead(server: Any) -> None:
    sid = new_session(server)["session"]
    a, wa = join(server, sid, "Ana")
    assert wa["leader"] == wa["you"]  # the first editor leads
    b, wb = join(server, sid, "Bo")
    assert recv_kind(a, "join")["name"] == "Bo"
    a.send(json.dumps({"t": "set", "path": "s.dbs.0.view", "value": "flat"}))
    a.send(json.dumps({"t": "set", "path": "s.dbs.0.view", "value": "bottom-up"}))
    got = recv_kind(b, "set")
    assert got["from"] == wa["you"] and got["path"] == "s.dbs.0.view"
    # a late joiner gets the current state of each participant, not the history
    c, wc = join(server, sid, "Cy")
    assert wc["states"][str(wa["you"])] == {"s.dbs.0.view": "bottom-up"}
    assert {p["name"] for p in wc["participants"]} == {"Ana", "Bo", "Cy"}
    # a shorter path replaces the longer paths kept below it
    a.send(json.dumps({"t": "set", "path": "s.dbs", "value": {"0": {"view": "flat"}}}))
    recv_kind(c, "set")
    d, wd = join(server, sid, "Di")
    assert wd["states"][str(wa["you"])] == {"s.dbs": {"0": {"view": "flat"}}}
    # handing the lead over reaches everyone
    a.send(json.dumps({"t": "handover", "to": wb["you"]}))
    assert recv_kind(c, "lead")["leader"] == wb["you"]
    # the leader leaves: the lead passes to an editor still present
    b.close()
    assert recv_kind(c, "lead")["leader"] in (wa["you"], wc["you"], wd["you"])
    for ws in (a, c, d):
        ws.close()


def rejoin(server: Any, sid: str, hello: dict[str, Any], **extra: str
           ) -> tuple[ClientConnection, dict[str, Any]]:
    """A new connection whose hello is ``hello`` (a page reconnecting)."""
    q = urllib.parse.urlencode({"session": sid, **extra})
    ws = connect(f"ws://127.0.0.1:{server.port}/api/share/ws?{q}", open_timeout=10)
    ws.send(json.dumps(hello))
    return ws, recv_kind(ws, "welcome")


def test_reconnect_takes_over_dead_connection(server: Any) -> None:
    """A page reconnecting with its welcome's resume key while the hub still holds its old
    connection (which went silent, as after a laptop slept) takes its old place: same id,
    colour, kept state, cursor and lead; the old connection is closed; the others see the
    same participant come back, never a leave or a second entry. A wrong or someone else's
    key of the other role joins as a new participant."""
    links = new_session(server)
    sid = links["session"]
    guest_key = urllib.parse.parse_qs(urllib.parse.urlsplit(links["guest_link"]).query)["guest"][0]
    b, wb = join(server, sid, "Bo")           # the first editor: the leader
    a, wa = join(server, sid, "Ana")
    b.send(json.dumps({"t": "set", "path": "s.db", "value": 0}))
    b.send(json.dumps({"t": "cursor", "value": {"key": "t7"}}))
    recv_kind(a, "cursor")
    before = [(p["id"], p["colour"]) for p in wa["participants"]]  # Bo, then Ana
    # b's old connection stays open and unread: the hub has not heard of the drop
    b2, w2 = rejoin(server, sid, {"t": "hello", "name": "Bo", "resume": wb["resume"]})
    assert w2["you"] == wb["you"] and w2["leader"] == wb["you"]
    assert [(p["id"], p["colour"]) for p in w2["participants"]] == before
    assert w2["resume"] != wb["resume"]    # each connection its own key
    assert closed_code(b) == share.CLOSE_GOING_AWAY
    # the others: the same participant again, no leave, its state and cursor kept
    kinds = []
    b2.send(json.dumps({"t": "set", "path": "s.mark", "value": 1}))
    while (m := json.loads(a.recv(timeout=10)))["t"] != "set":
        kinds.append((m["t"], m.get("id")))
    assert kinds == [("join", wb["you"])] and m["from"] == wb["you"]
    c, wc = join(server, sid, "Cy")
    assert wc["states"][str(wb["you"])] == {"s.db": 0, "s.mark": 1}
    assert wc["cursors"][str(wb["you"])] == {"key": "t7"}
    assert len(wc["participants"]) == 3
    # a wrong key, or an editor's key on a guest connection: a new participant
    d, wd = rejoin(server, sid, {"t": "hello", "name": "Di", "resume": "x" * 24})
    g, wg = rejoin(server, sid, {"t": "hello", "name": "G", "resume": wa["resume"]},
                   guest=guest_key)
    assert wd["you"] not in (wa["you"], wb["you"], wc["you"])
    assert wg["guest"] and wg["you"] not in (wa["you"], wd["you"])
    assert len(wg["participants"]) == 5
    for ws in (a, b2, c, d, g):
        ws.close()


BAD = [
    "not json",                                                     # malformed
    json.dumps([1, 2]),                                             # not an object
    json.dumps({"t": "explode"}),                                   # unknown kind
    json.dumps({"t": "set", "path": 7, "value": 1}),                # wrongly typed
    json.dumps({"t": "set", "path": "a..b", "value": 1}),           # bad path
    json.dumps({"t": "handover", "to": "x"}),                       # wrongly typed
    json.dumps({"t": "set", "path": "s.big", "value": "x" * (share.MAX_MESSAGE + 10)}),
    json.dumps({"t": "hello", "name": "x", "resume": 5}),          # wrongly typed key
]


@pytest.mark.parametrize("bad", BAD, ids=["malformed", "array", "kind", "type", "path",
                                           "handover", "oversized", "resume"])
def test_bad_message_closes_only_its_sender(server: Any, bad: str) -> None:
    sid = new_session(server)["session"]
    a, wa = join(server, sid, "good")
    b, _ = join(server, sid, "bad")
    recv_kind(a, "join")
    b.send(bad)
    assert closed_code(b) in (1008, 1009)
    recv_kind(a, "leave")
    a.send(json.dumps({"t": "set", "path": "s.db", "value": 0}))  # the good one goes on
    c, wc = join(server, sid, "late")
    assert wc["states"][str(wa["you"])] == {"s.db": 0}
    a.close()
    c.close()


def test_stalled_participant_does_not_stall_others(server: Any) -> None:
    """A participant that stops reading (its socket's buffers fill up) holds nobody back:
    300 changes of 60 KB (18 MB) from the leader all reach a reading participant, newest
    last, while the stalled one's outbox keeps only the latest value per path."""
    sid = new_session(server)["session"]
    a, _ = join(server, sid, "leader")
    stalled = connect(f"ws://127.0.0.1:{server.port}/api/share/ws?session={sid}",
                      max_queue=1, close_timeout=0.5)  # its reader stops after one message
    stalled.send(json.dumps({"t": "hello", "name": "stalled"}))
    b, _ = join(server, sid, "reader")
    big = "x" * 60000
    for i in range(300):
        a.send(json.dumps({"t": "set", "path": "s.big", "value": f"{big}{i}"}))
    a.send(json.dumps({"t": "set", "path": "s.done", "value": 299}))
    last = -1
    while True:
        msg = recv_kind(b, "set", timeout=30)
        if msg["path"] == "s.done":
            break
        n = int(msg["value"][len(big):])
        assert n > last  # in order; superseded values may be skipped, never reordered
        last = n
    assert last == 299
    for ws in (a, b, stalled):
        ws.close()


def test_bounds(server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Participants per session and sessions per server are bounded (the limits lowered
    here so that the test stays small)."""
    monkeypatch.setattr(share, "MAX_PARTICIPANTS", 2)
    sid = new_session(server)["session"]
    a, _ = join(server, sid, "one")
    b, _ = join(server, sid, "two")
    third = connect(f"ws://127.0.0.1:{server.port}/api/share/ws?session={sid}")
    assert closed_code(third) == 1013
    a.close()
    b.close()
    monkeypatch.setattr(share, "MAX_SESSIONS", len(server.app.share.sessions))
    status, doc = post_json(server.url, "/api/share/start", {})
    assert status == 400 and "at most" in doc["error"]
    # sessions left empty long enough give way to a new one
    monkeypatch.setattr(share, "EMPTY_EXPIRY", 0.0)
    status, doc = post_json(server.url, "/api/share/start", {})
    assert status == 200 and doc["session"] in server.app.share.sessions


def test_first_message_must_be_hello(server: Any) -> None:
    sid = new_session(server)["session"]
    ws = connect(f"ws://127.0.0.1:{server.port}/api/share/ws?session={sid}")
    ws.send(json.dumps({"t": "set", "path": "s.db", "value": 0}))
    assert closed_code(ws) == 1008


def test_unknown_session_and_foreign_origin_refused(server: Any) -> None:
    with pytest.raises(websockets.exceptions.InvalidStatus):
        connect(f"ws://127.0.0.1:{server.port}/api/share/ws?session=nope").recv(timeout=5)
    sid = new_session(server)["session"]
    with pytest.raises(websockets.exceptions.InvalidStatus):
        connect(f"ws://127.0.0.1:{server.port}/api/share/ws?session={sid}",
                origin="http://evil.example").recv(timeout=5)  # type: ignore[arg-type]


def _lan_address() -> str | None:
    """A non-loopback address of this machine, or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
            addr = str(s.getsockname()[0])
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


def test_token_required_on_non_loopback_bind(db_copy: Path) -> None:
    host = _lan_address()
    if host is None:
        pytest.skip("this machine has no non-loopback IPv4 address to bind")
    with serve([db_copy], host=host) as s:
        assert s.token
        session = s.app.share.create()
        links = s.app.share.links(session, f"http://{host}:{s.port}/")
        assert f"token={s.token}" in links["link"]       # the join link carries the token,
        assert s.token not in links["guest_link"]          # the guest link only its own key
        assert f"guest={session.guest_key}" in links["guest_link"]
        base = f"ws://{host}:{s.port}/api/share/ws?session={session.id}"
        with pytest.raises(websockets.exceptions.InvalidStatus):
            connect(base).recv(timeout=5)  # no token: refused before joining
        with pytest.raises(websockets.exceptions.InvalidStatus):
            connect(base + "&token=wrong").recv(timeout=5)
        ws = connect(base + f"&token={s.token}")
        ws.send(json.dumps({"t": "hello", "name": "with token"}))
        assert recv_kind(ws, "welcome")["guest"] is False
        ws.close()
        g = connect(base + f"&guest={session.guest_key}")  # the read-only link
        g.send(json.dumps({"t": "hello", "name": "guest"}))
        assert recv_kind(g, "welcome")["guest"] is True
        g.send(json.dumps({"t": "lead"}))
        assert closed_code(g) == 1008  # a guest cannot lead
        # the guest key reads the API but cannot save
        code, _ = post_json(s.url, "/api/db/0/notes/save", {
            "author": "g", "text": "x", "anchor": {"kind": "line", "file": "a.c", "line": 1}},
            guest=session.guest_key)
        assert code == 403
        code, _ = post_json(s.url, "/api/db/0/notes/save", {
            "author": "t", "text": "x", "anchor": {"kind": "line", "file": "a.c", "line": 1}},
            token="wrong")
        assert code == 403


def test_notes_saved_listed_and_guarded(tmp_path: Path) -> None:
    db = copy_database(SMALL, tmp_path)
    anchor = {"kind": "node", "view": "top-down", "key": "r", "label": "<program root>"}
    with serve([db]) as s:
        session = s.app.share.create()
        watcher = connect(f"ws://127.0.0.1:{s.port}/api/share/ws?session={session.id}")
        watcher.send(json.dumps({"t": "hello", "name": "w"}))
        recv_kind(watcher, "welcome")
        code, note = post_json(s.url, "/api/db/0/notes/save", {
            "author": "Ana <script>", "text": "<script>alert(1)</script> slow here",
            "anchor": anchor})
        assert code == 200, note
        assert recv_kind(watcher, "notes")["db"] == 0  # live participants hear of it
        code, _ = post_json(s.url, "/api/db/0/notes/save", {
            "author": "Bo", "text": "clear\x1b[2J screen\nsecond line", "anchor": {
                "kind": "interval", "t0": 10, "t1": 20, "c0": 0, "c1": 2}})
        assert code == 200
        watcher.close()
        for bad in ({"author": "a", "text": "", "anchor": anchor},
                    {"author": "a", "text": "x", "anchor": {"kind": "line", "file": "f",
                                                           "line": 0}},
                    {"author": "a", "text": "x" * 5000, "anchor": anchor}):
            code, err = post_json(s.url, "/api/db/0/notes/save", bad)
            assert code == 400 and "\n" not in err["error"]
        code, _ = post_json(s.url, "/api/db/0/notes/save", {
            "author": "g", "text": "x", "anchor": anchor}, guest=session.guest_key)
        assert code == 403  # the read-only link cannot save, even on loopback
    saved = json.loads((db / "callpath" / "notes.json").read_text())
    assert saved["notes"][0]["text"].startswith("<script>")  # stored as given, shown as text
    out = subprocess.run([sys.executable, "-m", "callpath", "report", str(db), "--notes"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Ana <script>" in out.stdout and "<program root>" in out.stdout
    assert "slow here" in out.stdout
    # a terminal escape typed into a note is shown, not obeyed
    assert "\x1b" not in out.stdout and "clear\\x1b[2J screen" in out.stdout
    assert "    second line" in out.stdout and "trace 10..20, contexts 0..1" in out.stdout
    (db / "callpath" / "notes.json").write_text("{broken")
    out = subprocess.run([sys.executable, "-m", "callpath", "report", str(db), "--notes"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "notes.json" in out.stderr


def test_session_ends_when_server_stops(db_copy: Path) -> None:
    with serve([db_copy]) as s:
        session = s.app.share.create()
        ws = connect(f"ws://127.0.0.1:{s.port}/api/share/ws?session={session.id}")
        ws.send(json.dumps({"t": "hello", "name": "x"}))
        recv_kind(ws, "welcome")
    with pytest.raises(websockets.exceptions.ConnectionClosed):
        ws.recv(timeout=10)


def test_cli_share_prints_links(db_copy: Path) -> None:
    """``callpath view DB --share`` prints a join link and a read-only guest link; both join
    the session it opened."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "callpath", "view", str(db_copy),
                             "--no-browser", "--share", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(4)]
        text = "".join(lines)
        join_line = next(x for x in lines if "shared session:" in x)
        guest_line = next(x for x in lines if "read-only guest link:" in x)
        link = join_line.split()[-1]
        guest = guest_line.split()[-1]
        assert link.startswith(f"http://127.0.0.1:{port}/?session="), text
        q = urllib.parse.parse_qs(urllib.parse.urlparse(guest).query)
        assert "token" not in q and q["session"][0] in link
        for url, is_guest in ((link, False), (guest, True)):
            ws = connect("ws://" + url.split("://", 1)[1].replace("/?", "/api/share/ws?"))
            ws.send(json.dumps({"t": "hello", "name": "cli"}))
            assert recv_kind(ws, "welcome")["guest"] is is_guest
            ws.close()
    finally:
        proc.terminate()
        proc.wait(20)
