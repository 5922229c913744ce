"""The viewer as a user sees it: Chromium driven by Playwright against a REAL server over
real databases, checking what a person checks by looking, not only what the DOM holds.

Each kind of database is opened (HPCToolkit's native small.d and the 4-thread loops run,
a comparison of two databases, an MPI+OpenMP database with 136 execution contexts written
with the model API, HPCToolkit's CUDA run with a GPU stream) and every tab is screenshotted
into ``out/screenshots/`` (git-ignored; CI keeps it as an artifact). On every screen the
checks are the ones a person makes:

* the selected row lies inside the rows in view after every jump (Find, Lines -> Top-down,
  a flame graph click, the trace's "Show in Top-down"), with its path open;
* no label of a visible row is cut without a tooltip holding the whole of it;
* no text of the table's header overlaps another;
* tick labels of graphs are round numbers;
* no console error, no failed request.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import test_view_browser as tvb
from conftest import ROOT, run_cli, shared_path
from lines_support import lines_experiment
from test_view_browser import idle
from view_support import CHROME_ARGS, chromium, copy_database, serve, trace_painted

SHOTS = ROOT / "out" / "screenshots"

playwright_sync = pytest.importorskip(
    "playwright.sync_api", exc_type=ImportError,
    reason="the Python package playwright is not installed or does not import")

browser = tvb.browser


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh 1400x900 page that records console errors and failed requests: a test fails
    on any of them (what a user would see as a broken pane or a red line in the console)."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = ctx.new_page()
    problems: list[str] = []
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    pg.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
          if m.type == "error" else None)
    pg.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} {r.failure}")
          if "/ws" not in r.url else None)
    pg.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}")
          if r.status >= 400 else None)
    pg.set_default_timeout(20000)
    pg.problems = problems
    yield pg
    ctx.close()
    assert not problems, problems


# ---- the databases ---------------------------------------------------------------------

SMALL, LOOPS, GPU, MPI = 0, 1, 2, 3
RANKS, THREADS = 34, 4


def mpi_database(dst: Path) -> Path:
    """An MPI+OpenMP-shaped database: 34 ranks x 4 threads = 136 contexts (RANK r THREAD t),
    one source file of 60 lines in three procedures, costs varying by context."""
    rng = np.random.default_rng(7)
    n_lines, n_ctx = 180, RANKS * THREADS
    ticks = np.zeros((n_lines, n_ctx))
    for a, b in ((3, 58), (62, 118), (122, 178)):
        # later lines cost less: their scopes sort to the end of ~50 siblings in the tree
        weight = np.linspace(2.0, 0.2, b - a)[:, None]
        ticks[a:b] = np.round(rng.integers(1, 40, size=(b - a, n_ctx)) * weight)
    exp = lines_experiment(str(dst / "lulesh.cc"), ticks,
                           [("CalcVolumeForceForElems", 2, 60),
                            ("IntegrateStressForElems", 61, 120),
                            ("CalcHourglassControlForElems", 121, 179)],
                           rank_ids=True, threads_per_rank=THREADS)
    from callpath.formats.v4.writer import write_v4

    out = dst / "lulesh-like.d"
    write_v4(exp, out)
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    base = tmp_path_factory.mktemp("lookdbs")
    paths = [copy_database(shared_path("hpctoolkit", "dbase", name), base)
             for name in ("small.d", "loops-cputime-t.d", "loops-cuda-nvidia-t.d")]
    paths.append(mpi_database(base))
    with serve(paths) as s:
        yield s


# ---- what a person checks --------------------------------------------------------------


def url(base: str, db: int, **dbstate: Any) -> str:
    state = {"db": db, "dbs": {str(db): {"view": "top-down", **dbstate}}, "filters": []}
    return f"{base}/#s={urllib.parse.quote(json.dumps(state))}"


def open_tree(pg: Any, base: str, db: int, **dbstate: Any) -> None:
    pg.goto(url(base, db, **dbstate))
    pg.wait_for_selector(".tv-row")
    idle(pg)


def shot(pg: Any, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    pg.screenshot(path=str(path))
    return path


def selection_in_view(pg: Any) -> dict[str, Any]:
    """Where the selected row is drawn against the rows in view (under the sticky header,
    above the scroller's bottom edge), and whether every ancestor of it is open."""
    info: dict[str, Any] = pg.evaluate("""() => {
        const t = window.__callpath.tree, s = t.selected;
        const sc = t.scroller.getBoundingClientRect();
        const top = t.head.getBoundingClientRect().bottom;
        const bottom = sc.top + t.scroller.clientHeight;
        const r = document.querySelector('.tv-row.selected:not([hidden])');
        let open = !!s;
        for (let e = s && s.parent; e; e = e.parent) open = open && !!e.kids;
        if (!r) return {drawn: false, open, key: s && s.row ? s.row.key : null};
        const b = r.getBoundingClientRect();
        return {drawn: true, open, top: b.top, bottom: b.bottom, view_top: top,
                view_bottom: bottom, inside: b.top >= top - 1 && b.bottom <= bottom + 1,
                key: s.row.key};
    }""")
    return info


def assert_selection_in_view(pg: Any, what: str) -> None:
    idle(pg)
    pg.wait_for_timeout(100)
    info = selection_in_view(pg)
    assert info["drawn"] and info["inside"], f"{what}: selection out of view: {info}"
    assert info["open"], f"{what}: the selection's path is not open: {info}"


def cut_labels(pg: Any) -> list[str]:
    """Labels and cells of visible rows whose text is cut (ellipsis) with no tooltip holding
    the whole text, in the tree and the Lines tab."""
    cut: list[str] = pg.evaluate("""() => {
        const out = [];
        const els = document.querySelectorAll(
            '.tv-row:not([hidden]) .tv-label, .tv-hcell .tv-hname, #lines:not([hidden]) td, '
            + '#lines:not([hidden]) th, #lines:not([hidden]) .ln-tx');
        for (const e of els) {
            if (e.offsetParent === null || e.scrollWidth <= e.clientWidth + 1) continue;
            const text = e.textContent.trim();
            const tip = (e.title || (e.closest('[title]') || {}).title || '');
            if (!tip.includes(text)) out.push(text);
        }
        return out;
    }""")
    return cut


def overlapping_headers(pg: Any) -> list[tuple[str, str]]:
    """Pairs of header texts of the tree whose drawn text boxes overlap (a Range per text
    node: the box of the glyphs, not of the element)."""
    pairs: list[tuple[str, str]] = pg.evaluate("""() => {
        const boxes = [];
        for (const e of document.querySelectorAll('.tv-head .tv-hname, .tv-head .tv-agg')) {
            if (!e.textContent.trim()) continue;
            const rg = document.createRange(); rg.selectNodeContents(e);
            for (const b of rg.getClientRects()) boxes.push([e.textContent, b]);
        }
        const out = [];
        for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
            const [ta, a] = boxes[i], [tb, b] = boxes[j];
            if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 &&
                b.top < a.bottom - 1) out.push([ta, tb]);
        }
        return out;
    }""")
    return pairs


def looks_right(pg: Any, what: str) -> None:
    assert not cut_labels(pg), f"{what}: labels cut without a tooltip: {cut_labels(pg)[:5]}"
    assert not overlapping_headers(pg), f"{what}: header texts overlap: {overlapping_headers(pg)}"


def round_tick(text: str) -> bool:
    """A tick label is round: a mantissa of 1, 2, 2.5 or 5 times a power of ten (hpcviewer's
    and any plotting library's choice), whatever the unit after it."""
    m = re.match(r"^\s*(-?[\d.]+(?:e[-+]?\d+)?)", text)
    if not m:
        return True  # a name, not a number
    v = abs(float(m.group(1)))
    if v == 0:
        return True
    mant = v / 10 ** math.floor(math.log10(v))
    return any(abs(mant - k) < 1e-6 for k in (1, 2, 2.5, 3, 4, 5, 6, 7, 8, 9, 10))


# ---- jumps land in view ----------------------------------------------------------------


def test_every_jump_puts_the_selection_in_view(page: Any, server: Any) -> None:
    """Find, Lines -> Top-down, a flame graph click and the trace's "Show in Top-down" each
    select a row deep in the tree: it must be drawn inside the rows in view, path open."""
    pg, base = page, server.url
    # Lines -> Top-down on the 136-context database: the hottest calling context of a line
    pg.goto(f"{base}/#s=" + urllib.parse.quote(json.dumps(
        {"db": MPI, "dbs": {str(MPI): {"mode": "lines", "lines": {"row": 5, "start": 0, "count": 12}}}, "filters": []})))
    pg.wait_for_selector("#ln-ctxs li[data-key]")
    pg.wait_for_function("() => document.getElementById('lines').dataset.pending === '0'")
    shot(pg, "mpi-lines")
    looks_right(pg, "mpi lines")
    # lines of every part of a procedure: their scopes sort anywhere among ~45 siblings
    for row in (5, 20, 40, 44, 100):
        pg.goto(f"{base}/#s=" + urllib.parse.quote(json.dumps(
            {"db": MPI, "dbs": {str(MPI): {"mode": "lines",
                                           "lines": {"row": row, "start": row, "count": 12}}},
             "filters": []})))
        pg.wait_for_selector("#ln-ctxs li[data-key]")
        pg.wait_for_function("() => document.getElementById('lines').dataset.pending === '0'")
        key = pg.get_attribute("#ln-ctxs li[data-key]", "data-key")
        pg.click("#ln-topdown")
        pg.wait_for_function("(k) => window.__callpath.tree.selected && "
                             "window.__callpath.tree.selected.row.key === k", arg=key)
        assert_selection_in_view(pg, f"Lines row {row} -> Top-down")
    shot(pg, "mpi-lines-to-top-down")
    # ... and on the loops database, whose calling contexts lie deep in loops and inlined code
    for row in range(0, 40, 3):
        pg.goto(f"{base}/#s=" + urllib.parse.quote(json.dumps(
            {"db": LOOPS, "dbs": {str(LOOPS): {"mode": "lines",
                                               "lines": {"row": row, "start": row, "count": 8}}},
             "filters": []})))
        pg.wait_for_selector("#ln-ctxs li[data-key]")
        pg.wait_for_function("() => document.getElementById('lines').dataset.pending === '0'")
        key = pg.get_attribute("#ln-ctxs li[data-key]", "data-key")
        pg.click("#ln-topdown")
        pg.wait_for_function("(k) => window.__callpath.tree.selected && "
                             "window.__callpath.tree.selected.row.key === k", arg=key)
        assert_selection_in_view(pg, f"Lines row {row} -> Top-down")
    shot(pg, "loops-lines-to-top-down")

    # Find on the loops database: every match, one after another
    open_tree(pg, base, LOOPS)
    pg.click("#tb-find")
    pg.fill("#fd-text", "loop")
    pg.click("#fd-go")
    pg.wait_for_function("() => document.getElementById('fd-status').textContent.includes('match')")
    n = pg.locator("#fd-results li").count()
    assert n >= 2
    for i in (n - 1, 0, n // 2):
        pg.click(f"#fd-results li:nth-child({i + 1})")
        assert_selection_in_view(pg, f"Find match {i}")
    pg.click("#fd-close")
    shot(pg, "loops-find")

    # the flame graph: a click on the deepest frame selects it in the tree
    open_tree(pg, base, LOOPS, flame={"on": True, "path": []})
    pg.wait_for_function("() => document.getElementById('flame-pane').dataset.pending === '0'"
                         " && document.querySelector('.flame-canvas').dataset.rects")
    shot(pg, "loops-flame")
    f = pg.evaluate("() => window.__callpath.flame.frame")
    boxes = {k: pg.evaluate("(k) => window.__callpath.flame.rectOf(k)", k) for k in f["key"]}
    on_top = pg.evaluate("""(bs) => bs.map(b => b !== null && document.elementFromPoint(
        b.x + Math.min(b.w / 2, 20), b.y + 5) === document.querySelector('.flame-canvas'))""",
                         [boxes[k] for k in f["key"]])
    shown = [i for i, k in enumerate(f["key"]) if on_top[i] and boxes[k]["w"] >= 20]
    deepest = max(shown, key=lambda i: (f["depth"][i], f["w"][i]))
    box = boxes[f["key"][deepest]]
    pg.mouse.click(box["x"] + min(box["w"] / 2, 20), box["y"] + 5)
    pg.wait_for_function("(k) => window.__callpath.tree.selected && "
                         "window.__callpath.tree.selected.row.key === k", arg=f["key"][deepest])
    assert_selection_in_view(pg, "flame graph click")
    shot(pg, "loops-flame-click")

    # the trace: a sample's "Show in Top-down"
    pg.goto(url(base, LOOPS, mode="trace"))
    pg.wait_for_function("() => document.getElementById('tr-canvas').dataset.rows")
    trace_painted(pg)
    tb = pg.locator("#tr-canvas").bounding_box()
    pg.mouse.click(tb["x"] + tb["width"] / 3, tb["y"] + tb["height"] * 0.4)
    pg.wait_for_selector("#tr-show-node")
    node = pg.evaluate("() => window.__callpath.trace.lastCallpath.node")
    pg.click("#tr-show-node")
    pg.wait_for_function("(k) => window.__callpath.tree.selected && "
                         "window.__callpath.tree.selected.row.key === k", arg=node)
    assert_selection_in_view(pg, "trace Show in Top-down")
    shot(pg, "loops-trace-to-top-down")
