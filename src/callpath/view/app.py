"""The ASGI application: routes, the token and host checks, static files, and the mapping
of errors to HTTP statuses (400 for a request the user can fix, 404 for what does not
exist, 500 with one logged line for a bug — never a traceback to the client)."""

from __future__ import annotations

import gzip
import json
import logging
import mimetypes
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import anyio.to_thread
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from callpath.engine.database import Database
from callpath.errors import CallpathError, NotFound
from callpath.view import api, compare_api, flame_api, lines_api, notes_api, security, traces_api
from callpath.view.share import GUEST_COOKIE, ShareHub

log = logging.getLogger("callpath.view")

STATIC_DIR = Path(__file__).resolve().parent / "static"
MAX_BODY = 1 << 20
GZIP_MIN = 64 << 10  # compress responses at least this large

#: A handler of one database (``/api/db/{db}/...``): run with the database's lock held.
Handler = Callable[[Database, api.Params, bytes], Any]
#: A handler of the server (``/api/...``): the list of databases, the saved filters, Compare.
ServerHandler = Callable[[api.Params, bytes], Any]


@dataclass(frozen=True)
class ApiRoute:
    """One route of the JSON API: every one is registered the same way (:meth:`ViewerApp.
    _endpoint`: body size check, parameters, a worker thread, errors to statuses)."""

    path: str  # below /api/db/{db}/ for a database's handler, below /api/ for the server's
    handler: Handler | ServerHandler
    methods: tuple[str, ...] = ("GET",)
    per_db: bool = True
    csv: bool = False  # the answer is CSV text, not JSON
    no_guests: str | None = None  # refused to read-only guests, with this message

    @property
    def url(self) -> str:
        return f"/api/db/{{db}}/{self.path}" if self.per_db else f"/api/{self.path}"


def api_routes(dbs: list[Database], notes_changed: Callable[[int], None]) -> list[ApiRoute]:
    """Every route of the JSON API (see docs/view.md, "API"), in one table."""
    note_gets, note_posts = notes_api.handlers(notes_changed)
    gets: dict[str, Handler] = {
        "columns": api.columns, "children": api.children, "hotpath": api.hotpath,
        "find": api.find_nodes, "source": api.source, "contexts": api.contexts,
        "plot": api.plot, "path": api.node_path,
        "trace/meta": traces_api.meta, "trace/frame": traces_api.frame,
        "trace/depth": traces_api.depth, "trace/callpath": traces_api.callpath,
        "trace/summary": traces_api.summary, "trace/stats": traces_api.stats,
        **lines_api.GETS,  # the Lines tab (view/lines_api.py)
        **flame_api.GETS,  # flame graph and icicle (view/flame_api.py)
        **note_gets,
    }
    posts: dict[str, Handler] = {"derived/check": api.derived_check,
                                 "derived/save": api.derived_save, **note_posts}
    return [
        ApiRoute("databases", lambda params, body: api.databases(dbs), per_db=False),
        ApiRoute("filters", lambda params, body: api.saved_filters(), per_db=False),
        # two open databases compared: a new database in the list
        ApiRoute("compare", compare_api.handler(dbs), ("POST",), per_db=False,
                 no_guests="read-only guest link: comparing databases opens a new one, "
                 "which guests may not"),
        *(ApiRoute(name, fn) for name, fn in gets.items()),
        ApiRoute("csv", api.csv_text, ("GET", "POST"), csv=True),
        *(ApiRoute(name, fn, ("POST",)) for name, fn in posts.items()),
    ]


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message.replace("\n", " ")}, status_code=status)


class Guard:
    """Host check on loopback binds, token check on other binds (see :mod:`security`)."""

    def __init__(self, app: ASGIApp, token: str | None, loopback: bool,
                 guest_ok: Callable[[str | None], bool] | None = None) -> None:
        self.app = app
        self.token = token
        self.loopback = loopback
        self.guest_ok = guest_ok  # a shared session's read-only key (see view/share.py)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        guest = self.guest_ok is not None and self.guest_ok(
            request.query_params.get("guest") or request.cookies.get(GUEST_COOKIE))
        scope["callpath_guest"] = guest
        if guest and scope["method"] == "POST" and scope["path"].endswith(("/save", "/delete")):
            await error(403, "read-only guest link: saving is not allowed")(scope, receive, send)
            return
        if self.loopback:
            host = security.host_of(request.headers.get("host", ""))
            if host not in security.LOOPBACK_HOSTS and not security.is_loopback(host):
                await error(403, f"host {host[:60]!r} refused: this server answers "
                            "only to localhost")(scope, receive, send)
                return
        if self.token is not None:
            given = (request.headers.get(security.TOKEN_HEADER)
                     or request.query_params.get("token")
                     or request.cookies.get(security.TOKEN_COOKIE))
            if not security.token_matches(given, self.token) and not guest:
                await error(403, "access token missing or wrong: open the URL with "
                            "?token=... that 'callpath view' printed")(scope, receive, send)
                return
        if scope["method"] == "POST":
            ctype = request.headers.get("content-type", "").split(";")[0].strip()
            origin = request.headers.get("origin")
            own = f"{scope.get('scheme', 'http')}://{request.headers.get('host', '')}"
            if ctype != "application/json":
                await error(415, "POST body: expected Content-Type application/json")(
                    scope, receive, send)
                return
            if origin is not None and origin != own:
                await error(403, f"origin {origin[:60]!r} refused: only the viewer's own "
                            "pages may change anything")(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ViewerApp:
    """Routes over a list of opened databases."""

    def __init__(self, dbs: list[Database], token: str | None = None, loopback: bool = True,
                 static_dir: Path = STATIC_DIR) -> None:
        self.dbs = dbs
        self.token = token
        self.static_dir = static_dir
        self.share = ShareHub(token, loopback)
        routes: list[BaseRoute] = [
            Route("/", self.index),
            Route("/static/{path:path}", self.static),
            # the share hub's own: it runs on the event loop (sessions, WebSockets)
            Route("/api/share/start", self.share.start_endpoint, methods=["POST"]),
            WebSocketRoute("/api/share/ws", self.share.ws_endpoint),
        ]
        routes += [Route(r.url, self._endpoint(r), methods=list(r.methods))
                   for r in api_routes(self.dbs, self.share.notify_threadsafe)]
        self.app = Starlette(routes=routes, middleware=[
            Middleware(Guard, token=token, loopback=loopback,
                       guest_ok=self.share.is_guest_key)],
            exception_handlers={404: _http_error, 405: _http_error})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    # ---- static files ------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        page = self.static_dir / "index.html"
        if not page.is_file():
            return error(404, f"{page}: the viewer's front end is not installed (the API "
                         "under /api/ works)")
        resp: Response = FileResponse(page, media_type="text/html",
                                      headers={"Cache-Control": "no-store"})
        token = request.query_params.get("token")
        if self.token is not None and token:
            resp.set_cookie(security.TOKEN_COOKIE, token, httponly=True, samesite="strict")
        guest = request.query_params.get("guest")
        if guest and self.share.is_guest_key(guest):
            resp.set_cookie(GUEST_COOKIE, guest, httponly=True, samesite="strict")
        elif token or request.query_params.get("session"):
            resp.delete_cookie(GUEST_COOKIE)
        return resp

    async def static(self, request: Request) -> Response:
        rel = request.path_params["path"]
        f = security.static_file(self.static_dir, request.scope.get("raw_path", b""), rel)
        if f is None:
            return error(404, f"static file {quote(rel)[:80]!r}: not found")
        ctype = mimetypes.guess_type(f.name)[0] or "application/octet-stream"
        if f.suffix in (".js", ".mjs"):
            ctype = "text/javascript"
        return FileResponse(f, media_type=ctype, headers={"Cache-Control": "no-cache"})

    # ---- API ----------------------------------------------------------------------------

    def _db(self, request: Request) -> Database:
        text = request.path_params["db"]
        if not text.isdigit() or int(text) >= len(self.dbs):
            raise NotFound(f"database {text[:20]!r}: expected an id 0..{len(self.dbs) - 1}")
        return self.dbs[int(text)]

    def _endpoint(self, route: ApiRoute) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if route.no_guests is not None and request.scope.get("callpath_guest"):
                return error(403, route.no_guests)
            body = b""
            if request.method == "POST":
                body = await request.body()
                if len(body) > MAX_BODY:
                    return error(413, f"request body larger than {MAX_BODY} bytes")
            params = dict(request.query_params)
            params.pop("token", None)

            def work() -> Any:
                if not route.per_db:
                    return cast(ServerHandler, route.handler)(params, body)
                db = self._db(request)
                with db.lock:
                    return cast(Handler, route.handler)(db, params, body)
            return await self._run(work, gzip_ok=_accepts_gzip(request), csv=route.csv)
        return endpoint

    async def _run(self, work: Callable[[], Any], gzip_ok: bool = False, csv: bool = False
                   ) -> Response:
        """Run ``work`` in a worker thread and encode its result there too (a trace frame
        is megabytes of JSON: neither encoding nor compressing it may block the event
        loop)."""
        try:
            return await anyio.to_thread.run_sync(partial(_encode, work, gzip_ok, csv))
        except NotFound as e:
            return error(404, str(e))
        except CallpathError as e:
            return error(400, str(e))
        except Exception as e:  # a bug: one logged line, never a traceback to the client
            log.exception("internal error")
            return error(500, f"internal error ({type(e).__name__}): see the server's log")


def _accepts_gzip(request: Request) -> bool:
    return "gzip" in request.headers.get("accept-encoding", "").lower()


def _encode(work: Callable[[], Any], gzip_ok: bool, csv: bool) -> Response:
    """The handler's result as a response: JSON (or CSV text), gzip-compressed when large
    and the client accepts it. Through an SSH tunnel a 1,500 x 1,000 trace frame is 8 MB of
    base64 but about 0.35 MB compressed (level 3: ~40 ms)."""
    payload = work()
    headers: dict[str, str] = {}
    if csv:
        data = str(payload).encode("utf-8")
        media = "text/csv; charset=utf-8"
        headers["Content-Disposition"] = 'attachment; filename="callpath-view.csv"'
    else:
        data = json.dumps(payload, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode("utf-8")
        media = "application/json"
    if gzip_ok and len(data) >= GZIP_MIN:
        data = gzip.compress(data, compresslevel=3, mtime=0)
        headers["Content-Encoding"] = "gzip"
    headers["Vary"] = "Accept-Encoding"
    return Response(data, media_type=media, headers=headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 (no such route, wrong method) in the API's JSON shape."""
    status = int(getattr(exc, "status_code", 404))
    what = "no such page" if status == 404 else f"method {request.method} not allowed"
    return error(status, f"{quote(request.url.path)[:80]}: {what}")


def make_app(dbs: list[Database], token: str | None = None, loopback: bool = True,
             static_dir: Path = STATIC_DIR) -> ViewerApp:
    return ViewerApp(dbs, token, loopback, static_dir)
