"""Live shared viewer sessions: the WebSocket hub that orders and relays view-state changes.

The server stays thin (DESIGN.md section 6): it never computes a view for a session. Each
participant's page keeps asking the ordinary HTTP API; what goes through the hub are small
messages: "set this path of my view state to this value" (with the participant and a
sequence number added by the hub), "my cursor is here", "I take the lead", "I offer these
derived metrics", "the notes of database N changed".

Why each rule:

- **Late joiners get the current state, not the history.** The hub keeps, per participant,
  the latest value of every state path it set (a path replaces any longer path below it), and
  a joiner's ``welcome`` holds those maps: a few kilobytes, whatever the length of the session.
- **Slow participants get the latest state, not a backlog.** Each participant has an outbox
  keyed by (kind, sender, path): a newer message for the same key replaces the queued one and
  moves to the end, so the queue never holds more than one value per key, and a sender task
  per participant writes it out. A participant whose socket does not take a message within
  :data:`SEND_TIMEOUT` seconds, or whose outbox exceeds :data:`MAX_OUTBOX` keys, is dropped;
  the others never wait for it (nothing in the relay path awaits another participant's send).
- **A bad message closes only its sender** (code 1008, policy violation): not JSON, not an
  object, an unknown kind, a wrongly typed field, a path that is not dotted words, a text over
  :data:`MAX_MESSAGE` bytes, or a state over :data:`MAX_STATE` bytes.
- **Bounded**: :data:`MAX_SESSIONS` sessions per server (at the bound, sessions empty for
  :data:`EMPTY_EXPIRY` seconds give way to a new one), :data:`MAX_PARTICIPANTS` per session.
- **Roles**: the session link grants what the viewer's token grants; the guest link (its
  own random key) is read-only: a guest may follow, explore and point, but not lead, offer,
  or save (the HTTP guard refuses a guest's saving requests, see :func:`is_guest_key`).
- **A page that reconnects is the same participant.** Each ``welcome`` carries a random
  ``resume`` key, sent to that participant only; a page whose connection dropped sends it in
  its next ``hello``. When the hub still holds the old connection (a laptop that slept or
  changed networks: the server hears nothing until its ping times out), the new connection
  takes over that participant's id, colour, kept state, cursor and lead, and the old one is
  closed; the others see no one leave and no second entry. A key the hub no longer knows (the
  old connection was already dropped) just joins as a new participant.
- **Sessions end when the server stops**: they live in memory only, and uvicorn closes every
  socket as it shuts down (the pages say the session ended). Notes are files beside the
  database and outlive them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.websockets import WebSocket, WebSocketDisconnect

from callpath.view import security

log = logging.getLogger("callpath.view")

MAX_MESSAGE = 64 << 10       # one message, as text
MAX_STATE = 1 << 20          # one participant's kept state, as JSON text
MAX_PATHS = 512              # distinct state paths one participant may keep
MAX_SESSIONS = 16
EMPTY_EXPIRY = 600.0         # a session empty this long gives way to a new one at the bound
MAX_PARTICIPANTS = 64
MAX_NAME = 40
MAX_OUTBOX = 2048            # distinct queued keys before a participant counts as gone
SEND_TIMEOUT = 10.0          # seconds one send may take before the participant is dropped
GUEST_COOKIE = "callpath_guest"
PATH_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,11}$")
COLOURS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#e377c2",
           "#8c564b", "#bcbd22", "#7f7f7f"]
KINDS = {"hello", "set", "cursor", "lead", "handover", "offer", "name", "ping"}
CLOSE_POLICY = 1008
CLOSE_GOING_AWAY = 1001
CLOSE_FULL = 1013


class BadMessage(Exception):
    """A message the hub refuses; its text is the close reason sent to the sender."""


@dataclass(eq=False)
class Participant:
    id: int
    name: str
    colour: str
    guest: bool
    ws: WebSocket
    state: OrderedDict[str, Any] = field(default_factory=OrderedDict)
    state_bytes: dict[str, int] = field(default_factory=dict)
    cursor: Any = None
    outbox: OrderedDict[tuple[str, int, str], dict[str, Any]] = field(
        default_factory=OrderedDict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    gone: bool = False
    resume: str = field(default_factory=lambda: secrets.token_urlsafe(18))

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "colour": self.colour, "guest": self.guest}


@dataclass(eq=False)
class Session:
    id: str
    guest_key: str
    participants: dict[int, Participant] = field(default_factory=dict)
    leader: int | None = None
    seq: int = 0
    next_id: int = 1
    empty_since: float | None = field(default_factory=time.monotonic)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


class ShareHub:
    """Every live session of one viewer server."""

    def __init__(self, token: str | None, loopback: bool) -> None:
        self.token = token
        self.loopback = loopback
        self.sessions: dict[str, Session] = {}
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, once seen

    # ---- sessions and links ------------------------------------------------------------

    def create(self) -> Session:
        from callpath.errors import CallpathError

        if len(self.sessions) >= MAX_SESSIONS:  # make room: sessions empty for long
            now = time.monotonic()
            for sid, old in list(self.sessions.items()):
                if old.empty_since is not None and now - old.empty_since > EMPTY_EXPIRY:
                    del self.sessions[sid]
        if len(self.sessions) >= MAX_SESSIONS:
            raise CallpathError(f"at most {MAX_SESSIONS} shared sessions per server: join "
                                "one of the open sessions instead")
        s = Session(secrets.token_urlsafe(9), secrets.token_urlsafe(18))
        self.sessions[s.id] = s
        return s

    def links(self, session: Session, base: str) -> dict[str, str]:
        """The join link (carrying the token when one is in force) and the read-only link
        (carrying only the session's guest key, never the token)."""
        full = {"session": session.id}
        if self.token:
            full["token"] = self.token
        guest = {"session": session.id, "guest": session.guest_key}
        return {"session": session.id, "link": f"{base}?{urlencode(full)}",
                "guest_link": f"{base}?{urlencode(guest)}"}

    def is_guest_key(self, given: str | None) -> bool:
        """Whether ``given`` is the guest key of a live session (constant-time compares)."""
        if not given:
            return False
        ok = False
        for s in self.sessions.values():
            ok |= hmac.compare_digest(given.encode("utf-8", "replace"), s.guest_key.encode())
        return ok

    # ---- HTTP: start a session ---------------------------------------------------------

    async def start_endpoint(self, request: Request) -> Response:
        """``POST /api/share/start``: a new session and its two links."""
        from callpath.errors import CallpathError

        if request.scope.get("callpath_guest"):
            return JSONResponse({"error": "a read-only guest cannot start a session"},
                                status_code=403)
        self.loop = asyncio.get_running_loop()
        try:
            s = self.create()
        except CallpathError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        base = f"{request.url.scheme}://{request.headers.get('host', 'localhost')}/"
        return JSONResponse(self.links(s, base))

    # ---- WebSocket ---------------------------------------------------------------------

    def _role(self, ws: WebSocket) -> str | None:
        """"editor", "guest", or None when the socket must be refused: the same rules as
        the HTTP guard (loopback: Host names a loopback host; otherwise the token), plus an
        Origin check (a web page of another site must not join through the user's
        browser), and the session's guest key for read-only participants."""
        host = security.host_of(ws.headers.get("host", ""))
        origin = ws.headers.get("origin")
        if origin is not None:
            own = security.host_of(origin.split("://", 1)[-1].split("/", 1)[0])
            if own != host:
                return None
        guest = ws.query_params.get("guest") or ws.cookies.get(GUEST_COOKIE)
        sid = ws.query_params.get("session", "")
        s = self.sessions.get(sid)
        is_guest = s is not None and bool(guest) and hmac.compare_digest(
            str(guest).encode("utf-8", "replace"), s.guest_key.encode())
        if self.loopback:
            if host not in security.LOOPBACK_HOSTS and not security.is_loopback(host):
                return None
            return "guest" if is_guest else "editor"
        given = (ws.headers.get(security.TOKEN_HEADER) or ws.query_params.get("token")
                 or ws.cookies.get(security.TOKEN_COOKIE))
        if self.token is not None and security.token_matches(given, self.token):
            return "guest" if is_guest else "editor"
        return "guest" if is_guest else None

    async def ws_endpoint(self, ws: WebSocket) -> None:
        self.loop = asyncio.get_running_loop()
        role = self._role(ws)
        if role is None:
            await ws.close(CLOSE_POLICY, "access token missing or wrong")
            return
        s = self.sessions.get(ws.query_params.get("session", ""))
        if s is None:
            await ws.close(CLOSE_POLICY, "no such session (it ended, or the link is wrong)")
            return
        await ws.accept()
        if len(s.participants) >= MAX_PARTICIPANTS:  # accepted first: the page shows why
            await ws.close(CLOSE_FULL, f"the session is full ({MAX_PARTICIPANTS} participants)")
            return
        pid = s.next_id
        s.next_id += 1
        p = Participant(pid, f"participant {pid}", COLOURS[(pid - 1) % len(COLOURS)],
                        role == "guest", ws)
        sender = asyncio.create_task(self._sender(s, p))
        try:
            await self._serve(s, p)
        except BadMessage as e:
            p.gone = True
            with contextlib.suppress(Exception):
                await ws.close(CLOSE_POLICY, str(e)[:120])
        except WebSocketDisconnect:
            pass
        except Exception:  # a bug: log one line, drop this participant only
            log.exception("shared session: participant %s", pid)
            with contextlib.suppress(Exception):
                await ws.close(1011, "internal error")
        finally:
            p.gone = True
            p.wake.set()
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender
            self._leave(s, p)

    async def _serve(self, s: Session, p: Participant) -> None:
        """The participant's messages until it leaves; the first must be ``hello``."""
        hello = parse(await self._receive(p))
        if hello["t"] != "hello":
            raise BadMessage("the first message must be {\"t\": \"hello\", \"name\": ...}")
        p.name = hello["name"]
        old = self._resumed(s, hello.get("resume"), p.guest)
        if old is not None:  # the same page again: it takes its old place
            p.id, p.colour, p.cursor = old.id, old.colour, old.cursor
            p.state, p.state_bytes = old.state, old.state_bytes
            old.gone = True   # its sender closes the dead connection; its _leave is a no-op
            old.wake.set()
        s.participants[p.id] = p
        s.empty_since = None
        if s.leader is None and not p.guest:
            s.leader = p.id
        self._queue(p, ("welcome", 0, ""), {
            "t": "welcome", "you": p.id, "guest": p.guest, "leader": s.leader, "seq": s.seq,
            "resume": p.resume,
            "participants": [q.public() for q in s.participants.values()],
            "states": {str(q.id): dict(q.state) for q in s.participants.values() if q is not p},
            "cursors": {str(q.id): q.cursor for q in s.participants.values()
                        if q is not p and q.cursor is not None}})
        self._broadcast(s, p, ("join", p.id, ""), {"t": "join", **p.public()})
        while True:
            msg = parse(await self._receive(p))
            self._handle(s, p, msg)

    @staticmethod
    def _resumed(s: Session, key: Any, guest: bool) -> Participant | None:
        """The present participant whose ``resume`` key is ``key`` (same role), or None."""
        if not isinstance(key, str) or not key:
            return None
        found = None
        for q in s.participants.values():  # constant-time compares, every one of them
            if hmac.compare_digest(key.encode("utf-8", "replace"), q.resume.encode()):
                found = q
        return found if found is not None and found.guest == guest else None

    async def _receive(self, p: Participant) -> str:
        m = await p.ws.receive()
        if m["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(m.get("code", 1000))
        text = m.get("text")
        if text is None:
            raise BadMessage("expected a JSON text message, got binary data")
        if len(text) > MAX_MESSAGE:
            raise BadMessage(f"message larger than {MAX_MESSAGE} bytes")
        return str(text)

    def _handle(self, s: Session, p: Participant, msg: dict[str, Any]) -> None:
        t = msg["t"]
        if t == "set":
            path, value = msg["path"], msg["value"]
            size = len(json.dumps(value, separators=(",", ":")))
            # a path replaces what was kept below it
            for k in [k for k in p.state if k.startswith(path + ".")]:
                del p.state[k]
                p.state_bytes.pop(k, None)
            p.state.pop(path, None)
            p.state[path] = value
            p.state_bytes[path] = size
            if len(p.state) > MAX_PATHS or sum(p.state_bytes.values()) > MAX_STATE:
                raise BadMessage(f"view state larger than {MAX_STATE} bytes or "
                                 f"{MAX_PATHS} paths")
            seq = s.next_seq()
            self._broadcast(s, p, ("set", p.id, path),
                            {"t": "set", "from": p.id, "seq": seq, "path": path, "value": value})
        elif t == "cursor":
            p.cursor = msg["value"]
            self._broadcast(s, p, ("cursor", p.id, ""),
                            {"t": "cursor", "from": p.id, "value": p.cursor})
        elif t == "lead":
            if p.guest:
                raise BadMessage("a read-only guest cannot lead")
            self._set_leader(s, p.id)
        elif t == "handover":
            to = msg["to"]
            if s.leader != p.id:
                return  # only the leader hands over; a stale click is ignored
            q = s.participants.get(to)
            if q is not None and not q.guest:
                self._set_leader(s, to)
        elif t == "offer":
            if p.guest:
                raise BadMessage("a read-only guest cannot offer metrics or filters")
            self._broadcast(s, p, ("offer", p.id, msg["kind"]),
                            {"t": "offer", "from": p.id, "kind": msg["kind"],
                             "value": msg["value"]})
        elif t == "name":
            p.name = msg["name"]
            self._broadcast(s, None, ("join", p.id, ""), {"t": "join", **p.public()})
        # "ping": nothing to do (keeps idle proxies from closing the socket)

    def _set_leader(self, s: Session, pid: int | None) -> None:
        s.leader = pid
        self._broadcast(s, None, ("lead", 0, ""),
                        {"t": "lead", "leader": pid, "seq": s.next_seq()})

    def _leave(self, s: Session, p: Participant) -> None:
        if s.participants.get(p.id) is not p:
            return
        del s.participants[p.id]
        if not s.participants:
            s.empty_since = time.monotonic()
        self._broadcast(s, None, ("leave", p.id, ""), {"t": "leave", "id": p.id})
        if s.leader == p.id:  # the lead passes to the longest-present editor
            nxt = next((q.id for q in s.participants.values() if not q.guest), None)
            self._set_leader(s, nxt)

    def notify_threadsafe(self, db: int) -> None:
        """:meth:`notify_notes` from a worker thread (where the notes API runs)."""
        if self.loop is not None and self.sessions:
            with contextlib.suppress(RuntimeError):  # the loop closed: no session to tell
                self.loop.call_soon_threadsafe(self.notify_notes, db)

    def notify_notes(self, db: int) -> None:
        """Tell every participant of every session that the notes of database ``db``
        changed (they refetch them over HTTP)."""
        for s in self.sessions.values():
            self._broadcast(s, None, ("notes", 0, str(db)), {"t": "notes", "db": db})

    # ---- the outboxes ------------------------------------------------------------------

    def _broadcast(self, s: Session, sender: Participant | None, key: tuple[str, int, str],
                   msg: dict[str, Any]) -> None:
        for q in list(s.participants.values()):
            if q is not sender:
                self._queue(q, key, msg)

    def _queue(self, q: Participant, key: tuple[str, int, str], msg: dict[str, Any]) -> None:
        if q.gone:
            return
        q.outbox.pop(key, None)   # latest wins, and moves behind what was queued before
        q.outbox[key] = msg
        if len(q.outbox) > MAX_OUTBOX:
            q.gone = True         # hopelessly behind: treat as gone, the others go on
        q.wake.set()

    async def _sender(self, s: Session, p: Participant) -> None:
        """Writes the participant's outbox; only this task ever waits on its socket."""
        while not p.gone:
            await p.wake.wait()
            p.wake.clear()
            while p.outbox and not p.gone:
                _, msg = p.outbox.popitem(last=False)
                text = json.dumps(msg, separators=(",", ":"), ensure_ascii=False)
                try:
                    await asyncio.wait_for(p.ws.send_text(text), SEND_TIMEOUT)
                except Exception:
                    p.gone = True
        with contextlib.suppress(Exception):
            await p.ws.close(CLOSE_GOING_AWAY, "too slow or gone")


def _name(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise BadMessage("\"name\" must be a non-empty string")
    name = " ".join(v.split())
    if len(name) > MAX_NAME:
        raise BadMessage(f"\"name\" longer than {MAX_NAME} characters")
    return name


def parse(text: str) -> dict[str, Any]:
    """One client message, validated; :class:`BadMessage` says what is wrong."""
    try:
        msg = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadMessage(f"not JSON ({e.msg})") from None
    if not isinstance(msg, dict):
        raise BadMessage("expected a JSON object")
    t = msg.get("t")
    if t not in KINDS:
        raise BadMessage(f"\"t\" must be one of {', '.join(sorted(KINDS))}")
    if t in ("hello", "name"):
        msg["name"] = _name(msg.get("name"))
        resume = msg.get("resume")
        if t == "hello" and resume is not None and (not isinstance(resume, str)
                                                    or len(resume) > 64):
            raise BadMessage("\"resume\" must be the key of an earlier welcome")
    elif t == "set":
        path = msg.get("path")
        if not isinstance(path, str) or not PATH_RE.match(path):
            raise BadMessage("\"path\" must be dotted words, e.g. \"s.dbs.0.view\"")
        if "value" not in msg:
            raise BadMessage("\"set\" needs a \"value\"")
    elif t == "cursor":
        if not isinstance(msg.get("value"), dict | None):
            raise BadMessage("\"cursor\" \"value\" must be an object or null")
    elif t == "handover":
        to = msg.get("to")
        if not isinstance(to, int) or isinstance(to, bool):
            raise BadMessage("\"handover\" \"to\" must be a participant id (an integer)")
    elif t == "offer":
        if msg.get("kind") not in ("derived", "filters"):
            raise BadMessage("\"offer\" \"kind\" must be derived or filters")
        if not isinstance(msg.get("value"), list):
            raise BadMessage("\"offer\" \"value\" must be a list")
    return msg
