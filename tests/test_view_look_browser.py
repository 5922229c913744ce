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
* tick labels of graphs are round numbers (equal round steps);
* no console error, no failed request.
"""

from __future__ import annotations

import itertools
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
from view_support import copy_database, serve, trace_painted

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
    # a request the page cancels itself (a trace frame superseded by the next one) is no failure
    pg.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} {r.failure}")
          if "/ws" not in r.url and "ERR_ABORTED" not in str(r.failure) else None)
    pg.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}")
          if r.status >= 400 else None)
    pg.set_default_timeout(20000)
    pg.problems = problems
    yield pg
    ctx.close()
    assert not problems, problems


# ---- the databases ---------------------------------------------------------------------

SMALL, LOOPS, GPU, MPI, PY, TORCH = 0, 1, 2, 3, 4, 5
PROGRAM = """
def inner(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def outer():
    return sum(inner(20000) for _ in range(60))


for _ in range(4):
    outer()
"""


def python_database(dst: Path) -> Path:
    """A Python program measured by callpath's own sampler, with a trace."""
    script = dst / "busy.py"
    script.write_text(PROGRAM)
    out = dst / "busy.d"
    run_cli("profile", "--python", "-t", "-m", str(dst / "busy-m"), "-o", str(out), "--",
            str(script), check=True)
    return out


def torch_database(dst: Path) -> Path:
    """PyTorch training on an H100 measured by ``callpath run -e gpu=nvidia -t``
    (tests/gpu_data/torch-h100.tgz), attributed here."""
    import tarfile

    with tarfile.open(ROOT / "tests" / "gpu_data" / "torch-h100.tgz") as t:
        t.extractall(dst / "torch-m", filter="data")
    meas = next((dst / "torch-m").iterdir())
    out = dst / "torch-h100.d"
    run_cli("prof", str(meas), "-o", str(out), check=True)
    return out


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
    paths.append(python_database(base))
    paths.append(torch_database(base))
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


HEADINGS = ("#tree:not([hidden]) .tv-head .tv-hname, #tree .tv-head .tv-agg, "
            "#lines:not([hidden]) .ln-heads > div, #lines:not([hidden]) .ln-hcell, "
            "#lines:not([hidden]) th")


def overlapping_headers(pg: Any) -> list[tuple[str, str]]:
    """Pairs of headings (the tree's, the Lines tab's) whose drawn text boxes overlap (a
    Range per element: the box of the glyphs, not of the element, cut to what the element
    and its ancestors that hide overflow let show)."""
    pairs: list[tuple[str, str]] = pg.evaluate("""(sel) => {
        const boxes = [];
        for (const e of document.querySelectorAll(sel)) {
            if (!e.textContent.trim() || e.offsetParent === null) continue;
            if ([...e.children].some(k => k.matches(sel))) continue;  // its children count
            const rg = document.createRange(); rg.selectNodeContents(e);
            const clips = [];
            for (let a = e; a && a !== document.body; a = a.parentElement) {
                if (getComputedStyle(a).overflowX !== 'visible') {
                    clips.push(a.getBoundingClientRect());
                }
            }
            for (const r of rg.getClientRects()) {
                const b = {left: r.left, right: r.right, top: r.top, bottom: r.bottom};
                for (const c of clips) {
                    b.left = Math.max(b.left, c.left); b.right = Math.min(b.right, c.right);
                    b.top = Math.max(b.top, c.top); b.bottom = Math.min(b.bottom, c.bottom);
                }
                if (b.right > b.left && b.bottom > b.top) boxes.push([e.textContent, b, e]);
            }
        }
        const out = [];
        for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
            const [ta, a, ea] = boxes[i], [tb, b, eb] = boxes[j];
            if (ea === eb) continue;
            if (a.left < b.right - 1 && b.left < a.right - 1 && a.top < b.bottom - 1 &&
                b.top < a.bottom - 1) out.push([ta, tb]);
        }
        return out;
    }""", HEADINGS)
    return pairs


def looks_right(pg: Any, what: str) -> None:
    assert not cut_labels(pg), f"{what}: labels cut without a tooltip: {cut_labels(pg)[:5]}"
    assert not overlapping_headers(pg), f"{what}: header texts overlap: {overlapping_headers(pg)}"


def round_ticks(texts: list[str]) -> bool:
    """Tick labels are round: equally spaced by a step of 1, 2, 2.5 or 5 times a power of
    ten, each a whole multiple of it (not 0.627, 1.25, 1.88)."""
    vals = [float(t) for t in texts]
    if len(vals) < 2:
        return True
    steps = {round(b - a, 12) for a, b in itertools.pairwise(vals)}
    if len(steps) != 1:
        return False
    step = steps.pop()
    if step <= 0:
        return False
    mant = step / 10 ** math.floor(math.log10(step))
    if not any(abs(mant - k) < 1e-6 for k in (1, 2, 2.5, 5, 10)):
        return False
    return all(abs(v / step - round(v / step)) < 1e-6 for v in vals)


# ---- jumps land in view ----------------------------------------------------------------


def test_every_jump_puts_the_selection_in_view(page: Any, server: Any) -> None:
    """Find, Lines -> Top-down, a flame graph click and the trace's "Show in Top-down" each
    select a row deep in the tree: it must be drawn inside the rows in view, path open."""
    pg, base = page, server.url
    # Lines -> Top-down on the 136-context database: the hottest calling context of a line
    pg.goto(f"{base}/#s=" + urllib.parse.quote(json.dumps(
        {"db": MPI, "dbs": {str(MPI): {"mode": "lines",
                                       "lines": {"row": 5, "start": 0, "count": 12}}},
         "filters": []})))
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


# ---- GPU databases ---------------------------------------------------------------------


def test_gpu_database_opens_on_the_time(page: Any, server: Any) -> None:
    """HPCToolkit's CUDA run: the tree opens sorted by GPUOP (the metric that holds the
    time), all-zero columns hidden behind one click, the Lines tab on the same metric, and
    the trace names its GPU stream readably, apart from the CPU thread, whose empty row says
    it has no samples."""
    pg, base = page, server.url
    open_tree(pg, base, GPU)
    cols = pg.evaluate("() => window.__callpath.columns")
    empty = [c["key"] for c in cols if c["empty"]]
    assert empty, "the CUDA database has all-zero metrics"
    opened = [c for c in cols if c["open"]]
    assert [c["name"] for c in opened] == ["GPUOP (sec) (I)"]
    assert pg.evaluate("() => window.__callpath.tree.sortKey") == opened[0]["key"]
    shown = pg.evaluate("() => window.__callpath.tree.columns.map(c => c.key)")
    assert shown[0] == opened[0]["key"] and not set(shown) & set(empty)
    root = pg.evaluate("() => window.__callpath.tree.root.row.values")
    assert root[opened[0]["key"]] > 0
    looks_right(pg, "gpu top-down")
    shot(pg, "gpu-top-down")
    # one click shows them all
    pg.click("#empty-cols")
    pg.wait_for_function("(n) => window.__callpath.tree.columns.length === n", arg=len(cols))
    assert not pg.is_visible("#empty-cols")
    shot(pg, "gpu-top-down-all-columns")

    # the Lines tab: the same metric
    pg.click("#view-tabs [data-view=lines]")
    pg.wait_for_function("() => document.getElementById('lines').dataset.pending === '0' && "
                         "document.querySelector('#ln-heat .ln-row')")
    metric = pg.eval_on_selector("#ln-metric", "s => s.options[s.selectedIndex].textContent")
    assert metric.startswith("GPUOP")
    # GPU time has no line of its own: it is on the line that launched it, which says so,
    # and the tab opens there (the hottest line)
    launch = pg.evaluate("""() => [...document.querySelectorAll('#ln-src .ln-srow')]
        .map((r, i) => [i, !!r.querySelector('.ln-launch'), r.classList.contains('sel'),
                        [...document.querySelectorAll('#ln-heat .ln-row')][i].textContent])
        .filter(x => x[1])""")
    assert len(launch) == 1 and launch[0][2], launch
    assert float(launch[0][3].split()[0]) > 0, launch
    # its rows come from several files: each file is named where the listing enters it
    files = pg.evaluate("""() => [...document.querySelectorAll('#ln-src .ln-srow')].map(r =>
        [r.title.split(':')[0], (r.querySelector('.ln-fname') || {}).textContent || null])""")
    for k, (path, named) in enumerate(files):
        if k == 0 or path != files[k - 1][0]:
            assert named == path.rsplit("/", 1)[-1], (k, files)
    looks_right(pg, "gpu lines")
    shot(pg, "gpu-lines")

    # the trace: CPU thread first, then the GPU stream, labelled and striped
    pg.click("#view-tabs [data-view=trace]")
    pg.wait_for_function("() => document.getElementById('tr-canvas').dataset.rows")
    trace_painted(pg)
    meta = pg.evaluate("() => window.__callpath.trace.meta")
    assert meta["gpu"] == [False, True]
    assert meta["contexts"][1].endswith("GPU stream 7 (context 1)")
    assert "THREAD 0" in meta["contexts"][0]
    assert meta["row_samples"][1] > 0
    box = pg.locator("#tr-canvas").bounding_box()
    stripe = pg.evaluate("""(y) => { const c = document.getElementById('tr-canvas');
        const r = c.getBoundingClientRect(), d = c.width / r.width;
        return [...c.getContext('2d').getImageData(1 * d, (y - r.top) * d, 1, 1).data]; }""",
                         box["y"] + box["height"] * 0.75)
    assert stripe[:3] == [0x1b, 0x9e, 0x4b], "the GPU stream row has its green stripe"
    if meta["row_samples"][0] == 0:  # the CPU thread's row: said to be empty
        pg.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] * 0.25)
        pg.wait_for_function("() => document.getElementById('tr-canvas').title.length > 0")
        assert pg.get_attribute("#tr-canvas", "title").startswith("no trace samples for")
    shot(pg, "gpu-trace")


def test_gpu_time_is_on_the_lines_that_launched_it(page: Any, server: Any) -> None:
    """PyTorch's run: the Lines tab opens on GPUOP at its hottest line, a line that launched
    GPU work (its GEMM kernels) and says so; every line holding GPU time is a launch line."""
    pg, base = page, server.url
    pg.goto(f"{base}/#s=" + urllib.parse.quote(json.dumps(
        {"db": TORCH, "dbs": {str(TORCH): {"mode": "lines"}}, "filters": []})))
    pg.wait_for_function("() => document.getElementById('lines').dataset.pending === '0' && "
                         "document.querySelector('#ln-src .ln-srow.sel')")
    metric = pg.eval_on_selector("#ln-metric", "s => s.options[s.selectedIndex].textContent")
    assert metric.startswith("GPUOP")
    assert pg.locator("#ln-src .ln-srow.sel .ln-launch").count() == 1
    ranked = pg.evaluate("() => [...document.querySelectorAll('#ln-ranked tbody tr')]"
                         ".map(r => r.textContent)")
    assert len(ranked) >= 3, ranked
    looks_right(pg, "torch lines")
    shot(pg, "torch-gpu-lines")
    meta = pg.evaluate(f"() => fetch('/api/db/{TORCH}/trace/meta').then(r => r.json())")
    assert not [x for x in meta["contexts"] if re.search(r"NODE \d", x)], meta["contexts"]


# ---- stale panes -----------------------------------------------------------------------


def test_switching_databases_clears_the_trace_panes(page: Any, server: Any) -> None:
    """The trace's Call path and Depth panes follow the database: after a switch of tabs
    they no longer show the previous database's thread and frames."""
    pg, base = page, server.url
    both = {str(d): {"view": "top-down", "mode": "trace"} for d in (LOOPS, GPU)}
    pg.goto(f"{base}/#s=" + urllib.parse.quote(json.dumps(
        {"db": LOOPS, "dbs": both, "filters": []})))
    pg.wait_for_function("() => document.getElementById('tr-canvas').dataset.rows")
    trace_painted(pg)
    box = pg.locator("#tr-canvas").bounding_box()
    pg.mouse.click(box["x"] + box["width"] / 3, box["y"] + box["height"] * 0.4)
    pg.wait_for_selector("#tr-show-node")
    shot(pg, "loops-trace-point")
    assert pg.inner_text("#tr-depth-ctx")
    pg.click("#db-tabs [data-db='2']")
    pg.wait_for_function("() => window.__callpath.trace.db === 2 && "
                         "document.getElementById('tr-canvas').dataset.rows === '2'")
    trace_painted(pg)
    assert pg.inner_text("#tr-callpath").strip() == ""
    assert pg.inner_text("#tr-depth-ctx").strip() == ""
    shot(pg, "gpu-trace-after-switch")


def test_the_mini_map_follows_the_database(page: Any, server: Any) -> None:
    """While the next database's mini-map is on its way, the previous one's is not shown:
    its frames are held back here until the switch has been looked at."""
    pg, base = page, server.url
    both = {str(d): {"view": "top-down", "mode": "trace"} for d in (LOOPS, GPU)}
    pg.goto(f"{base}/#s=" + urllib.parse.quote(json.dumps(
        {"db": LOOPS, "dbs": both, "filters": []})))
    pg.wait_for_function("() => document.getElementById('tr-minimap').dataset.window")
    held: list[Any] = []
    released = [False]

    def hold(route: Any) -> None:
        if released[0]:
            route.continue_()
        else:
            held.append(route)

    pg.route(f"**/api/db/{GPU}/trace/frame*", hold)
    pg.click(f"#db-tabs [data-db='{GPU}']")
    pg.wait_for_function(f"() => window.__callpath.trace.db === {GPU}")
    blank = pg.evaluate("""() => {
        const m = document.getElementById('tr-minimap');
        const px = m.getContext('2d').getImageData(0, 0, m.width, m.height).data;
        return [m.dataset.window === undefined, px.every((v) => v === 0)];
    }""")
    assert blank == [True, True], "the previous database's mini-map is still shown"
    released[0] = True
    for route in held:
        route.continue_()
    pg.wait_for_function("() => document.getElementById('tr-minimap').dataset.window")


# ---- every tab of every kind of database, looked at -----------------------------------


def look_at_tabs(pg: Any, name: str, info: dict[str, Any]) -> None:
    """Every tab of the database on screen: screenshot, labels, headers, selection after a
    Hot path jump; the graph dialog's ticks."""
    for view in ("top-down", "bottom-up", "flat"):
        pg.click(f"#view-tabs [data-view={view}]")
        idle(pg)
        looks_right(pg, f"{name} {view}")
        shot(pg, f"{name}-{view}")
    pg.click("#view-tabs [data-view=top-down]")
    idle(pg)
    pg.click("#tb-hot")
    pg.wait_for_timeout(200)
    assert_selection_in_view(pg, f"{name} hot path")
    shot(pg, f"{name}-hot-path")
    # the graph of the selection: round ticks on both axes, in each kind of graph
    pg.click("#tb-plot")
    pg.wait_for_function("() => window.__callpath.plot.data !== null")
    for kind in ("plot", "sorted", "histogram"):
        pg.check(f"input[name=pl-kind][value={kind}]")
        pg.wait_for_timeout(50)
        for axis in ("yTicks", "xTicks"):
            ticks = pg.evaluate(f"() => window.__callpath.plot.{axis}")
            assert round_ticks(ticks), f"{name} {kind}: {axis} {ticks}"
        if kind == "histogram":
            assert all(float(t) == int(float(t)) for t in pg.evaluate(
                "() => window.__callpath.plot.yTicks")), "counts are whole numbers"
        shot(pg, f"{name}-graph-{kind}")
    pg.click("#pl-close")
    if info["has_traces"]:
        pg.click("#view-tabs [data-view=trace]")
        pg.wait_for_function("() => document.getElementById('tr-canvas').dataset.rows")
        trace_painted(pg)
        labels = pg.evaluate("() => window.__callpath.trace.meta.contexts")
        assert labels == sorted(labels, key=row_key), f"{name}: trace rows not in order"
        # no raw host id (gethostid(), NODE 8323328): one node is left out, several in hex
        assert not [x for x in labels if re.search(r"NODE \d{5,}", x)], labels
        shot(pg, f"{name}-trace")
    pg.click("#view-tabs [data-view=lines]")
    pg.wait_for_function("() => document.getElementById('lines').dataset.pending === '0' && "
                         "(document.querySelector('#ln-heat .ln-row') || "
                         "document.getElementById('error-bar').hidden === false)")
    pg.wait_for_timeout(100)
    looks_right(pg, f"{name} lines")
    shot(pg, f"{name}-lines")


def row_key(label: str) -> tuple[int, ...]:
    """hpctraceviewer's order, read back from a row label: rank, CPU before GPU, thread or
    context, stream."""
    ids = {k: int(v) for k, v in re.findall(r"([A-Z]+) (\d+)", label)}
    gpu = re.search(r"GPU stream (\d+)(?: \(context (\d+)\))?", label)
    if gpu:
        return (ids.get("RANK", -1), 1, int(gpu.group(2) or -1), int(gpu.group(1)))
    return (ids.get("RANK", -1), 0, ids.get("THREAD", -1), -1)


@pytest.mark.parametrize("db,name", [(SMALL, "native-small"), (LOOPS, "native-loops"),
                                     (PY, "python"), (MPI, "mpi-openmp-136"),
                                     (GPU, "gpu-cuda")])
def test_every_tab_looks_right(page: Any, server: Any, db: int, name: str) -> None:
    pg, base = page, server.url
    open_tree(pg, base, db)
    assert pg.evaluate("() => document.activeElement === window.__callpath.tree.scroller"), \
        "the tree has the keyboard focus on load"
    pg.keyboard.press("ArrowDown")
    assert pg.evaluate("() => window.__callpath.tree.selected !== null")
    info = next(d for d in pg.evaluate("() => fetch('/api/databases').then(r => r.json())")
                if d["id"] == db)
    look_at_tabs(pg, name, info)


def test_comparison_looks_right(page: Any, server: Any) -> None:
    """A comparison opened from the viewer: its tab reads base → new, its tabs look right;
    comparing databases whose metrics differ by name says so."""
    pg, base = page, server.url
    open_tree(pg, base, SMALL)
    pg.click("#tb-compare")
    pg.select_option("#cmp-base", str(SMALL))
    pg.select_option("#cmp-new", str(LOOPS))
    pg.click("#cmp-ok")
    # the comparison is computed and written by the server (on a loaded machine that can take
    # longer than the page's default wait); its tab is named base → new
    pg.wait_for_function(
        "() => [...document.querySelectorAll('#db-tabs [role=tab]')]"
        ".some(t => t.textContent.trim() === 'small.d → loops-cputime-t.d')", timeout=90000)
    idle(pg)
    tab = pg.inner_text("#db-tabs [aria-selected=true]")
    assert tab == "small.d → loops-cputime-t.d"
    assert pg.is_hidden("#error-bar")  # both have CPUTIME: nothing to warn about
    info = pg.evaluate("() => fetch('/api/databases').then(r => r.json())")[-1]
    look_at_tabs(pg, "comparison", info)
    # HPCToolkit's run (CPUTIME) against one counted in ticks: no metric in common
    open_tree(pg, base, SMALL)
    pg.click("#tb-compare")
    pg.select_option("#cmp-base", str(SMALL))
    pg.select_option("#cmp-new", str(MPI))
    pg.click("#cmp-ok")
    pg.wait_for_selector("#error-bar:not([hidden])")
    assert "no metric in common" in pg.inner_text("#error-text")
    shot(pg, "comparison-metrics-differ")


def test_switching_views_clears_the_source_message(page: Any, server: Any) -> None:
    """Bottom-up no longer shows Top-down's source message: a view's source pane shows its
    own selection, or nothing."""
    pg, base = page, server.url
    open_tree(pg, base, LOOPS)
    pg.click(".tv-row:not([hidden]) .tv-label >> nth=1")
    pg.wait_for_selector(".src-empty:has-text('No source recorded')")
    said = pg.inner_text(".src-empty")
    pg.click("#view-tabs [data-view=bottom-up]")
    idle(pg)
    pg.wait_for_timeout(300)  # the source pane follows a selection after 80 ms
    assert pg.locator(".src-empty").count() == 0 or pg.inner_text(".src-empty") != said
    shot(pg, "loops-bottom-up-source")


def test_a_link_reopens_with_the_selection_in_view(page: Any, server: Any) -> None:
    """A link holding a deep selection (the URL after a jump) opens with that row inside the
    rows in view and its path open, in a page of its own."""
    pg, base = page, server.url
    pg.goto(f"{base}/#s=" + urllib.parse.quote(json.dumps(
        {"db": MPI, "dbs": {str(MPI): {"mode": "lines",
                                       "lines": {"row": 44, "start": 40, "count": 12}}},
         "filters": []})))
    pg.wait_for_selector("#ln-ctxs li[data-key]")
    pg.wait_for_function("() => document.getElementById('lines').dataset.pending === '0'")
    key = pg.get_attribute("#ln-ctxs li[data-key]", "data-key")
    pg.click("#ln-topdown")
    pg.wait_for_function("(k) => window.__callpath.tree.selected && "
                         "window.__callpath.tree.selected.row.key === k", arg=key)
    idle(pg)
    pg.evaluate("() => window.__callpath.flushUrl()")
    link = pg.url
    other = pg.context.new_page()
    try:
        other.goto(link)
        other.wait_for_function("(k) => window.__callpath && window.__callpath.tree.selected && "
                                "window.__callpath.tree.selected.row.key === k", arg=key)
        assert_selection_in_view(other, "a link")
        shot(other, "mpi-link-with-selection")
    finally:
        other.close()
