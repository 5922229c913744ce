"""Shared sessions, linked pop-out windows and notes in REAL browsers: Chromium driven by
Playwright, each participant in its own browser context (separate cookies and storage, as
separate people), against a real server over copies of the real databases.

Screenshots go to tests/artifacts/view/share-*.png (ignored by git).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from view_support import (
    CHROME_ARGS,
    TcpRelay,
    chromium,
    copy_database,
    database_sources,
    post_json,
    serve,
    trace_painted,
)

playwright_sync = pytest.importorskip(
    "playwright.sync_api", exc_type=ImportError,
    reason="the Python package playwright is not installed or does not import")

LOOPS = 1
ARTIFACTS = ROOT / "tests" / "artifacts" / "view"


@pytest.fixture(scope="module")
def pw() -> Iterator[Any]:
    with playwright_sync.sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def browser(pw: Any) -> Iterator[Any]:
    exe = chromium()
    try:
        b = pw.chromium.launch(executable_path=exe, args=CHROME_ARGS)
    except Exception as e:  # any launch failure is a missing capability
        pytest.skip(f"Chromium at {exe} does not start headless: {str(e).splitlines()[0]}")
    yield b
    b.close()


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    base = tmp_path_factory.mktemp("sharebrowser")
    return [copy_database(p, base) for p in database_sources()[:2]]


@pytest.fixture(scope="module")
def server(dbs: list[Path]) -> Iterator[Any]:
    with serve(dbs) as s:
        yield s


class People:
    """Browser contexts, one per participant; JavaScript errors fail the test."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self.contexts: list[Any] = []
        self.errors: list[str] = []

    def page(self, browser: Any = None) -> Any:
        ctx = (browser or self.browser).new_context(viewport={"width": 1300, "height": 820})
        self.contexts.append(ctx)
        pg = ctx.new_page()
        pg.on("pageerror", lambda e: self.errors.append(str(e)))
        pg.set_default_timeout(20000)
        return pg

    def close(self) -> None:
        for c in self.contexts:
            with contextlib.suppress(Exception):  # a context of a browser the test killed
                c.close()


@pytest.fixture
def people(browser: Any) -> Iterator[People]:
    p = People(browser)
    yield p
    p.close()
    assert not p.errors, f"JavaScript errors in the pages: {p.errors}"


def shot(pg: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / f"share-{name}.png"))


def idle(pg: Any) -> None:
    pg.wait_for_function(
        "() => document.getElementById('tree').dataset.pending === '0' && "
        "!document.querySelector('.tv-row:not([hidden]) .tv-label.loading')")


def start_session(pg: Any, base: str, name: str) -> dict[str, str]:
    """Opens the viewer on the loops database, presses Share; returns the two links."""
    pg.goto(f"{base}/?name={name}#s=%7B%22db%22%3A{LOOPS}%7D")
    pg.wait_for_selector(".tv-row")
    idle(pg)
    pg.click("#share-start")
    pg.wait_for_selector("#share-link")
    links = {"link": pg.input_value("#share-link"),
             "guest": pg.input_value("#share-guest-link")}
    pg.click("#share-links-close")
    pg.wait_for_selector(".share-person")
    return links


def join(pg: Any, link: str, name: str, count: int) -> None:
    pg.goto(f"{link}&name={name}")
    pg.wait_for_function(f"() => document.querySelectorAll('.share-person').length === {count}")
    idle(pg)


def view_of(pg: Any) -> dict[str, Any]:
    """What a follower must mirror: db, mode, view, expanded keys, selection, sort."""
    return dict(pg.evaluate("""() => { const s = window.__callpath.state;
        const d = s.dbs[s.db]; const v = d.views[d.view];
        return {db: s.db, mode: d.mode, view: d.view, exp: [...v.exp].sort(), sel: v.sel,
                sort: v.sort, order: v.order, trace: d.trace}; }"""))


def same_view(a: Any, b: Any, timeout: int = 15000) -> dict[str, Any]:
    """Waits until b shows a's view state (a's, read again each time: a may still be
    settling, e.g. while a hot path opens); returns it."""
    deadline = time.monotonic() + timeout / 1000
    while True:
        want, got = view_of(a), view_of(b)
        if want == got:
            return want
        if time.monotonic() > deadline:
            raise AssertionError(f"the follower's view {got} is not the leader's {want}")
        b.wait_for_timeout(100)


def select_second_level(pg: Any) -> str:
    """Expands the first top-level row's child and selects a row two levels down."""
    pg.click(".tv-row:not([hidden])[aria-level='2'] .tv-toggle")
    pg.wait_for_selector(".tv-row:not([hidden])[aria-level='3']")
    idle(pg)
    row = pg.locator(".tv-row:not([hidden])[aria-level='3']").first
    key = str(row.get_attribute("data-key"))
    row.click()
    pg.wait_for_function(
        "(k) => window.__callpath.state.dbs[window.__callpath.state.db]"
        ".views['top-down'].sel === k", arg=key)
    return key


def test_leader_view_reaches_follower(people: People, server: Any) -> None:
    """Expansion, selection, tab switch and trace window of the leader reach a follower,
    which also sees the leader's selection drawn in its own tree in the leader's colour."""
    a, b = people.page(), people.page()
    links = start_session(a, server.url, "Ana")
    join(b, links["link"], "Bo", 2)
    assert "lead" in b.inner_text(".share-person[data-id='1']")
    key = select_second_level(a)
    want = same_view(a, b)
    assert want["sel"] == key and want["exp"]
    idle(b)
    b.wait_for_selector(f".tv-row[data-key='{key}'][aria-selected='true']")
    # the leader's selection is drawn in the follower's tree, named and coloured
    b.wait_for_selector(f".tv-row[data-key='{key}'][data-remote='Ana']")
    colour = b.evaluate("() => document.querySelector('.share-person[data-id=\"1\"] "
                        ".share-swatch').style.background")
    tag = b.locator(f".tv-row[data-key='{key}'] .remote-tag")
    assert tag.inner_text() == "Ana"
    assert tag.evaluate("e => e.style.background") == colour
    shot(b, "follower-tree")
    # a tab switch
    a.click("#view-tabs [data-view=bottom-up]")
    idle(a)
    same_view(a, b)
    b.wait_for_selector("#view-tabs [data-view=bottom-up][aria-selected=true]")
    # the trace window: zoom in twice and pan
    a.click("#view-tabs [data-view=trace]")
    a.wait_for_function("() => document.getElementById('tr-canvas').dataset.rows === '4'")
    for button in ("#tr-zin", "#tr-zin", "#tr-right"):
        a.click(button)
    want = same_view(a, b)
    assert want["mode"] == "trace" and want["trace"]
    # the leader's frame of its final window (a fixed pause read an older frame when the
    # request was slow, and the follower, already past it, never showed that one)
    trace_painted(a)
    frame = a.get_attribute("#tr-canvas", "data-frame")
    b.wait_for_function("(f) => document.getElementById('tr-canvas').dataset.frame === f",
                        arg=frame)
    # the ruler speaks in units, the rows carry their execution contexts' names
    ticks = b.get_attribute("#tr-ruler", "data-ticks") or ""
    assert ticks and all(t.split()[-1] in ("s", "ms", "µs", "ns") for t in ticks.split("|"))
    assert len((b.get_attribute("#tr-canvas", "data-labels") or "").split(",")) == 4
    # the leader's pointer in the trace is drawn in the follower's
    box = a.locator("#tr-canvas").bounding_box()
    a.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.3)
    b.wait_for_selector(".remote-layer .remote-vline")
    shot(a, "leader-trace")
    shot(b, "follower-trace")
    # the Lines tab: its window follows, and the leader's line is marked in the follower's
    a.click("#view-tabs [data-view=lines]")
    a.wait_for_function("() => { const s = window.__callpath.state;"
                        " const l = s.dbs[s.db].lines; return l && Number.isInteger(l.row); }")
    row = a.evaluate("() => window.__callpath.state.dbs[1].lines.row")
    b.wait_for_function("(r) => { const l = window.__callpath.state.dbs[1].lines;"
                        " return window.__callpath.state.dbs[1].mode === 'lines' && l &&"
                        " l.row === r; }", arg=row)
    b.wait_for_selector(f"#lines [data-row='{row}'][data-remote='Ana']")
    shot(b, "follower-lines")


def test_explore_alone_jump_back_and_killed_participant(people: People, server: Any,
                                                        pw: Any) -> None:
    """Three people: a follower that explores alone is left alone, then jumps back to the
    leader's view; a participant whose browser is killed does not stall the others."""
    a, b, c = people.page(), people.page(), people.page()
    # the third participant runs in its own Chromium process, which the test kills
    mark = f"--callpath-victim={uuid.uuid4().hex}"
    victim = pw.chromium.launch(executable_path=chromium(), args=[*CHROME_ARGS, mark])
    d = people.page(victim)
    links = start_session(a, server.url, "Ana")
    join(b, links["link"], "Bo", 2)
    join(c, links["link"], "Cy", 3)
    join(d, links["link"], "Dee", 4)
    c.click("#share-follow")  # explore alone
    assert c.inner_text("#share-follow") == "Exploring alone"
    c.click("#view-tabs [data-view=flat]")
    idle(c)
    select_second_level(a)
    same_view(a, b)
    same_view(a, d)
    a.wait_for_timeout(500)
    assert view_of(c)["view"] == "flat"  # left alone
    # the leader offers a derived metric to all; the explorer accepts it
    a.evaluate("""() => { const s = window.__callpath.state;
        s.dbs[s.db].derived = [{name: 'twice', formula: '2*$0', format: 'scientific',
                                percent_annotation: false}];
        window.__callpath.flushUrl(); }""")
    a.click("#share-offer")
    c.click("#share-accept-derived")
    c.wait_for_function("() => window.__callpath.columns.some(k => k.name === 'twice')")
    idle(c)
    # kill the fourth participant's browser (no close handshake), then go on
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _has_arg(int(p), mark)]
    assert pids, "the victim browser's processes were not found"
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    a.click("#view-tabs [data-view=bottom-up]")
    idle(a)
    same_view(a, b, timeout=10000)  # the others go on at once
    a.wait_for_function("() => document.querySelectorAll('.share-person').length === 3")
    # jump back: the explorer takes the leader's current view once
    c.click(".share-person[data-id='1']")
    same_view(a, c)
    shot(c, "explorer-jumped")
    # take the lead: the former leader follows the new one
    c.click("#share-lead")
    a.wait_for_function("() => document.querySelector('.share-person[data-id=\"3\"]')"
                        ".textContent.includes('lead')")
    c.wait_for_function("() => !document.getElementById('share-follow')")  # a leader
    # follows no one
    c.click("#view-tabs [data-view=top-down]")
    idle(c)
    same_view(c, b)


def _has_arg(pid: int, arg: str) -> bool:
    try:
        return arg.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_popout_window_linked_both_ways(people: People, server: Any) -> None:
    a = people.page()
    a.goto(f"{server.url}/#s=%7B%22db%22%3A{LOOPS}%7D")
    a.wait_for_selector(".tv-row")
    idle(a)
    select_second_level(a)
    a.click("#view-tabs [data-view=trace]")
    a.wait_for_function("() => document.getElementById('tr-canvas').dataset.rows === '4'")
    with a.context.expect_page() as info:
        a.click("#popout-trace")
    pop = info.value
    pop.on("pageerror", lambda e: people.errors.append(str(e)))
    pop.wait_for_selector("#tr-canvas", state="attached")  # the new window has loaded
    pop.wait_for_function("() => document.getElementById('tr-canvas').dataset.rows === '4'")
    assert pop.evaluate("() => document.body.classList.contains('popout-trace')")
    # the pop-out drives the page: zoom in there
    pop.click("#tr-zin")
    pop.wait_for_timeout(200)
    want = pop.evaluate("() => window.__callpath.trace.win")
    a.wait_for_function("(w) => JSON.stringify(window.__callpath.trace.win) === "
                        "JSON.stringify(w)", arg=want)
    # ... and the page drives the pop-out: switch the page to the tree, select elsewhere
    a.click("#view-tabs [data-view=top-down]")
    idle(a)
    a.click(".tv-row:not([hidden])[aria-level='2']")
    a.click("#view-tabs [data-view=trace]")
    a.click("#tr-home")
    a.wait_for_timeout(200)
    home = a.evaluate("() => window.__callpath.trace.win")
    pop.wait_for_function("(w) => JSON.stringify(window.__callpath.trace.win) === "
                          "JSON.stringify(w)", arg=home)
    sel = a.evaluate("() => window.__callpath.state.dbs[1].views['top-down'].sel")
    pop.wait_for_function("(k) => window.__callpath.state.dbs[1].views['top-down'].sel === k",
                          arg=sel)
    # each window keeps its own pane
    assert pop.evaluate("() => window.__callpath.state.dbs[1].mode") == "trace"
    shot(pop, "popout-trace")
    # a source pop-out follows the page's selection
    a.click("#view-tabs [data-view=top-down]")
    idle(a)
    with a.context.expect_page() as info:
        a.click("#popout-source")
    src = info.value
    src.wait_for_selector("#tree", state="attached")
    src.wait_for_function("() => document.body.classList.contains('popout-source')")
    src.wait_for_function("() => getComputedStyle(document.getElementById('tree')).display "
                          "=== 'none'")  # the pop-out shows its pane alone
    for i in (1, 2, 0):  # the pop-out shows the source of the page's selection, as it moves
        a.locator(".tv-row:not([hidden])").nth(i).click()
        a.wait_for_timeout(300)
        text = a.inner_text("#src-file")
        src.wait_for_function("(t) => document.getElementById('src-file').textContent === t",
                              arg=text)
    shot(src, "popout-source")


def test_notes_shared_text_only_and_kept(people: People, dbs: list[Path], tmp_path: Path
                                         ) -> None:
    """A note made by one participant appears for the other (as text: no markup injection,
    in the panel and as a pin on the tree row); it is still there after a server restart;
    a read-only guest cannot save."""
    db = copy_database(dbs[LOOPS], tmp_path)
    evil = "<script>window.__pwned = 1</script><b>bold?</b>"
    evil_name = "<script>x()</script><b>Bo</b>"
    with serve([db]) as s:
        a, b = people.page(), people.page()
        a.goto(f"{s.url}/?name=Ana")
        a.wait_for_selector(".tv-row")
        idle(a)
        a.click("#share-start")
        a.wait_for_selector("#share-link")
        link, guest_link = a.input_value("#share-link"), a.input_value("#share-guest-link")
        a.click("#share-links-close")
        b.goto(f"{link}&name={evil_name}")
        b.wait_for_function("() => document.querySelectorAll('.share-person').length === 2")
        # the name is shown as text in the other's presence list
        a.wait_for_function("(t) => [...document.querySelectorAll('.share-name')]"
                            ".some(e => e.textContent === t)", arg=evil_name)
        assert a.evaluate("() => document.querySelectorAll('#share-bar b, #share-bar script')"
                          ".length") == 0
        idle(b)
        key = select_second_level(a)
        a.click("#notes-toggle")
        a.wait_for_selector("#note-anchor")
        a.select_option("#note-anchor", label=a.evaluate(
            "() => [...document.querySelectorAll('#note-anchor option')]"
            ".map(o => o.textContent).find(t => t.startsWith('top-down'))"))
        a.fill("#note-author", "Ana")
        a.fill("#note-text", evil)
        a.click("#note-add")
        # the other participant hears of it: pin on the row, text in the panel
        b.wait_for_selector(f".tv-row[data-key='{key}'] .note-pin")
        b.click("#notes-toggle")
        b.wait_for_selector("#notes-list .note-text")
        assert b.inner_text("#notes-list .note-text") == evil
        assert b.evaluate("() => window.__pwned === undefined && "
                          "document.querySelectorAll('#notes-panel b, #notes-panel script')"
                          ".length === 0")
        shot(b, "note")
        # a note on a trace interval: a band over that interval in the follower's trace
        a.click("#view-tabs [data-view=trace]")
        a.wait_for_function("() => document.getElementById('tr-canvas').dataset.rows === '4'")
        a.click("#tr-zin")
        a.click("#notes-toggle")
        a.click("#notes-toggle")  # reopened: the anchors of the trace view
        a.select_option("#note-anchor", label=a.evaluate(
            "() => [...document.querySelectorAll('#note-anchor option')]"
            ".map(o => o.textContent).find(t => t.startsWith('trace interval'))"))
        a.fill("#note-text", "the middle of the run")
        a.click("#note-add")
        b.wait_for_function("() => document.getElementById('tr-canvas').dataset.rows === '4'")
        band = b.locator(".note-layer .note-band")
        band.wait_for()
        assert "the middle of the run" in band.inner_text()
        shot(b, "note-trace")
        # a note on the line selected in the Lines tab: marked in the follower's Lines tab
        a.click("#view-tabs [data-view=lines]")
        a.wait_for_selector("#lines .ln-srow.sel")
        a.click("#notes-toggle")
        a.click("#notes-toggle")
        label = a.evaluate("() => [...document.querySelectorAll('#note-anchor option')]"
                           ".map(o => o.textContent).find(t => /:\\d+$/.test(t))")
        assert label, "the Lines tab offers its selected line as an anchor"
        a.select_option("#note-anchor", label=label)
        a.fill("#note-text", "hot line")
        a.click("#note-add")
        b.wait_for_selector("#lines .ln-srow.sel.noted")
        shot(b, "note-lines")
        a.click("#view-tabs [data-view=top-down]")  # the trace would refetch as the page
        same_view(a, b)                             # reflows once the server is gone
        # a read-only guest: sees the note, cannot add one, the server refuses its save
        g = people.page()
        g.goto(guest_link)
        g.wait_for_function("() => document.querySelectorAll('.share-person').length === 3")
        g.click("#notes-toggle")
        g.wait_for_selector("#notes-list .note-text")
        assert g.is_disabled("#note-add")
        assert g.locator("#share-lead").count() == 0
        status = g.evaluate("""async () => (await fetch('/api/db/0/notes/save', {
            method: 'POST', headers: {'Content-Type': 'application/json'},
            body: JSON.stringify({author: 'g', text: 'x',
                                  anchor: {kind: 'line', file: 'a.c', line: 1}})})).status""")
        assert status == 403
        derived = g.evaluate("""async () => (await fetch('/api/db/0/derived/save', {
            method: 'POST', headers: {'Content-Type': 'application/json'},
            body: '[]'})).status""")
        assert derived == 403
        same_view(a, g)  # a guest follows like anyone
        g.wait_for_selector(".tv-row:not([hidden])")
        idle(g)
        shot(g, "guest")
        # only the leader's page stays for the stop (the others would reflow as their
        # presence bars empty, and fetch rows from a server that is gone)
        b.context.close()
        g.context.close()
    # the server stopped: the session ended, the note did not
    a.wait_for_selector(".share-ended")
    with serve([db]) as s2:
        c = people.page()
        c.goto(f"{s2.url}/")
        c.wait_for_selector(".tv-row")
        c.click("#notes-toggle")
        c.wait_for_selector("#notes-list .note-text")
        assert c.inner_text("#notes-list .note-text") == evil
        assert "Ana" in c.inner_text("#notes-list .note-meta")


def test_notes_follow_the_database_on_screen(people: People, dbs: list[Path], tmp_path: Path
                                             ) -> None:
    """The notes drawn are those of the database on screen, loaded once each time another
    database comes on screen (the store's "view:shown"; nothing polls): a tab click shows the
    other database's note on its row, the way back removes it, a link that opens on that
    database shows it from the start."""
    copies = [copy_database(p, tmp_path) for p in dbs]
    anchor = {"kind": "node", "view": "top-down", "key": "r", "label": "<program root>"}
    with serve(copies) as s:
        code, note = post_json(s.url, f"/api/db/{LOOPS}/notes/save",
                               {"author": "Ana", "text": "slow here", "anchor": anchor})
        assert code == 200, note
        pg = people.page()
        loads: list[str] = []
        pg.on("request", lambda r: loads.append(urllib.parse.urlsplit(r.url).path)
              if r.url.split("?")[0].endswith("/notes") else None)
        count = "(n) => document.getElementById('notes-toggle').textContent === `✎ Notes (${n})`"
        pg.goto(f"{s.url}/#s=%7B%22db%22%3A0%7D")
        pg.wait_for_selector(".tv-row")
        idle(pg)
        pg.wait_for_function(count, arg=0)
        assert pg.locator(".note-pin").count() == 0
        pg.click(f"#db-tabs [data-db='{LOOPS}']")
        pg.wait_for_function(count, arg=1)
        pg.wait_for_selector(".tv-row[data-key='r'] .note-pin")
        assert pg.get_attribute(".tv-row[data-key='r'] .note-pin", "title") == "Ana: slow here"
        pg.click("#db-tabs [data-db='0']")
        pg.wait_for_function(count, arg=0)
        idle(pg)
        assert pg.locator(".note-pin").count() == 0
        assert loads == ["/api/db/0/notes", f"/api/db/{LOOPS}/notes", "/api/db/0/notes"]
        other = people.page()
        other.goto(f"{s.url}/#s=%7B%22db%22%3A{LOOPS}%7D")
        other.wait_for_function(count, arg=1)
        other.wait_for_selector(".tv-row[data-key='r'] .note-pin")


def test_trace_ruler_labels_sharp_on_hidpi(people: People, browser: Any, server: Any) -> None:
    """On a screen of pixel density 2 the trace canvases have twice the backing pixels of
    their CSS size; the ruler's ticks are in units and increase; every row is labelled."""
    ctx = browser.new_context(viewport={"width": 1100, "height": 700}, device_scale_factor=2)
    people.contexts.append(ctx)
    pg = ctx.new_page()
    pg.on("pageerror", lambda e: people.errors.append(str(e)))
    pg.goto(f"{server.url}/#s=%7B%22db%22%3A{LOOPS}%7D")
    pg.wait_for_selector(".tv-row")
    pg.click("#view-tabs [data-view=trace]")
    pg.wait_for_function("() => document.getElementById('tr-canvas').dataset.rows === '4'")
    for cid in ("tr-canvas", "tr-ruler", "tr-summary"):  # the summary paints a moment later
        pg.wait_for_function(f"() => {{ const c = document.getElementById('{cid}');"
                             " return c.clientWidth > 0 && c.width === 2 * c.clientWidth; }")
    ticks = (pg.get_attribute("#tr-ruler", "data-ticks") or "").split("|")
    assert len(ticks) >= 3
    units = {t.split()[1] for t in ticks}
    assert len(units) == 1 and units <= {"s", "ms", "µs", "ns"}
    values = [float(t.split()[0]) for t in ticks]
    assert values == sorted(values) and len(set(values)) == len(values)
    labels = (pg.get_attribute("#tr-canvas", "data-labels") or "").split(",")
    assert sorted(labels) == ["0", "1", "2", "3"]
    for _ in range(6):  # deep zoom: the ruler changes unit
        pg.click("#tr-zin")
    trace_painted(pg)  # the ruler is drawn with the frame of the final window
    deep = (pg.get_attribute("#tr-ruler", "data-ticks") or "").split("|")
    scale = {"s": 1e9, "ms": 1e6, "µs": 1e3, "ns": 1.0}
    ns = [float(t.split()[0]) * scale[t.split()[1]] for t in deep]
    win = pg.evaluate("() => { const t = window.__callpath.trace;"
                      " return [t.win.t0 - t.meta.t0, t.win.t1 - t.meta.t0]; }")
    step = ns[1] - ns[0]
    # the ticks lie inside the window, evenly, and cover it (the ruler follows the zoom)
    assert win[0] - 1 <= ns[0] and ns[-1] <= win[1] + 1
    assert all(abs((b - a) - step) < 1e-6 * step + 1 for a, b in itertools.pairwise(ns))
    assert step * (len(ns) + 1) >= win[1] - win[0] >= step * (len(ns) - 1)
    shot(pg, "trace-hidpi")


def test_scroll_position_follows(people: People, browser: Any, server: Any) -> None:
    """The tree's scroll position (in rows) is part of what a follower mirrors."""
    a = people.page()
    a.set_viewport_size({"width": 1000, "height": 520})
    links = start_session(a, server.url, "Ana")
    b = people.page()
    b.set_viewport_size({"width": 1000, "height": 520})
    join(b, links["link"], "Bo", 2)
    a.click(".tv-row:not([hidden])[aria-level='1']")
    a.click("#tb-hot")  # open the hot path: more rows than the pane shows
    idle(a)
    a.wait_for_function("() => { const s = window.__callpath.tree.scroller;"
                        " return s.scrollHeight > s.clientHeight + 60; }")
    same_view(a, b)
    idle(b)
    a.evaluate("() => { const t = window.__callpath.tree;"
               " t.scroller.scrollTop = 2 * t.rowHeight; }")
    b.wait_for_function("() => { const t = window.__callpath.tree;"
                        " return Math.round(t.scroller.scrollTop / t.rowHeight) === 2; }")


# ---- reconnecting after a dropped connection --------------------------------------------

WATCH_BAR = """() => { window.__barLog = []; const b = document.getElementById('share-bar');
    new MutationObserver(() => { const t = b.textContent;
        if (window.__barLog[window.__barLog.length - 1] !== t) window.__barLog.push(t); })
      .observe(b, {childList: true, subtree: true, characterData: true}); }"""


def via(link: str, port: int) -> str:
    """The same link through another port of the same host (the relay's)."""
    u = urllib.parse.urlsplit(link)
    return urllib.parse.urlunsplit(u._replace(netloc=f"{u.hostname}:{port}"))


def bar_log(pg: Any) -> list[str]:
    return list(pg.evaluate("() => window.__barLog"))


def people_of(pg: Any) -> list[tuple[int, str]]:
    """The presence list as this page shows it: (id, name) per entry, in order."""
    return [(int(i), str(n)) for i, n in pg.evaluate(
        "() => [...document.querySelectorAll('.share-person')]"
        ".map(e => [e.dataset.id, e.querySelector('.share-name').textContent])")]


def test_follower_reconnects_after_connection_drop(people: People, server: Any) -> None:
    """A follower whose connections are reset (through a relay standing for its network)
    says it is reconnecting, retries with backoff while the network stays down, rejoins by
    itself as one participant, catches up with what the leader did meanwhile and follows
    on; the leader is not disturbed, and the old connection's cursor is gone from its page."""
    a, b = people.page(), people.page()
    links = start_session(a, server.url, "Ana")
    with TcpRelay(server.port) as relay:
        join(b, via(links["link"], relay.port), "Bo", 2)
        assert relay.accepted > 0  # the follower's page and socket do go through the relay
        key = select_second_level(a)
        same_view(a, b)
        a.wait_for_selector(f".tv-row[data-key='{key}'][data-remote='Bo']")
        for pg in (a, b):
            pg.evaluate(WATCH_BAR)
        before = relay.accepted
        relay.refusing = True  # the network stays down for the first retry
        relay.drop()
        b.wait_for_function("() => window.__barLog.some(t => t.includes('try 2 of 5'))")
        shot(b, "reconnecting")
        # the server saw the drop: the leader sees the follower leave, and stays leader
        a.wait_for_function("() => document.querySelectorAll('.share-person').length === 1")
        # the leader works on while the follower is away: another tab, another selection
        a.click("#view-tabs [data-view=bottom-up]")
        idle(a)
        a.locator(".tv-row:not([hidden])").nth(1).click()
        idle(a)
        relay.refusing = False
        b.wait_for_function("() => document.querySelectorAll('.share-person').length === 2")
        a.wait_for_function("() => document.querySelectorAll('.share-person').length === 2")
        assert relay.accepted > before + 1  # the refused retry, then the one that got in
        log = bar_log(b)
        tries = [t for t in log if t.startswith("reconnecting")]
        assert tries[:2] == ["reconnecting (try 1 of 5)…", "reconnecting (try 2 of 5)…"], log
        assert not any("ended" in t for t in log), log
        # one participant each: the follower came back under a new id, the old one is gone
        me = b.evaluate("() => window.__callpathShare.S.me")
        assert me not in (1, 2)
        assert people_of(a) == [(1, "Ana"), (me, "Bo")]
        assert people_of(b) == [(1, "Ana"), (me, "Bo")]
        assert "lead" in b.inner_text(".share-person[data-id='1']")
        # still following: it caught up with the leader's change made while it was away
        assert b.inner_text("#share-follow") == "Following"
        assert b.get_attribute("#share-follow", "aria-pressed") == "true"
        want = same_view(a, b)
        assert want["view"] == "bottom-up"
        idle(b)
        shot(b, "reconnected")
        # ... and it follows on: the leader goes back, collapses the node it had opened,
        # opens it again and selects a row in it
        a.click("#view-tabs [data-view=top-down]")
        idle(a)
        toggle = ".tv-row:not([hidden])[aria-level='2'] .tv-toggle"
        a.click(toggle)
        a.wait_for_selector(".tv-row:not([hidden])[aria-level='3']", state="detached")
        idle(a)
        assert same_view(a, b)["exp"] == []
        a.click(toggle)
        a.wait_for_selector(".tv-row:not([hidden])[aria-level='3']")
        idle(a)
        row = a.locator(".tv-row:not([hidden])[aria-level='3']").last
        key2 = str(row.get_attribute("data-key"))
        row.click()
        want = same_view(a, b)
        assert want["sel"] == key2 and want["exp"]
        idle(b)
        b.wait_for_selector(f".tv-row[data-key='{key2}'][aria-selected='true']")
        # the leader's page: the follower's cursor under its new id only (the dropped
        # connection's is gone), and its own connection never went away
        a.wait_for_selector(f".tv-row[data-key='{key2}'][data-remote='Bo']")
        assert a.evaluate("() => [...window.__callpathShare.S.cursors.keys()]") == [me]
        assert a.evaluate("() => document.querySelectorAll('.tv-row[data-remote]').length") == 1
        assert a.evaluate("() => [window.__callpathShare.S.me, "
                          "window.__callpathShare.S.leader]") == [1, 1]
        assert not any("reconnecting" in t or "ended" in t for t in bar_log(a)), bar_log(a)
        shot(a, "leader-after-reconnect")


def test_rejoin_while_server_still_holds_old_connection(people: People, server: Any) -> None:
    """The follower's side of its connections is reset but the server's side stays open (a
    laptop that slept, a changed network: the server hears nothing until its ping times
    out, 20 to 40 s later). The follower rejoins at once as the SAME participant (id,
    colour): no second "Bo" in anyone's presence list, no second cursor; it follows on."""
    a, b = people.page(), people.page()
    links = start_session(a, server.url, "Ana")
    with TcpRelay(server.port) as relay:
        join(b, via(links["link"], relay.port), "Bo", 2)
        key = select_second_level(a)
        same_view(a, b)
        a.wait_for_selector(f".tv-row[data-key='{key}'][data-remote='Bo']")
        idle(b)
        colour = a.evaluate("() => window.__callpathShare.S.people.get(2).colour")
        for pg in (a, b):
            pg.evaluate(WATCH_BAR)
        relay.drop(server_notices=False)
        b.wait_for_function("() => window.__barLog.some(t => t.includes('try 1 of 5'))")
        b.wait_for_function("() => window.__callpathShare.S.me !== null && "
                            "document.querySelectorAll('.share-person').length >= 2")
        a.click(".tv-row:not([hidden])[aria-level='2']")  # another selection: it follows on
        assert same_view(a, b)["sel"] != key
        # the pages have heard everything the hub sent in the meantime once the follower's
        # cursor for the new selection has reached the leader
        sel = view_of(a)["sel"]
        a.wait_for_selector(f".tv-row[data-key='{sel}'][data-remote='Bo']")
        assert people_of(b) == [(1, "Ana"), (2, "Bo")]
        assert people_of(a) == [(1, "Ana"), (2, "Bo")]
        assert a.evaluate("() => window.__callpathShare.S.people.get(2).colour") == colour
        assert a.evaluate("() => [...window.__callpathShare.S.cursors.keys()]") == [2]
        assert a.evaluate("() => document.querySelectorAll('.tv-row[data-remote]').length") == 1
        assert b.inner_text("#share-follow") == "Following"
        assert not any("reconnecting" in t or "ended" in t for t in bar_log(a)), bar_log(a)
        shot(a, "leader-after-rejoin")


def test_follower_gives_up_when_server_stopped(people: People, dbs: list[Path],
                                               tmp_path: Path) -> None:
    """The follower's network goes silent, the server stops behind it, then the follower's
    connections are reset: it tries five times with growing pauses (1+2+4+8+16 s), then
    says the session ended. The leader, connected directly, is told at once."""
    db = copy_database(dbs[LOOPS], tmp_path)
    a, b = people.page(), people.page()
    relay: TcpRelay | None = None
    try:
        with serve([db]) as s:
            relay = TcpRelay(s.port)
            links = start_session(a, s.url, "Ana")
            join(b, via(links["link"], relay.port), "Bo", 2)
            b.evaluate(WATCH_BAR)
            relay.hold()  # the server's goodbye will not reach the follower
        # the server stopped; the leader, connected directly, is told at once
        a.wait_for_selector(".share-ended")
        relay.drop()  # the follower's connections are reset; its retries find no server
        t0 = time.monotonic()
        b.wait_for_selector(".share-ended", timeout=60000)
        waited = time.monotonic() - t0
    finally:
        if relay is not None:
            relay.close()
    assert b.inner_text(".share-ended") == "Session ended: the shared session ended"
    tries = [t for t in bar_log(b) if t.startswith("reconnecting")]
    assert tries == [f"reconnecting (try {k} of 5)…" for k in range(1, 6)], bar_log(b)
    assert waited > 25, f"gave up after {waited:.1f} s: the backoff is 1+2+4+8+16 s"
    shot(b, "gave-up")
