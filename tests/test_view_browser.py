"""Browser tests of ``callpath view``: Debian's Chromium driven by Playwright against a REAL
server (``view_server`` in view_support.py: uvicorn on a loopback port over copies of the real
databases in ../shared/data). Every check compares what the page shows with what
``callpath report`` prints for the same database and the same selection, so the viewer and
the terminal report must agree to the character.

Screenshots go to tests/artifacts/view/ (ignored by git): look at them after a change.
One browser for the module; each test gets a fresh page.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT, run_cli
from view_support import (  # noqa: F401
    CHROME_ARGS,
    chromium,
    trace_painted,
    view_server_fixture,
)

SMALL, LOOPS, CPI = 0, 1, 2
ARTIFACTS = ROOT / "tests" / "artifacts" / "view"
VIEWS = ["top-down", "bottom-up", "flat"]

playwright_sync = pytest.importorskip(
    "playwright.sync_api", exc_type=ImportError,
    reason="the Python package playwright is not installed or does not import")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    exe = chromium()
    with playwright_sync.sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=exe, args=CHROME_ARGS)
        except Exception as e:  # any launch failure is a missing capability
            pytest.skip(f"Chromium at {exe} does not start headless: {str(e).splitlines()[0]}")
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.set_default_timeout(20000)
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors in the page: {errors}"


# ---- helpers ---------------------------------------------------------------------------


def url_with_state(base: str, db: int, view: str = "top-down", **extra: Any) -> str:
    """A link with an explicit state (no saved filters from the user's configuration)."""
    dbs = {str(db): {"view": view, **extra}}
    state = {"db": db, "dbs": dbs, "filters": extra.pop("filters", [])}
    return f"{base}/#s={urllib.parse.quote(json.dumps(state))}"


def idle(pg: Any) -> None:
    """Waits until no tree request is in flight and no visible row is a placeholder."""
    pg.wait_for_function(
        "() => document.getElementById('tree').dataset.pending === '0' && "
        "!document.querySelector('.tv-row:not([hidden]) .tv-label.loading')")
    pg.wait_for_timeout(50)  # one animation frame for the last render
    pg.wait_for_function(
        "() => document.getElementById('tree').dataset.pending === '0' && "
        "!document.querySelector('.tv-row:not([hidden]) .tv-label.loading')")


def open_db(pg: Any, base: str, db: int, view: str = "top-down", **extra: Any) -> None:
    pg.goto(url_with_state(base, db, view, **extra))
    pg.wait_for_selector(".tv-row")
    idle(pg)


def shot(pg: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def model_rows(pg: Any) -> list[dict[str, Any]]:
    """Every line the tree would show (the front end's row list), loaded rows only."""
    return pg.evaluate("""() => window.__callpath.tree.rows.filter(e => e.row).map(e => ({
        key: e.row.key, label: e.row.label, depth: e.depth, open: !!e.kids,
        kids: e.row.has_children, text: e.row.text,
        sel: e === window.__callpath.tree.selected}))""")


def dom_rows(pg: Any) -> list[dict[str, Any]]:
    """The rows rendered in the DOM (label and metric cell texts, in column order)."""
    return pg.evaluate("""() => [...document.querySelectorAll('.tv-row:not([hidden])')].map(r => ({
        key: r.dataset.key, label: r.querySelector('.tv-label').textContent,
        cells: [...r.querySelectorAll('.tv-cell.tv-metric')].map(c => c.textContent),
        selected: r.classList.contains('selected'),
        blue: r.querySelector('.tv-label').classList.contains('has-source')}))""")


def headers(pg: Any) -> list[str]:
    return pg.eval_on_selector_all(".tv-hcell.tv-metric .tv-hname",
                                   "els => els.map(e => e.textContent)")


def norm(s: str) -> str:
    return " ".join(s.split())


def expand_to_depth(pg: Any, depth: int) -> None:
    """Opens every node above ``depth`` (the same code path as clicking each toggle)."""
    pg.evaluate("""async (depth) => {
        const t = window.__callpath.tree;
        for (let round = 0; round < 50; round++) {
            const todo = t.rows.filter(
                e => e.row && e.row.has_children && !e.kids && e.depth < depth);
            if (!todo.length) break;
            for (const e of todo) await t.expand(e);
        }
    }""", depth)
    idle(pg)


def show_depth(pg: Any, depth: int) -> None:
    """Exactly the nodes above ``depth`` open (what ``report --depth`` prints)."""
    pg.evaluate("() => { const t = window.__callpath.tree;"
                " for (const e of [...t.rows]) if (e.depth > 0 && e.kids) t.collapse(e);"
                " t.expandedKeys.clear(); }")
    expand_to_depth(pg, depth)


def download_csv(pg: Any, tmp: Path) -> str:
    with pg.expect_download() as dl:
        pg.click("#tb-csv")
    path = tmp / dl.value.suggested_filename
    dl.value.save_as(path)
    return path.read_text()


def report(db: Path, *args: str) -> str:
    """The report of what the viewer shows: its rows of line 0 too (``--keep-lineless``)."""
    return run_cli("report", str(db), "--no-saved-filters", "--no-saved-derived",
                   "--keep-lineless", *args, check=True).stdout


def report_json(db: Path, *args: str) -> list[dict[str, Any]]:
    doc = json.loads(report(db, "--format", "json", *args))
    assert isinstance(doc, list)
    return doc


def hot_path_lines(db: Path, view: str) -> list[str]:
    """The hot path as ``callpath report --hot-path`` prints it: one normalised line per node."""
    text = report(db, "--view", view, "--hot-path")
    return [norm(line) for line in text.splitlines()[1:] if line.strip()]


def click_hot_path(pg: Any) -> None:
    pg.click("#tb-hot")
    pg.wait_for_function("() => window.__callpath.tree.selected && "
                         "window.__callpath.tree.selected.depth > 0")
    idle(pg)


def selected_chain(pg: Any) -> list[dict[str, Any]]:
    """The selected row and its ancestors, root first, as rendered cells + label."""
    return pg.evaluate("""() => {
        const t = window.__callpath.tree; const out = [];
        for (let e = t.selected; e; e = e.parent)
            out.unshift({label: e.row.label, cells: t.columns.map(c => e.row.text[c.key])});
        return out;
    }""")


# ---- the profile views -----------------------------------------------------------------


@pytest.mark.parametrize("view", VIEWS)
def test_profile_view(page: Any, view_server: Any, view: str, tmp_path: Path) -> None:
    """In each view: hot path, sort (and toggle), CSV against report, derived metric, the
    three filter types, the keyboard, against ``callpath report`` for the same selection."""
    pg, base = page, view_server.url
    db = view_server.dbs[LOOPS].path
    open_db(pg, base, LOOPS, view)
    assert headers(pg) == ["CPUTIME (sec) (I)", "CPUTIME (sec) (E)"]
    assert pg.get_attribute(f"#view-tabs [data-view={view}]", "aria-selected") == "true"

    # hot path: the same nodes, labels and cell texts as `callpath report --hot-path`
    click_hot_path(pg)
    chain = selected_chain(pg)
    got = [norm(" ".join(r["cells"]) + " " + r["label"]) for r in chain]
    assert got == hot_path_lines(db, view)
    assert len(got) >= 2
    sel = [r for r in dom_rows(pg) if r["selected"]]
    assert sel and sel[0]["label"] == chain[-1]["label"]  # scrolled into view and highlighted
    shot(pg, f"{view}-hotpath")

    # CSV of what is shown, after opening two levels: identical to report --depth 2
    show_depth(pg, 2)
    csv = download_csv(pg, tmp_path)
    assert csv == report(db, "--view", view, "--depth", "2", "--format", "csv")

    # sort by the exclusive column: descending, then a second click toggles to ascending
    pg.click(".tv-hcell.tv-metric[data-key='m0e']")
    idle(pg)
    assert "▼" in pg.inner_text(".tv-hcell.sorted")
    csv = download_csv(pg, tmp_path)
    want = report(db, "--view", view, "--depth", "2", "--format", "csv",
                  "--sort", "CPUTIME (sec) (E)")
    assert csv == want
    pg.click(".tv-hcell.tv-metric[data-key='m0e']")
    idle(pg)
    assert "▲" in pg.inner_text(".tv-hcell.sorted")
    csv = download_csv(pg, tmp_path)
    assert csv == report(db, "--view", view, "--depth", "2", "--format", "csv",
                         "--sort", "CPUTIME (sec) (E)", "--ascending")
    shot(pg, f"{view}-sorted-ascending")
    pg.click(".tv-hcell.tv-metric[data-key='m0i']")
    idle(pg)

    # a derived metric through the dialog: $0 inserted with the Point-wise button
    pg.click("#tb-derived")
    pg.fill("#dm-name", "share")
    pg.select_option("#dm-metrics", "0")
    pg.fill("#dm-formula", "100*")
    pg.click("#dm-point")
    pg.press("#dm-formula", "End")
    pg.type("#dm-formula", "/@0")
    assert pg.input_value("#dm-formula") == "100*$0/@0"
    pg.check("input[name=dm-format][value=percent]")
    # a bad formula is refused in the dialog with the server's message
    pg.fill("#dm-formula", "100*$7/")
    pg.click("#dm-ok")
    pg.wait_for_function("() => document.getElementById('dm-error').textContent.length > 0")
    assert pg.is_visible("#dlg-derived")
    pg.fill("#dm-formula", "100*$0/@0")
    pg.click("#dm-ok")
    pg.wait_for_function("() => [...document.querySelectorAll('.tv-hname')]"
                         ".some(e => e.textContent === 'share')")
    idle(pg)
    rows = report_json(db, "--view", view, "--depth", "2", "--derived", "share=100*$0/@0",
                       "--derived-format", "share=percent", "-m", "CPUTIME (sec)",
                       "-m", "share")
    col = headers(pg).index("share")
    shown = {norm(r["label"]): norm(r["cells"][col]) for r in dom_rows(pg) if r["key"]}
    want_share = {norm(r["label"]): f"{r['metrics']['share']:.2f}%" for r in rows}
    common = set(shown) & set(want_share)
    assert len(common) >= 3, (shown, want_share)
    for label in common:
        assert shown[label] == want_share[label], label
    shot(pg, f"{view}-derived")

    # filters: each type through the filter window, the CSV equals report --filter
    procedure = "main._omp_fn.0"
    for ftype, cli in (("self", "self"), ("descendants", "descendants"),
                       ("all", "self-and-descendants")):
        pg.click("#tb-filters")
        if pg.locator("#flt-list tr td input").count():  # edit the previous filter's type
            pg.click("#flt-list tr:first-child td:nth-child(2)")
            assert pg.input_value("#flt-pattern") == procedure
            pg.select_option("#flt-type", ftype)
            pg.click("#flt-edit")
        else:
            pg.fill("#flt-pattern", procedure)
            pg.select_option("#flt-type", ftype)
            pg.click("#flt-add")
        assert pg.locator("#flt-list tr").count() == 1
        pg.click("#flt-ok")
        pg.wait_for_selector(".badge:has-text('Filters')")
        idle(pg)
        show_depth(pg, 4)
        csv = download_csv(pg, tmp_path)
        want = report(db, "--view", view, "--depth", "4", "--format", "csv",
                      "--filter", f"{procedure}:{cli}", "--derived", "share=100*$0/@0",
                      "--derived-format", "share=percent", "-m", "CPUTIME (sec)",
                      "-m", "share")
        assert csv == want, ftype
        if ftype == "all" and view == "top-down":
            assert procedure not in csv
        shot(pg, f"{view}-filter-{ftype}")
    # disable the filter (then delete it): the tree is back to the unfiltered one
    pg.click("#tb-filters")
    pg.uncheck("#flt-list input[type=checkbox]")
    pg.click("#flt-ok")
    pg.wait_for_selector(".badge:has-text('Filters')", state="detached")
    pg.click("#tb-filters")
    pg.click("#flt-list tr:first-child td:nth-child(2)")
    pg.click("#flt-delete")
    assert pg.locator("#flt-list tr td input").count() == 0
    pg.click("#flt-ok")
    pg.wait_for_selector(".badge:has-text('Filters')", state="detached")
    idle(pg)
    show_depth(pg, 4)
    assert download_csv(pg, tmp_path) == report(
        db, "--view", view, "--depth", "4", "--format", "csv", "--derived", "share=100*$0/@0",
        "--derived-format", "share=percent", "-m", "CPUTIME (sec)", "-m", "share")

    # keyboard: Home selects the root, Down the next row, Right opens it, Left closes it
    pg.click(".tv-row .tv-label")
    pg.keyboard.press("Home")
    pg.keyboard.press("ArrowDown")
    first = pg.evaluate("() => window.__callpath.tree.selected.row.label")
    pg.evaluate("() => { const t = window.__callpath.tree;"
                " if (t.selected.kids) t.collapse(t.selected); }")
    pg.keyboard.press("ArrowRight")
    pg.wait_for_function("() => !!window.__callpath.tree.selected.kids")
    pg.keyboard.press("ArrowLeft")
    pg.wait_for_function("() => !window.__callpath.tree.selected.kids")
    assert pg.evaluate("() => window.__callpath.tree.selected.row.label") == first


def test_plot_and_thread_view(page: Any, view_server: Any, tmp_path: Path) -> None:
    """Graph of a node across contexts (values as report --stats prints them), PNG export,
    a click on a point opens that context's Thread view; the Thread view dialog with a text
    filter; both sum only the chosen contexts, as report --threads does."""
    pg, base = page, view_server.url
    db = view_server.dbs[LOOPS].path
    open_db(pg, base, LOOPS, "top-down")
    click_hot_path(pg)
    # the procedure on the hot path: » main._omp_fn.0 (top-down key t<id> = report's id)
    rows = report_json(db, "--hot-path")
    proc = next(r for r in rows if r["name"] == "main._omp_fn.0")
    key = f"t{proc['id']}"
    pg.evaluate("(k) => { const t = window.__callpath.tree;"
                " t.select(t.rows.find(e => e.row && e.row.key === k)); }", key)
    pg.click("#tb-plot")
    pg.wait_for_function("() => window.__callpath.plot.data !== null")
    stats = report(db, "--stats", str(proc["id"]))
    per_ctx = dict(re.findall(r"^\s{2}(\S.*?\S)\s{2,}(\S+)$", stats, re.M))
    data = pg.evaluate("() => window.__callpath.plot.data")
    assert len(data["values"]) == 4 == len(per_ctx)
    for label, value in zip(data["labels"], data["values"], strict=True):
        assert float(per_ctx[label]) == pytest.approx(value, rel=1e-5)
    assert "4 contexts" in pg.inner_text("#pl-stats")
    m = re.search(r"sum: (\S+)", stats)
    assert m is not None
    assert f"sum {float(m.group(1)):.4g}" in pg.inner_text("#pl-stats")
    # the three kinds draw on the canvas
    for kind in ("sorted", "histogram", "plot"):
        pg.check(f"input[name=pl-kind][value={kind}]")
        painted = pg.evaluate("""() => { const c = document.getElementById('pl-canvas');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] > 150 && d[i+1] < 120) n++;
            return n; }""")
        if kind != "histogram":
            assert painted > 20, kind  # red points
    pg.click("#pl-zin")
    r = pg.evaluate("() => window.__callpath.plot.range")
    assert r is not None and r["x1"] - r["x0"] < 4
    pg.click("#pl-reset")
    shot(pg, "plot")
    with pg.expect_download() as dl:
        pg.click("#pl-png")
    png = tmp_path / "plot.png"
    dl.value.save_as(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # click the point of the busiest context: the Thread view of that context opens
    pts = pg.evaluate("() => window.__callpath.plot.points.map(p => ({x: p.px, y: p.py, "
                      "ctx: p.ctx, label: p.label, v: p.y}))")
    best = max(pts, key=lambda p: p["v"])
    box = pg.locator("#pl-canvas").bounding_box()
    scale = box["width"] / pg.evaluate("() => document.getElementById('pl-canvas').width")
    pg.mouse.click(box["x"] + best["x"] * scale, box["y"] + best["y"] * scale)
    pg.wait_for_selector(".badge:has-text('Thread view: 1 context')")
    idle(pg)
    assert pg.evaluate("() => window.__callpath.state.dbs[1].threads") == [best["ctx"]]
    root = model_rows(pg)[0]
    want = report_json(db, "--threads", best["label"], "--depth", "0")[0]
    assert norm(root["text"]["m0i"]).split()[0] == f"{want['metrics']['CPUTIME (sec) (I)']:.2e}"
    shot(pg, "thread-view-from-plot")

    # the execution-context dialog: a text filter, check the shown ones, OK
    pg.click("#tb-threads")
    pg.fill("#th-filter", "THREAD 1")
    assert pg.locator("#th-list label").count() == 1
    pg.click("#th-uncheck")
    pg.fill("#th-filter", "")
    pg.click("#th-uncheck")
    pg.fill("#th-filter", "THREAD [23]")
    pg.check("#th-regex")
    assert pg.locator("#th-list label").count() == 2
    pg.click("#th-check")
    shot(pg, "threads-dialog")
    pg.click("#th-ok")
    pg.wait_for_selector(".badge:has-text('Thread view: 2 contexts')")
    idle(pg)
    show_depth(pg, 3)
    csv = download_csv(pg, tmp_path)
    assert csv == report(db, "--threads", "THREAD [23]", "--threads-regex", "--depth", "3",
                         "--format", "csv")


def test_source_pane(page: Any, view_server: Any) -> None:
    """The cpi database carries a copy of cpi.c: a scope with source is blue, selecting it
    shows the file with its line highlighted (the same text as the file on disk); an
    activation offers its call site and its callee; find works in the pane."""
    pg, base = page, view_server.url
    dbdir = view_server.dbs[CPI].path
    open_db(pg, base, CPI, "top-down")
    click_hot_path(pg)
    expand_to_depth(pg, 6)
    blue = [r for r in dom_rows(pg) if r["blue"]]
    assert blue, "no scope with source is blue"
    rows = model_rows(pg)
    row = next(r for r in rows if r["label"] == blue[0]["label"])
    pg.click(f".tv-row[data-key='{row['key']}'] .tv-label")
    pg.wait_for_function("() => document.getElementById('src-body').dataset.line")
    line = int(pg.get_attribute("#src-body", "data-line"))
    fname = pg.get_attribute("#src-body", "data-file")
    copies = list(dbdir.rglob(fname))
    assert copies, f"{fname} is not in {dbdir}"
    text = copies[0].read_text(errors="replace").splitlines()
    hl = pg.inner_text(".src-line.hl .tx")
    assert hl.strip() == text[line - 1].strip()
    assert pg.inner_text(".src-line.hl .ln") == str(line)
    assert pg.is_visible(".src-line.hl")  # scrolled into view
    assert fname in pg.inner_text("#src-file")
    # an activation with source: both buttons, and each shows a line
    act = pg.evaluate("""() => window.__callpath.tree.rows.filter(e => e.row && e.row.has_source
        && e.row.has_callsite_source && /»/.test(e.row.label)).map(e => e.row.key)""")
    if act:
        pg.click(f".tv-row[data-key='{act[0]}'] .tv-label")
        pg.wait_for_selector("#src-which:not([hidden])")
        pg.click("#src-which [data-which=self]")
        pg.wait_for_function("() => document.querySelector('#src-which [data-which=self]')"
                             ".getAttribute('aria-pressed') === 'true'")
        pg.wait_for_selector(".src-line.hl")
    pg.fill("#src-find", "MPI")
    pg.wait_for_selector(".src-line mark.cur")
    assert pg.inner_text(".src-line mark.cur").lower() == "mpi"  # case-insensitive
    shot(pg, "source-pane")


def test_find_zoom_flatten_font_columns_and_menu(page: Any, view_server: Any) -> None:
    pg, base = page, view_server.url
    open_db(pg, base, LOOPS, "top-down")
    # Find through the context menu: case, whole word and regex options
    pg.click(".tv-row .tv-label", button="right")
    pg.click("#ctx-menu [data-act=find]")
    pg.fill("#fd-text", "func[12]$")
    pg.check("#fd-regex")
    pg.click("#fd-go")
    pg.wait_for_function("() => document.getElementById('fd-status').textContent.includes('match')")
    n = pg.locator("#fd-results li").count()
    assert n >= 2
    idle(pg)
    label = pg.evaluate("() => window.__callpath.tree.selected.row.name")
    assert label in ("func1", "func2")
    # the result list names each match by its tree label (it listed node keys, 't12'),
    # and clicking an item selects that row
    items = pg.eval_on_selector_all("#fd-results li", "els => els.map(e => e.textContent)")
    for i, text in enumerate(items):
        pg.click(f"#fd-results li:nth-child({i + 1})")
        idle(pg)
        assert text == pg.evaluate("() => window.__callpath.tree.selected.row.label")
        assert re.search(r"func[12]$", text)
    pg.click("#fd-close")
    # Copy from the context menu: label and visible values, tab-separated
    pg.click(".tv-row.selected .tv-label", button="right")
    pg.click("#ctx-menu [data-act=copy]")
    copied = pg.evaluate("() => window.__callpathClipboard")
    assert copied.split("\t")[0].endswith(label)
    assert len(copied.split("\t")) == 3
    # zoom in on the selected node, then out
    pg.click("#tb-zoom-in")
    idle(pg)
    assert model_rows(pg)[0]["label"].endswith(label)
    pg.click("#tb-zoom-out")
    idle(pg)
    assert model_rows(pg)[0]["label"] == "<program root>"
    # the Scope column is resized by dragging its right edge
    w0 = pg.locator(".tv-hcell.tv-tree").bounding_box()["width"]
    grip = pg.locator(".tv-grip").bounding_box()
    pg.mouse.move(grip["x"] + 3, grip["y"] + 5)
    pg.mouse.down()
    pg.mouse.move(grip["x"] + 103, grip["y"] + 5, steps=4)
    pg.mouse.up()
    assert pg.locator(".tv-hcell.tv-tree").bounding_box()["width"] == pytest.approx(w0 + 100, abs=2)
    # ... and back (the column fills the free width: 100 px more pushed the metric columns
    # out of the pane, where the header drag below could not reach them)
    grip = pg.locator(".tv-grip").bounding_box()
    pg.mouse.move(grip["x"] + 3, grip["y"] + 5)
    pg.mouse.down()
    pg.mouse.move(grip["x"] - 97, grip["y"] + 5, steps=4)
    pg.mouse.up()
    assert pg.locator(".tv-hcell.tv-tree").bounding_box()["width"] == pytest.approx(w0, abs=2)
    # font size
    h0 = pg.evaluate("() => window.__callpath.tree.rowHeight")
    pg.click("#tb-font-up")
    pg.click("#tb-font-up")
    assert pg.evaluate("() => window.__callpath.tree.rowHeight") > h0
    pg.click("#tb-font-down")
    pg.click("#tb-font-down")
    # a derived metric, then its formula edited in the columns dialog: the values follow
    db = view_server.dbs[LOOPS].path
    pg.click("#tb-derived")
    pg.fill("#dm-name", "twice")
    pg.fill("#dm-formula", "2*$0")
    pg.click("#dm-ok")
    pg.wait_for_function("() => window.__callpath.columns.some(c => c.name === 'twice')")
    idle(pg)
    pg.click("#tb-columns")
    dkey = pg.evaluate("() => window.__callpath.columns.find(c => c.name === 'twice').key")
    assert pg.input_value(f"#col-list tr[data-key='{dkey}'] td:nth-child(3) input") == "2*$0"
    pg.fill(f"#col-list tr[data-key='{dkey}'] td:nth-child(3) input", "3*$0")
    pg.click("#col-ok")
    pg.wait_for_function("() => window.__callpath.state.dbs[1].derived[0].formula === '3*$0'")
    idle(pg)
    root = report_json(db, "--derived", "twice=3*$0", "-m", "twice", "--depth", "0")[0]
    shown = model_rows(pg)[0]["text"][dkey]
    assert norm(shown).split()[0] == f"{root['metrics']['twice']:.2e}"
    pg.click("#tb-columns")
    pg.uncheck(f"#col-list tr[data-key='{dkey}'] input[type=checkbox]")
    pg.click("#col-ok")
    # columns: hide the exclusive column, rename the inclusive one, apply to all views
    pg.click("#tb-columns")
    pg.uncheck("#col-list tr[data-key=m0e] input[type=checkbox]")
    pg.fill("#col-list tr[data-key=m0i] input[type=text]", "time")
    pg.check("#col-all-views")
    pg.click("#col-ok")
    assert headers(pg) == ["time"]
    pg.click("#view-tabs [data-view=flat]")
    idle(pg)
    assert headers(pg) == ["time"]
    pg.click("#tb-columns")
    pg.click("#col-check-all")
    pg.click("#col-ok")
    assert headers(pg) == ["time", "CPUTIME (sec) (E)", "twice"]
    # drag a header onto another: the order changes
    pg.drag_and_drop(".tv-hcell[data-key=m0e]", ".tv-hcell[data-key=m0i]")
    assert headers(pg) == ["CPUTIME (sec) (E)", "time", "twice"]
    # flatten the Flat view: its top level becomes the files/procedures level
    before = [r["label"] for r in model_rows(pg) if r["depth"] == 1]
    pg.click("#tb-flatten")
    idle(pg)
    after = [r["label"] for r in model_rows(pg) if r["depth"] == 1]
    assert after != before and "loops.c" in after
    pg.click("#tb-unflatten")
    idle(pg)
    assert sorted(r["label"] for r in model_rows(pg) if r["depth"] == 1) == sorted(before)
    shot(pg, "flat-columns")


def test_reload_restores_state(page: Any, view_server: Any) -> None:
    """Everything a user set survives a reload (the state is in the URL)."""
    pg, base = page, view_server.url
    open_db(pg, base, LOOPS, "bottom-up")
    click_hot_path(pg)
    pg.click(".tv-hcell.tv-metric[data-key='m0e']")
    idle(pg)
    pg.click("#tb-derived")
    pg.fill("#dm-name", "ms")
    pg.fill("#dm-formula", "$0*1000")
    pg.click("#dm-ok")
    pg.wait_for_function("() => [...document.querySelectorAll('.tv-hname')]"
                         ".some(e => e.textContent === 'ms')")
    idle(pg)
    expand_to_depth(pg, 2)
    pg.click("#tb-threads")
    pg.fill("#th-filter", "THREAD 0")
    pg.click("#th-check")
    pg.fill("#th-filter", "THREAD 1")
    pg.click("#th-check")
    pg.click("#th-ok")
    idle(pg)
    pg.evaluate("() => window.__callpath.flushUrl()")
    before = (model_rows(pg), headers(pg), pg.url)
    sel = [r["label"] for r in before[0] if r["sel"]]
    pg.reload()
    pg.wait_for_selector(".tv-row")
    idle(pg)
    pg.wait_for_function("() => window.__callpath.tree.selected !== null")
    idle(pg)
    after = (model_rows(pg), headers(pg), pg.url)
    assert after[1] == before[1] == ["CPUTIME (sec) (I)", "CPUTIME (sec) (E)", "ms"]
    assert [(r["label"], r["depth"], r["open"], r["text"]) for r in after[0]] == \
        [(r["label"], r["depth"], r["open"], r["text"]) for r in before[0]]
    assert [r["label"] for r in after[0] if r["sel"]] == sel
    assert "▼" in pg.inner_text(".tv-hcell.sorted") and "(E)" in pg.inner_text(".tv-hcell.sorted")
    assert pg.get_attribute("#view-tabs [data-view=bottom-up]", "aria-selected") == "true"
    assert pg.is_visible(".badge:has-text('Thread view: 2 contexts')")
    # a shared link opens the same view in a fresh page
    pg2 = pg.context.new_page()
    pg2.goto(before[2])
    pg2.wait_for_selector(".tv-row")
    idle(pg2)
    assert headers(pg2) == before[1]
    shot(pg, "reloaded")


def test_trace_view(page: Any, view_server: Any) -> None:
    """Contexts × time on a canvas, one server sample per (row, pixel column); zoom by a
    rectangle, undo, home; call path, depth view, summary, statistics and mini-map."""
    pg, base = page, view_server.url
    open_db(pg, base, LOOPS, "top-down")
    assert pg.is_visible("#trace-tab")
    pg.click("#trace-tab")
    pg.wait_for_function("() => document.getElementById('tr-canvas').dataset.rows === '4'")
    width = int(pg.get_attribute("#tr-canvas", "data-width"))
    box = pg.locator("#tr-canvas").bounding_box()
    assert abs(width - box["width"]) <= 1  # asked for exactly one sample per pixel column
    pg.fill("#tr-depth", "2")
    pg.press("#tr-depth", "Enter")
    pg.wait_for_function(
        "() => document.getElementById('tr-range').textContent.includes('depth 2/')")
    trace_painted(pg)
    colours = pg.evaluate("""() => { const c = document.getElementById('tr-canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        const s = new Set();
        for (let i = 0; i < d.length; i += 4 * 97) s.add(d[i] << 16 | d[i+1] << 8 | d[i+2]);
        return s.size; }""")
    assert colours >= 2
    pg.wait_for_selector("#tr-stats tr")
    stats = pg.inner_text("#tr-stats")
    assert "main._omp_fn.0" in stats or "main" in stats
    # click: the call path at that point and the depth view of that context
    pg.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] * 0.4)
    pg.wait_for_selector("#tr-callpath li")
    frames = pg.eval_on_selector_all("#tr-callpath li", "els => els.map(e => e.textContent)")
    assert frames[0] in ("application thread", "main thread")
    pg.wait_for_function("() => document.getElementById('tr-depth-ctx').textContent"
                         ".includes('THREAD')")  # the depth view of that context arrived
    before = pg.inner_text("#tr-range")
    # rubber-band zoom on the middle half of the time axis
    pg.mouse.move(box["x"] + box["width"] * 0.25, box["y"] + 5)
    pg.mouse.down()
    pg.mouse.move(box["x"] + box["width"] * 0.75, box["y"] + 6, steps=5)
    pg.mouse.up()
    pg.wait_for_function("(b) => document.getElementById('tr-range').textContent !== b", arg=before)
    zoomed = pg.evaluate("() => window.__callpath.trace.win")
    meta = pg.evaluate("() => window.__callpath.trace.meta")
    span = meta["t1"] - meta["t0"]
    assert 0.4 * span < zoomed["t1"] - zoomed["t0"] < 0.6 * span
    trace_painted(pg)
    shot(pg, "trace-zoomed")
    # the trace window and depth are in the URL: a reload comes back to them
    pg.evaluate("() => window.__callpath.flushUrl()")
    zoomed_text = pg.inner_text("#tr-range")
    pg.reload()
    pg.wait_for_function("() => document.getElementById('tr-canvas').dataset.rows === '4'")
    pg.wait_for_function("(t) => document.getElementById('tr-range').textContent === t",
                         arg=zoomed_text)
    pg.click("#tr-home")
    pg.wait_for_function("(b) => document.getElementById('tr-range').textContent === b",
                         arg=before.replace("depth 2/", "depth 2/"))
    pg.mouse.move(box["x"] + box["width"] * 0.25, box["y"] + 5)
    pg.mouse.down()
    pg.mouse.move(box["x"] + box["width"] * 0.75, box["y"] + 6, steps=5)
    pg.mouse.up()
    pg.wait_for_function("(b) => document.getElementById('tr-range').textContent !== b", arg=before)
    pg.click("#tr-undo")
    pg.wait_for_function("(b) => document.getElementById('tr-range').textContent === b", arg=before)
    pg.click("#tr-zin")
    pg.click("#tr-right")
    pg.click("#tr-home")
    pg.wait_for_function("(b) => document.getElementById('tr-range').textContent === b", arg=before)
    trace_painted(pg)
    shot(pg, "trace")
    # from a sample to its calling context in the Top-down view
    pg.mouse.click(box["x"] + box["width"] / 3, box["y"] + box["height"] * 0.4)
    pg.wait_for_selector("#tr-show-node")
    node = pg.evaluate("() => window.__callpath.trace.lastCallpath.node")
    pg.click("#tr-show-node")
    pg.wait_for_selector(".tv-row")
    idle(pg)
    pg.wait_for_function("(k) => { const s = window.__callpath.tree.selected;"
                         " return s !== null && s.row.key === k; }", arg=node)
    assert pg.get_attribute("#view-tabs [data-view=top-down]", "aria-selected") == "true"
    shot(pg, "trace-to-top-down")


# ---- a wide node: paging and virtual scrolling -----------------------------------------


@pytest.fixture(scope="module")
def wide_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A generated database (bench/read_db.py's tree, 20,000 nodes) with one node of 1,000
    children (bench/viewer.py's addition); returns (path, Top-down key of the wide node)."""
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import read_db
        import viewer
    finally:
        sys.path.pop(0)
    from callpath.formats.v4.writer import write_v4

    original = read_db.generate_tree
    wide: dict[str, int] = {}

    def generate(*a: Any, **k: Any) -> dict[str, Any]:
        tree = viewer.add_wide_node(original(*a, **k))
        wide["node"] = tree["wide_node"]
        return tree

    read_db.generate_tree = generate
    try:
        exp = read_db.build_experiment_for(20000, 2, 0)
    finally:
        read_db.generate_tree = original
    out = tmp_path_factory.mktemp("wide") / "wide.d"
    write_v4(exp, out, copy_sources=False)
    return out, f"t{int(exp.cct.ctx_id[wide['node']])}"


def test_wide_node_pages_and_virtual_rows(page: Any, wide_db: tuple[Path, str],
                                          tmp_path: Path) -> None:
    """1,000 children: one page of 200 rows is fetched on expansion, the rest only when
    scrolled into view; the DOM holds only the rows in view; the sorted order across pages
    is the report's (CSV of the whole expanded node equals report --zoom --depth 1)."""
    from view_support import serve

    db, key = wide_db
    pg = page
    with serve([db]) as server:
        open_db(pg, server.url, 0, "top-down", views={"top-down": {"zoom": [key]}})
        assert pg.evaluate("() => window.__callpath.tree.root.row.key") == key
        total = pg.evaluate("() => window.__callpath.tree.root.total")
        assert total >= 1000  # the 1,000 added and the node's own
        rows = model_rows(pg)
        assert len(rows) == 201  # the root and the first page
        assert pg.evaluate("() => window.__callpath.tree.rows.length") == total + 1
        in_dom = pg.locator(".tv-row:not([hidden])").count()
        row_h = pg.evaluate("() => window.__callpath.tree.rowHeight")
        view_h = pg.evaluate("() => window.__callpath.tree.scroller.clientHeight")
        assert in_dom <= view_h // row_h + 3
        # jump to the bottom: only the page holding the last rows is fetched
        pg.evaluate("() => { const s = window.__callpath.tree.scroller;"
                    " s.scrollTop = s.scrollHeight; }")
        pg.wait_for_function("""() => { const t = window.__callpath.tree;
            const r = [...document.querySelectorAll('.tv-row:not([hidden])')].pop();
            return r && Number(r.dataset.index) === t.rows.length - 1; }""")
        idle(pg)
        loaded = len(model_rows(pg))
        assert 201 < loaded <= 201 + 400
        last = dom_rows(pg)[-1]
        assert last["key"] and last["label"] != "…"
        assert pg.locator(".tv-row:not([hidden])").count() <= view_h // row_h + 3
        shot(pg, "wide-node-bottom")
        # scroll through everything: all pages arrive and the CSV is the report's
        pg.evaluate("""async () => { const s = window.__callpath.tree.scroller;
            for (let y = 0; y < s.scrollHeight; y += s.clientHeight) {
                s.scrollTop = y; await new Promise(r => setTimeout(r, 30)); } }""")
        idle(pg)
        pg.wait_for_function("() => window.__callpath.tree.rows.every(e => e.row)")
        csv = download_csv(pg, tmp_path)
        ctx = key[1:]
        assert csv == report(db, "--zoom", ctx, "--depth", "1", "--format", "csv")
        assert len(csv.splitlines()) == 1 + 1 + total


def test_token_and_error_bar(page: Any, view_server: Any) -> None:
    """On a non-loopback bind the page opened with ?token= works (the front end sends the
    token on every request); a server error is shown in the dismissable bar."""
    from view_support import serve

    pg = page
    with serve([view_server.dbs[SMALL].path], host="0.0.0.0") as server:
        assert server.token
        base = f"http://127.0.0.1:{server.port}"
        resp = pg.goto(f"{base}/")
        assert resp is not None and resp.status == 403
        pg.goto(f"{base}/?token={server.token}#s=" + urllib.parse.quote(json.dumps(
            {"db": 0, "filters": [], "dbs": {}})))
        pg.wait_for_selector(".tv-row")
        idle(pg)
        assert model_rows(pg)[0]["label"] == "<program root>"
        assert pg.is_hidden("#error-bar")
    # a bad regular expression in Find: the server's one-line error in the bar, dismissable
    open_db(pg, view_server.url, SMALL)
    pg.click("#tb-find")
    pg.fill("#fd-text", "([")
    pg.check("#fd-regex")
    pg.click("#fd-go")
    pg.wait_for_selector("#error-bar:not([hidden])")
    assert "regular expression" in pg.inner_text("#error-text").lower() or \
        "regex" in pg.inner_text("#error-text").lower()
    shot(pg, "error-bar")
    pg.click("#error-close")
    assert pg.is_hidden("#error-bar")


def test_bottom_up_first_expansion_by_click(page: Any, tmp_path: Path) -> None:
    """A fresh server (no node materialized by an earlier test): clicking ▸ on Bottom-up
    nodes opens them on the first click. Bottom-up materializes a node's children when they
    are first asked for, and the server computed the sort column before that: every first
    expansion of a node with two or more callers was a 500 ('internal error (IndexError)')
    in the red bar and the node stayed closed. The opened tree is ``report --depth 3``'s."""
    from view_support import copy_database, database_sources, serve

    pg = page
    db = copy_database(database_sources()[SMALL], tmp_path)
    with serve([db]) as server:
        open_db(pg, server.url, 0, "bottom-up")
        for depth in (1, 2):  # the root (depth 0) is open
            keys = pg.evaluate("""(d) => window.__callpath.tree.rows.filter(
                e => e.row && e.depth === d && e.row.has_children && !e.kids)
                .map(e => e.row.key)""", depth)
            assert keys or depth > 1
            for key in keys:
                pg.evaluate("""(k) => { const t = window.__callpath.tree;
                    t.reveal(t.rows.find(e => e.row && e.row.key === k)); }""", key)
                row = f".tv-row:not([hidden])[data-key='{key}']"
                pg.click(f"{row} .tv-toggle")
                pg.wait_for_selector(f"{row}[aria-expanded='true']")
                idle(pg)
        assert pg.is_hidden("#error-bar"), pg.inner_text("#error-text")
        shot(pg, "bottom-up-clicked-open")
        assert download_csv(pg, tmp_path) == report(db, "--view", "bottom-up", "--depth", "3",
                                                    "--format", "csv")


def test_graph_axis_labels_of_named_threads(page: Any, tmp_path: Path) -> None:
    """The Graph's context labels do not run into each other: four threads named like a
    ThreadPoolExecutor's ('THREAD 1 (ThreadPoolExecutor-0_0)', ~190 px each at 150 px per
    tick) were written over one another, unreadable. The names are dropped where they do not
    fit ('THREAD 1'), and the context numbers are used where even that does not fit."""
    import dataclasses

    from callpath.formats.v4.names import RELPATH, names_document
    from callpath.formats.v4.reader import read_v4
    from view_support import copy_database, database_sources, serve

    pg = page
    db = copy_database(database_sources()[LOOPS], tmp_path)
    profiles = read_v4(db).profiles
    named = [p if p.is_summary else dataclasses.replace(p, name=f"ThreadPoolExecutor-0_{k}")
             for k, p in enumerate(profiles)]
    doc = names_document(named)
    assert doc is not None
    (db / RELPATH).parent.mkdir(exist_ok=True)
    (db / RELPATH).write_text(doc)
    with serve([db]) as server:
        open_db(pg, server.url, 0, "top-down")
        pg.click(".tv-row:not([hidden]) .tv-label >> nth=1")
        pg.click("#tb-plot")
        pg.wait_for_function("() => window.__callpath.plot.data !== null")
        labels = pg.evaluate("() => window.__callpath.plot.data.labels")
        assert all("(ThreadPoolExecutor-0_" in s for s in labels), labels
        for width in (720, 300):  # the dialog's canvas, then a narrow one: the ids only
            pg.evaluate("(w) => { const p = window.__callpath.plot;"
                        " p.canvas.width = w; p.draw(); }", width)
            ticks = pg.evaluate("() => window.__callpath.plot.ticks")
            assert len(ticks) == 4, ticks
            for a, b in itertools.pairwise(ticks):
                assert a["right"] + 4 <= b["left"], (width, ticks)
            if width == 720:
                for t in ticks:  # 'THREAD k': the label without the name and shared words
                    words = re.sub(r" \(.*\)$", "", labels[int(t["x"])]).split()
                    assert t["text"] == " ".join(words[-2:]) and words[-2] == "THREAD"
            else:  # each context by its id (the thread's number), not by its index
                assert [t["text"] for t in ticks] == [
                    re.sub(r" \(.*\)$", "", labels[int(t["x"])]).split()[-1] for t in ticks]
        pg.evaluate("() => { const p = window.__callpath.plot; p.canvas.width = 720; p.draw(); }")
        shot(pg, "plot-named-threads")


def test_trace_statistics_of_a_long_name(page: Any, tmp_path: Path) -> None:
    """The trace's statistics keep every percentage inside the side bar: a procedure name
    with no break opportunity (Python's ThreadPoolExecutor._adjust_thread_count, or this
    program's function) widened the table and pushed the percentages out of view. The name
    is cut with an ellipsis and kept whole in the cell's title. A real profile of a
    program whose only work is in that function."""
    from view_support import serve

    long = "procedure_with_a_long_name_that_has_no_break_opportunity_anywhere"
    program = tmp_path / "long.py"
    program.write_text(f"def {long}(n):\n    s = 0\n    for i in range(n):\n"
                       f"        s += i % 7\n    return s\n\n\n{long}(2_000_000)\n")
    db = tmp_path / "long.d"
    run_cli("profile", "-t", "-m", str(tmp_path / "m"), "-o", str(db), "--",
            sys.executable, str(program), check=True)
    pg = page
    with serve([db]) as server:
        open_db(pg, server.url, 0, "top-down")
        pg.click("#trace-tab")
        pg.fill("#tr-depth", "20")  # deeper than any sample: each shows its deepest frame
        pg.press("#tr-depth", "Enter")
        trace_painted(pg)
        pg.wait_for_function("(n) => [...document.querySelectorAll('#tr-stats td')]"
                             ".some(td => td.title === n)", arg=long)
        cells = pg.evaluate("""() => {
            const side = document.querySelector('.trace-side').getBoundingClientRect();
            return [...document.querySelectorAll('#tr-stats tr')].map(tr => {
                const [a, b] = tr.querySelectorAll('td'), r = b.getBoundingClientRect();
                return {name: a.title, pct: b.textContent, right: r.right,
                        side: side.right, wide: b.scrollWidth > b.clientWidth}; }); }""")
        assert any(c["name"] == long for c in cells)
        for c in cells:
            assert re.fullmatch(r"\d+\.\d%", c["pct"]), c
            assert c["right"] <= c["side"] and not c["wide"], c
        shot(pg, "trace-stats-long-name")


def test_server_gone_is_one_line_in_the_error_bar(page: Any, tmp_path: Path) -> None:
    """The server stops (its machine went away, the tunnel closed) while the page is open:
    expanding a node, sorting and saving a derived metric each say so in the error bar, and
    nothing escapes as an uncaught error (the ``page`` fixture fails on any)."""
    from view_support import copy_database, database_sources, serve

    db = copy_database(database_sources()[SMALL], tmp_path)
    with serve([db]) as server:
        open_db(page, server.url, 0)
    page.locator(".tv-row").nth(1).locator(".tv-toggle").click()
    page.wait_for_selector("#error-bar:not([hidden])")
    assert "did not answer" in page.inner_text("#error-text")
    page.evaluate("() => { document.getElementById('error-bar').hidden = true; }")
    # a POST (the derived metric's check) that finds no server: the same bar, no rejection
    page.evaluate("""async () => {
        const api = await import('/static/api.js');
        try { await api.postJSON('/api/db/0/derived/check', {formula: '$0'}); } catch (_) {}
        api.postJSON('/api/db/0/derived/check', {formula: '$0'});  // not awaited: unhandled
    }""")
    page.wait_for_selector("#error-bar:not([hidden])")
    assert "did not answer" in page.inner_text("#error-text")
    page.wait_for_timeout(300)  # an unhandled rejection would be reported by now
    shot(page, "server-gone")
