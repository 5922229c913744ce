"""Browser tests of the viewer's Lines tab (PerfVisS, seeds/003): Debian's Chromium driven by
Playwright against a REAL server over copies of the real databases in ../shared/data
(``view_server``: 0 small.d, 1 loops-cputime-t.d with 4 threads, 2 the Hatchet cpi database
with 4 ranks and a copy of cpi.c). What the page shows is compared with what the library
(:mod:`callpath.analysis.lines`) computes from the same database opened in the test:
every heat-map cell, the min/max of every line, the source text of every row, the overview's
rectangles, the ranked list.

Screenshots go to tests/artifacts/view/lines-*.png (ignored by git): look at them.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import callpath
import test_lines_measured as measured_run
import test_view_browser as tvb
from callpath.analysis import lines as lm
from test_view_browser import ARTIFACTS, idle
from view_support import get_json as view_server_get
from view_support import serve, view_server_fixture  # noqa: F401

# the browser tests' fixtures: one Chromium for the module, a fresh page per test
browser = tvb.browser
page = tvb.page
# a real OpenMP run (thread k does k+1 units on line 12), profiled with instruction addresses
measured = measured_run.measured

SMALL, LOOPS, CPI = 0, 1, 2


# ---- helpers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def experiments(view_server: Any) -> Iterator[dict[int, Any]]:
    """The served databases, opened in the test process (the library's side of each check)."""
    yield {i: callpath.open(str(view_server.dbs[i].path)) for i in (LOOPS, CPI)}


def view_server_json(server: Any, path: str, **params: Any) -> Any:
    return view_server_get(server.url, path, **params)


def lines_url(base: str, db: int, **lines: Any) -> str:
    state = {"db": db, "dbs": {str(db): {"mode": "lines", "lines": lines}}, "filters": []}
    return f"{base}/#s={urllib.parse.quote(json.dumps(state))}"


def settled(pg: Any) -> None:
    """No Lines request in flight (twice, one frame apart: a reply may start another)."""
    for _ in range(2):
        pg.wait_for_function("() => document.getElementById('lines').dataset.pending === '0'")
        pg.wait_for_timeout(60)


def open_lines(pg: Any, base: str, db: int, **lines: Any) -> None:
    pg.goto(lines_url(base, db, **lines))
    pg.wait_for_selector("#ln-heat .ln-row")
    settled(pg)


def shot(pg: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"lines-{name}.png"
    pg.screenshot(path=str(path))
    return path


def heat_rows(pg: Any) -> list[dict[str, Any]]:
    """Every row of the heat map as drawn: its axis row, cell texts, raw values (titles),
    colours, and the min/max and source rows beside it (with their vertical positions)."""
    return pg.evaluate("""() => [...document.querySelectorAll('#ln-heat .ln-row')].map(r => {
        const row = r.dataset.row;
        const mm = document.querySelector(`#ln-mm [data-row="${row}"]`);
        const src = document.querySelector(`#ln-src [data-row="${row}"]`);
        const cells = [...r.querySelectorAll('.ln-cell')];
        return {row: Number(row), top: r.getBoundingClientRect().top,
                mm_top: mm.getBoundingClientRect().top, src_top: src.getBoundingClientRect().top,
                texts: cells.map(c => c.textContent),
                values: cells.map(c => Number(c.dataset.value)),
                colours: cells.map(c => getComputedStyle(c).backgroundColor),
                min: mm.dataset.min === undefined ? null : Number(mm.dataset.min),
                max: mm.dataset.max === undefined ? null : Number(mm.dataset.max),
                mean: mm.dataset.mean === undefined ? null : Number(mm.dataset.mean),
                stdev: mm.dataset.stdev === undefined ? null : Number(mm.dataset.stdev),
                min_context: mm.dataset.minContext || null,
                max_context: mm.dataset.maxContext || null,
                mm_text: mm.textContent,
                line: Number(src.querySelector('.ln-ln').textContent || 0),
                text: src.querySelector('.ln-tx').textContent,
                selected: r.getAttribute('aria-selected') === 'true'};
    })""")


def lines_state(pg: Any) -> dict[str, Any]:
    return pg.evaluate("() => JSON.parse(JSON.stringify(window.__callpath.lines.st))")


def overview_click_point(pg: Any, b: int) -> tuple[float, float]:
    """Page coordinates of the middle of overview bin ``b`` (strip b // L, row b % L)."""
    g = json.loads(pg.get_attribute("#ln-overview", "data-geometry"))
    L = pg.evaluate("() => window.__callpath.lines.ov.strip")
    box = pg.locator("#ln-overview").bounding_box()
    strip, r = divmod(b, L)
    return (box["x"] + strip * (g["sw"] + g["gap"]) + g["sw"] / 2,
            box["y"] + (r + 0.5) * g["bh"])


# ---- the panes -------------------------------------------------------------------------


def test_detail_heat_map_source_and_min_max(page: Any, view_server: Any,
                                            experiments: dict[int, Any]) -> None:
    """The detailed view of the 4-thread loops database: every cell's value is the matrix's,
    lines without cost are black, the normalise switch recolours the window's hottest cell,
    min/max per line are the library's with their contexts, and the heat map, the min/max
    bars and the source listing are aligned row for row. On the cpi database the source
    rows are the lines of cpi.c as copied into the database."""
    pg, base = page, view_server.url
    m = lm.build_line_matrix(experiments[LOOPS], 0)
    open_lines(pg, base, LOOPS, start=0, count=12, row=5)
    rows = heat_rows(pg)
    assert [r["row"] for r in rows] == list(range(12))
    dense = lm.window(m, 0, 12)
    st = lm.line_stats(m, np.arange(12))
    for i, r in enumerate(rows):
        assert r["values"] == pytest.approx(dense[i].tolist(), rel=1e-12, abs=0)
        assert all(t for t in r["texts"])  # a value printed in every cell
        assert r["top"] == r["mm_top"] == r["src_top"]  # aligned line for line
        assert r["line"] == int(m.line_of_row[i])
        if dense[i].sum() == 0:
            assert set(r["colours"]) == {"rgb(0, 0, 0)"}, "a line without cost is black"
            assert r["min"] is None
        else:
            assert "rgb(0, 0, 0)" not in r["colours"]
            assert r["min"] == pytest.approx(float(st["min"][i]))
            assert r["max"] == pytest.approx(float(st["max"][i]))
            assert r["min_context"] == m.labels[int(st["min_context"][i])]
            assert r["max_context"] == m.labels[int(st["max_context"][i])]
            assert f"({m.short_labels[int(st['max_context'][i])]})" in r["mm_text"]
            assert r["mean"] == pytest.approx(float(st["mean"][i]))
            assert r["stdev"] == pytest.approx(float(st["stdev"][i]))
            assert "μ " in r["mm_text"] and "σ " in r["mm_text"]
    assert [r["selected"] for r in rows] == [i == 5 for i in range(12)]
    # the keyboard moves the cursor: a line down, a context right (the cell outlined)
    pg.click("#ln-src [data-row='5']")
    pg.press("#ln-detail", "ArrowDown")
    pg.press("#ln-detail", "ArrowRight")  # no context yet: the first one
    pg.press("#ln-detail", "ArrowRight")
    pg.wait_for_selector("#ln-heat .ln-row[data-row='6'] .ln-cell.cur[data-ctx='1']")
    cur = pg.eval_on_selector_all("#ln-heat .ln-cell.cur", "cs => cs.map(c => c.dataset.ctx)")
    assert cur == ["1"] and lines_state(pg)["row"] == 6

    # normalised to the program, the window's hottest cell is not the hottest colour (the
    # program's hottest cell lies outside these rows); normalised to the window, it is
    hot_row, hot_col = np.unravel_index(int(np.argmax(dense)), dense.shape)
    assert dense.max() < m.vals.max()
    red = "rgb(230, 30, 20)"
    assert rows[hot_row]["colours"][hot_col] != red
    pg.select_option("#ln-norm", "window")
    pg.wait_for_function("() => document.getElementById('ln-detail').dataset.norm === 'window'")
    rows = heat_rows(pg)
    assert rows[hot_row]["colours"][hot_col] == red
    assert sum(c == red for r in rows for c in r["colours"]) == int((dense == dense.max()).sum())
    shot(pg, "detail-window-normalised")

    # the cpi database: its own copy of cpi.c, every line of it a row of the axis
    mc = lm.build_line_matrix(experiments[CPI], 0)
    fi = next(i for i, ok in enumerate(mc.readable) if ok)
    text = lm.source_text(mc, fi)
    assert text
    first = int(mc.file_start[fi])
    open_lines(pg, base, CPI, start=first, count=30, row=first + 26)
    rows = heat_rows(pg)
    assert [r["text"] for r in rows] == text[:30]
    assert [r["line"] for r in rows] == list(range(1, 31))
    assert all(r["top"] == r["src_top"] for r in rows)
    shot(pg, "detail-cpi-source")


def test_three_d_profile_rotates_and_zooms(page: Any, view_server: Any) -> None:
    """The 3-D surface of the window: a drag changes the rotation and the pixels, the wheel
    the zoom; selecting another window redraws it."""
    pg, base = page, view_server.url
    open_lines(pg, base, LOOPS, start=0, count=38)
    cv = pg.locator("#ln-3d")
    before = cv.screenshot()
    view0 = cv.get_attribute("data-view")
    box = cv.bounding_box()
    cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    pg.mouse.move(cx, cy)
    pg.mouse.down()
    pg.mouse.move(cx + 80, cy + 30, steps=5)
    pg.mouse.up()
    view1 = cv.get_attribute("data-view")
    after = cv.screenshot()
    assert view1 != view0
    yaw0, pitch0, _ = map(float, view0.split(","))
    yaw1, pitch1, _ = map(float, view1.split(","))
    assert yaw1 == pytest.approx(yaw0 + 0.8, abs=1e-3) and pitch1 == pytest.approx(pitch0 + 0.3,
                                                                                    abs=1e-3)
    assert after != before, "the 3-D profile did not change after a drag"
    shot(pg, "3d-rotated")
    pg.mouse.move(cx, cy)
    pg.mouse.wheel(0, -300)
    pg.wait_for_function(f"() => document.getElementById('ln-3d').dataset.view !== '{view1}'")
    assert float(cv.get_attribute("data-view").split(",")[2]) > 1.0
    assert cv.screenshot() != after


def test_overview_click_moves_detail_and_rectangles_wrap(page: Any, view_server: Any,
                                                         experiments: dict[int, Any]) -> None:
    """Strips of 3 bins of 4 lines over the loops database's 38 lines: the detail window's
    rectangle is the library's wrapping of the same rows, split across strips; a click on
    each bin of the overview moves the detail there and selects the bin's first line."""
    pg, base = page, view_server.url
    m = lm.build_line_matrix(experiments[LOOPS], 0)
    ov = lm.overview(m, 50, 4, "max", 3, context_bins=64)
    open_lines(pg, base, LOOPS, start=0, count=20, strip=3, bin=4, skip=50)
    assert int(pg.get_attribute("#ln-overview", "data-bins")) == ov.n_orows
    assert int(pg.get_attribute("#ln-overview", "data-strips")) == ov.n_strips > 2
    got = json.loads(pg.get_attribute("#ln-overview", "data-window"))
    assert got == [list(r) for r in ov.rectangles(0, 19)]
    assert len(got) > 1, "the window's rectangle should be split across strips"
    shot(pg, "overview-strips")
    for b in range(ov.n_orows):
        x, y = overview_click_point(pg, b)
        pg.mouse.click(x, y)
        want = int(ov.inv_first[b])
        pg.wait_for_function(f"() => document.getElementById('ln-detail').dataset.row === '{want}'")
        settled(pg)
        d = pg.locator("#ln-detail")
        start, count = int(d.get_attribute("data-start")), int(d.get_attribute("data-count"))
        assert start <= want < start + count
        assert [r["row"] for r in heat_rows(pg) if r["selected"]] == [want]
        got = json.loads(pg.get_attribute("#ln-overview", "data-window"))
        assert got == [list(r) for r in ov.rectangles(start, start + count - 1)]


def test_ranked_procedures_and_overview_outlines(page: Any, view_server: Any,
                                                 experiments: dict[int, Any]) -> None:
    """Figure 5's list is the library's; selecting a procedure outlines its code segment in
    the overview and moves the detail there; the title row outlines every listed procedure;
    a line whose procedure is not in the top n appends it, highlighted."""
    pg, base = page, view_server.url
    m = lm.build_line_matrix(experiments[LOOPS], 0)
    ov = lm.overview(m, 50, 4, "max", 80, context_bins=64)
    top = lm.ranked_procedures(m, 3)
    open_lines(pg, base, LOOPS, n=3, start=0, count=10)
    listed = pg.eval_on_selector_all("#ln-ranked tbody tr", "trs => trs.map(t => "
                                     "[...t.children].map(c => c.textContent))")
    assert [r[1] for r in listed] == [p["procedure"] for p in top]
    assert [float(r[4]) for r in listed] == pytest.approx([p["percent"] for p in top], abs=0.06)
    second = top[1]
    pg.click("#ln-ranked tbody tr:nth-child(2)")
    settled(pg)
    assert pg.get_attribute("#ln-ranked tbody tr:nth-child(2)", "aria-selected") == "true"
    procs = json.loads(pg.get_attribute("#ln-overview", "data-procedures"))
    assert procs == [[list(r) for r in ov.rectangles(second["first_row"], second["last_row"])]]
    start = int(pg.get_attribute("#ln-detail", "data-start"))
    assert start == second["first_row"]
    shot(pg, "ranked-selected")
    pg.click("#ln-ranked-title")
    settled(pg)
    procs = json.loads(pg.get_attribute("#ln-overview", "data-procedures"))
    assert procs == [[list(r) for r in ov.rectangles(p["first_row"], p["last_row"])]
                     for p in top]
    shot(pg, "ranked-all")
    # a line of a procedure outside the top 3: appended at the bottom and highlighted
    ranks = {p["procedure"] for p in top}
    row = next(r for r in range(m.n_rows) if int(m.row_proc[r]) >= 0
               and m.procedures[int(m.row_proc[r])] not in ranks)
    pg.evaluate(f"() => window.__callpath.lines.jumpTo({row})")
    pg.wait_for_selector("#ln-ranked tbody tr.appended")
    settled(pg)
    last = pg.locator("#ln-ranked tbody tr").last
    assert last.get_attribute("class").split() == ["sel", "appended"] or \
        set(last.get_attribute("class").split()) == {"sel", "appended"}
    assert last.get_attribute("data-procedure") == lm.procedure_at(m, row)["procedure"]
    assert pg.locator("#ln-ranked tbody tr").count() == 4


def test_assembler_pane(page: Any, view_server: Any, experiments: dict[int, Any]) -> None:
    """For the selected line the pane lists the library's instructions (line ± N) or says
    why there are none (the load module cannot be read here)."""
    pg, base = page, view_server.url
    exp = experiments[LOOPS]
    m = lm.build_line_matrix(exp, 0)
    row = int(np.argmax(m.row_sum))
    open_lines(pg, base, LOOPS, row=row, start=max(0, row - 3), count=10, around=1)
    f, line = m.files[int(m.file_of_row[row])], int(m.line_of_row[row])
    listing = lm.line_instructions(exp, f, line, 1)
    pg.wait_for_function("() => document.getElementById('ln-asm').dataset.state")
    shot(pg, "assembler")
    if listing:
        assert pg.locator("#ln-asm .ln-ins").count() == len(listing)
    else:
        assert listing.reason
        assert pg.inner_text("#ln-asm").strip() == listing.reason
    assert pg.inner_text("#ln-asm-info") == f"{Path(f).name}:{line} ±1"


# ---- linking with the rest of the viewer -----------------------------------------------


def test_lines_and_trees_link_both_ways(page: Any, view_server: Any,
                                        experiments: dict[int, Any]) -> None:
    """From a line to its hottest calling context in Top-down; from a line scope of the
    Top-down tree (context menu "Show in Lines") to the Lines tab at that line, with its
    procedure outlined and highlighted."""
    pg, base = page, view_server.url
    exp = experiments[LOOPS]
    m = lm.build_line_matrix(exp, 0)
    row = int(np.argmax(m.row_sum))
    line = int(m.line_of_row[row])
    open_lines(pg, base, LOOPS, row=row, start=max(0, row - 3), count=10)
    pg.wait_for_selector("#ln-ctxs li[data-key]")
    key = pg.get_attribute("#ln-ctxs li[data-key]", "data-key")
    pg.click("#ln-topdown")
    pg.wait_for_function(f"() => window.__callpath.tree.selected && "
                         f"window.__callpath.tree.selected.row.key === '{key}'")
    idle(pg)
    assert pg.get_attribute("#view-tabs [data-view=top-down]", "aria-selected") == "true"
    assert pg.is_hidden("#lines") and pg.is_visible("#tree")
    sel = pg.evaluate("() => window.__callpath.tree.selected.row")
    assert sel["line"] == line and sel["type"] == "statement"
    # the node is the hottest line scope of that line: its exclusive value is the largest
    nodes = np.nonzero(m.node_rows() == row)[0]
    hottest = int(nodes[np.argmax(exp.exclusive(0)[nodes])])
    assert key == f"t{int(exp.cct.ctx_id[hottest])}"
    shot(pg, "to-top-down")

    # back: another line scope of the tree, through the context menu
    other = pg.evaluate("""(key) => window.__callpath.tree.rows.filter(e => e.row &&
        e.row.type === 'statement' && e.row.key !== key).map(e => e.row)[0] || null""", key)
    if other is None:  # no other line scope on screen: the selected one
        other = pg.evaluate("() => window.__callpath.tree.selected.row")
    pg.click(f".tv-row[data-key='{other['key']}'] .tv-label", button="right")
    pg.click("#ctx-menu [data-act=lines]")
    pg.wait_for_selector("#lines:not([hidden]) #ln-heat .ln-row")
    settled(pg)
    assert pg.get_attribute("#view-tabs [data-view=lines]", "aria-selected") == "true"
    st = lines_state(pg)
    assert int(m.line_of_row[st["row"]]) == other["line"]
    assert m.files[int(m.file_of_row[st["row"]])] == other["file"]
    assert [r["row"] for r in heat_rows(pg) if r["selected"]] == [st["row"]]
    want = lm.procedure_at(m, st["row"])
    assert pg.get_attribute("#ln-ranked tbody tr.sel", "data-procedure") == want["procedure"]
    shot(pg, "from-top-down")

    # the cursor follows a plain selection in a tree too: select a line scope in Top-down,
    # come back to the Lines tab, and it is there
    pg.click("#view-tabs [data-view=top-down]")
    pg.wait_for_selector(".tv-row")
    idle(pg)
    rows = pg.evaluate("""() => window.__callpath.tree.rows.filter(e => e.row &&
        e.row.type === 'statement' && e.row.file).map(e => e.row)""")
    target = next((r for r in rows if r["line"] != int(m.line_of_row[st["row"]])), rows[0])
    pg.click(f".tv-row[data-key='{target['key']}'] .tv-label")
    pg.click("#view-tabs [data-view=lines]")
    pg.wait_for_function(f"() => document.getElementById('ln-where').textContent"
                         f".includes(':{target['line']}')")
    settled(pg)
    st = lines_state(pg)
    assert int(m.line_of_row[st["row"]]) == target["line"]
    assert [r["row"] for r in heat_rows(pg) if r["selected"]] == [st["row"]]


def test_cell_opens_thread_view_at_the_line(page: Any, view_server: Any,
                                             experiments: dict[int, Any]) -> None:
    """A double click on a heat-map cell: the Thread view of that context (badge, every
    column of the tree restricted) in Top-down, at the line's hottest calling context in that
    context; back in the Lines tab, the matrix has that context only."""
    pg, base = page, view_server.url
    exp = experiments[LOOPS]
    m = lm.build_line_matrix(exp, 0)
    row = int(np.argmax(m.row_sum))
    open_lines(pg, base, LOOPS, row=row, start=max(0, row - 3), count=8)
    col = 2
    ctx_index = pg.evaluate(f"() => window.__callpath.lines.meta.context_index[{col}]")
    assert [exp.contexts[i].index for i in ctx_index] == m.column_profiles[col]
    want = view_server_json(view_server, f"/api/db/{LOOPS}/lines/contexts", row=row,
                            threads=json.dumps(ctx_index))["nodes"][0]["key"]
    pg.dblclick(f"#ln-heat .ln-row[data-row='{row}'] .ln-cell[data-ctx='{col}']")
    pg.wait_for_function(f"() => window.__callpath.tree.selected && "
                         f"window.__callpath.tree.selected.row.key === '{want}'")
    idle(pg)
    assert pg.get_attribute("#view-tabs [data-view=top-down]", "aria-selected") == "true"
    assert pg.is_visible(".badge:has-text('Thread view: 1 context')")
    assert pg.evaluate("() => window.__callpath.state.dbs[1].threads") == ctx_index
    shot(pg, "cell-thread-view")
    pg.click("#view-tabs [data-view=lines]")
    pg.wait_for_selector("#lines:not([hidden]) #ln-heat .ln-row")
    settled(pg)
    assert pg.evaluate("() => window.__callpath.lines.meta.contexts") == [m.labels[col]]


def test_lines_state_in_url_and_database_switch(page: Any, view_server: Any) -> None:
    """Metric, window, normalisation and overview parameters survive a reload and open the
    same panes from a shared link; switching database tabs leaves no pane on the previous
    database's file (the source pane of the profile view included)."""
    pg, base = page, view_server.url
    open_lines(pg, base, LOOPS, start=4, count=8, row=6)
    pg.fill("#ln-count", "9")
    pg.press("#ln-count", "Enter")
    pg.select_option("#ln-reduce", "sum")
    pg.select_option("#ln-norm", "window")
    settled(pg)
    pg.evaluate("() => window.__callpath.flushUrl()")
    url = pg.url
    before = heat_rows(pg)
    pg.reload()
    pg.wait_for_selector("#ln-heat .ln-row")
    settled(pg)
    assert [(r["row"], r["colours"]) for r in heat_rows(pg)] == \
        [(r["row"], r["colours"]) for r in before]
    assert pg.input_value("#ln-count") == "9" and pg.input_value("#ln-reduce") == "sum"
    assert pg.evaluate("() => window.__callpath.lines.ov.reduce") == "sum"
    pg2 = pg.context.new_page()
    pg2.goto(url)
    pg2.wait_for_selector("#ln-heat .ln-row")
    settled(pg2)
    assert [r["row"] for r in heat_rows(pg2)] == [r["row"] for r in before]
    pg2.close()

    # the profile view of the cpi database shows cpi.c; another database's tab must not (a
    # fresh page: the profile view of every database)
    pg = pg.context.new_page()
    pg.goto(f"{base}/#s={urllib.parse.quote(json.dumps({'db': CPI, 'filters': []}))}")
    pg.wait_for_selector(".tv-row")
    idle(pg)
    key = pg.evaluate("""async () => { const t = window.__callpath.tree;
        for (let round = 0; round < 8; round++) {
            const hit = t.rows.find(e => e.row && e.row.has_source);
            if (hit) return hit.row.key;
            for (const e of t.rows.filter(e => e.row && e.row.has_children && !e.kids))
                await t.expand(e);
        } return null; }""")
    assert key
    idle(pg)
    pg.click(f".tv-row[data-key='{key}'] .tv-label")
    pg.wait_for_function("() => document.getElementById('src-body').dataset.file")
    cpi_file = pg.get_attribute("#src-body", "data-file")
    pg.click(f"#db-tabs [data-db='{LOOPS}']")
    pg.wait_for_selector(f"#db-tabs [data-db='{LOOPS}'][aria-selected=true]")
    idle(pg)
    assert pg.get_attribute("#src-body", "data-file") != cpi_file
    assert pg.is_visible("#src-body") and pg.is_hidden("#lines")
    assert cpi_file not in pg.inner_text("#src-file")
    shot(pg, "database-switched")


@pytest.fixture(scope="module")
def measured_server(measured: Path) -> Iterator[Any]:
    with serve([measured]) as server:
        yield server


def test_measured_run_imbalance_and_instructions(page: Any, measured_server: Any,
                                                 measured: Path) -> None:
    """On callpath's own measurement of a program with known imbalance: the work line's
    minimum is in the first thread and its maximum in the last, as the heat map and the
    min/max bars show; the assembler pane lists the instructions the line table maps to the
    line ± 1 (read from the binary that was profiled), with the sampled cost of each, the
    costs of the work line adding up to the line's total."""
    pg = page
    exp = callpath.open(str(measured))
    m = lm.build_line_matrix(exp, 0)
    row = lm.row_of(m, "imbalance.c", measured_run.WORK_LINE)
    open_lines(pg, measured_server.url, 0, row=row, start=max(0, row - 5), count=12, around=1)
    r = next(x for x in heat_rows(pg) if x["row"] == row)
    assert r["selected"]
    assert r["min_context"] == m.labels[0] and r["max_context"] == m.labels[-1]
    assert r["values"] == sorted(r["values"]), "thread k does k+1 units: increasing costs"
    listing = lm.line_instructions(exp, m.files[int(m.file_of_row[row])],
                                   measured_run.WORK_LINE, 1)
    assert listing, f"no instructions: {listing.reason}"
    pg.wait_for_function("() => document.getElementById('ln-asm').dataset.state === 'ok'")
    shown = pg.eval_on_selector_all("#ln-asm .ln-ins", """trs => trs.map(t => ({
        address: t.dataset.address, code: t.querySelector('.ln-code').textContent,
        cost: t.querySelector('.ln-cost').textContent}))""")
    assert [x["address"] for x in shown] == [f"{d['address']:#x}" for d in listing]
    assert [x["code"] for x in shown] == [d["text"] for d in listing]
    costs = [d["cost"] for d in listing if d["line"] == measured_run.WORK_LINE]
    assert all(c is not None for c in costs)
    assert sum(costs) == pytest.approx(float(m.row_sum[row]), rel=1e-9)
    assert sum(1 for x in shown if x["cost"] not in ("", "0")) > 0
    shot(pg, "measured-assembler")


def test_assembler_pane_of_python_code(page: Any, tmp_path: Path) -> None:
    """A Python profile's Assembler pane says that Python code has no machine instructions.
    Its load modules are .py files and package directories, which the pane tried to read as
    ELF: 'cannot read load module .../threading.py: not an ELF file' or '.../json: cannot
    open: Is a directory'. A real profile of a program calling into a package (json)."""
    import sys

    from conftest import run_cli

    program = tmp_path / "enc.py"
    program.write_text("import json\n\n\ndef encode(n):\n    out = 0\n    for i in range(n):\n"
                       "        out += len(json.dumps({'i': i, 'v': [i, i + 1]}))\n"
                       "    return out\n\n\nencode(60_000)\n")
    db = tmp_path / "enc.d"
    run_cli("profile", "-m", str(tmp_path / "m"), "-o", str(db), "--", sys.executable,
            str(program), check=True)
    pg = page
    with serve([db]) as server:
        ranked = view_server_get(server.url, "/api/db/0/lines/ranked", n=50)["procedures"]
        for name in ("enc.py", "encoder.py"):  # a module file, and a file of the json package
            row = next(r["hot_row"] for r in ranked if r["file_name"] == name)
            open_lines(pg, server.url, 0, row=row, start=row, count=10)
            pg.wait_for_function("() => document.getElementById('ln-asm').dataset.state")
            text = pg.inner_text("#ln-asm").strip()
            assert text.startswith("Python code (load module "), text
            assert "no machine instructions" in text and "ELF" not in text, text
            assert "cannot open" not in text, text
        shot(pg, "assembler-python")
