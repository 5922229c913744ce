"""Browser tests of the viewer's flame graph / icicle pane (static/flame.js): Debian's Chromium
driven by Playwright against a real server over a real comparison database (two profiled runs
of tests/compare_programs/twoinputs.c, diffed by ``callpath diff``) and HPCToolkit's
loops-cputime-t.d.

The comparison's runs: base ``twoinputs 200000`` (common() twice as long as in the new run),
new ``twoinputs 100000 extra`` (only_extra() only there). So common() has a negative delta of
about half its base time (~0.26 s against ~0.13 s: ~130 samples apart, while the
difference of the two counts has a standard deviation of ~20; a sign error is beyond 6 of
them, probability under 10^-9) and only_extra() a positive one.

Screenshots: tests/artifacts/view/flame-*.png.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
from typing import Any

import pytest

from conftest import ROOT, perf_reason, run_cli, shared_path
from test_view_browser import ARTIFACTS, browser, page  # noqa: F401
from view_support import serve

PROGRAM = ROOT / "tests" / "compare_programs" / "twoinputs.c"
DIFF, LOOPS, BASE, NEW = 0, 1, 2, 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    reason = perf_reason()
    if reason is not None:
        pytest.skip(f"perf_event sampling is not available here: {reason}")
    d = tmp_path_factory.mktemp("flame")
    exe = d / "twoinputs"
    subprocess.run(["gcc", "-O2", "-g", "-o", str(exe), str(PROGRAM)], check=True)
    a, b = d / "base.d", d / "new.d"
    run_cli("profile", "-m", str(d / "a.m"), "-o", str(a), "--", str(exe), "200000", check=True)
    run_cli("profile", "-m", str(d / "b.m"), "-o", str(b), "--", str(exe), "100000", "extra",
            check=True)
    diff = d / "diff.d"
    run_cli("diff", str(a), str(b), "-o", str(diff), check=True)
    loops = d / "loops.d"
    shutil.copytree(shared_path("hpctoolkit", "dbase", "loops-cputime-t.d"), loops)
    with serve([diff, loops, a, b]) as s:
        yield s


def open_flame(pg: Any, base: str, db: int, view: str = "top-down") -> None:
    state = {"db": db, "dbs": {str(db): {"view": view, "flame": {"on": True, "path": []}}},
             "filters": []}
    pg.goto(f"{base}/#s={urllib.parse.quote(json.dumps(state))}")
    pg.wait_for_selector(".tv-row")
    settle(pg)


def settle(pg: Any) -> None:
    pg.wait_for_function(
        "() => document.getElementById('flame-pane').dataset.pending === '0' && "
        "document.querySelector('.flame-canvas').dataset.rects && "
        "document.getElementById('tree').dataset.pending === '0'")
    pg.wait_for_timeout(50)


def frame(pg: Any) -> dict[str, Any]:
    f: dict[str, Any] = pg.evaluate("() => window.__callpath.flame.frame")
    return f


def box_of(pg: Any, name_part: str) -> dict[str, Any]:
    """The on-screen box of the widest rectangle whose name contains ``name_part``."""
    f = frame(pg)
    hits = [i for i, n in enumerate(f["name"]) if name_part in n]
    assert hits, f"no rectangle named like {name_part!r}: {f['name']}"
    i = max(hits, key=lambda k: f["w"][k])
    r: dict[str, Any] = pg.evaluate("(k) => window.__callpath.flame.rectOf(k)", f["key"][i])
    r["key"] = f["key"][i]
    return r


def pixel(pg: Any, box: dict[str, Any]) -> list[int]:
    """The canvas colour at the left edge of a box (device pixels)."""
    px: list[int] = pg.evaluate("""(b) => {
        const c = document.querySelector('.flame-canvas');
        const r = c.getBoundingClientRect(), dpr = c.width / r.width;
        // left of the label (which starts 3 px in), above the outline of a selection
        const x = Math.floor((b.x - r.left + 1.5) * dpr);
        const y = Math.floor((b.y - r.top + 8) * dpr);
        return [...c.getContext('2d').getImageData(x, y, 1, 1).data];
    }""", box)
    return px


def selected_row(pg: Any) -> str | None:
    key: str | None = pg.evaluate(
        "() => { const e = window.__callpath.tree.selected; return e && e.row ? e.row.key : null }")
    return key


def click_box(pg: Any, box: dict[str, Any]) -> None:
    pg.mouse.click(box["x"] + min(box["w"] / 2, 20), box["y"] + 5)


def test_flame_click_zoom_and_tree_selection(page: Any, server: Any) -> None:  # noqa: F811
    pg = page
    open_flame(pg, server.url, DIFF)
    f = frame(pg)
    assert f["node"] == "r" and f["x"][0] == 0 and f["w"][0] == 1
    # every rectangle lies inside its parent, and only rectangles of a pixel or more came
    for i in range(1, len(f["key"])):
        p = f["parent"][i]
        inside = f["x"][p] - 1e-6 <= f["x"][i] <= f["x"][i] + f["w"][i] <= \
            f["x"][p] + f["w"][p] + 1e-6
        assert inside
        assert f["w"][i] * f["width"] >= 1 - 1e-6
    box = box_of(pg, "» only_extra")
    click_box(pg, box)
    settle(pg)
    pg.wait_for_function("(k) => window.__callpath.tree.selected && "
                         "window.__callpath.tree.selected.row.key === k", arg=box["key"])
    z = frame(pg)
    assert z["node"] == box["key"] and z["w"][0] == 1  # zoomed: the box is the whole width
    assert pg.eval_on_selector(".tv-row.selected", "r => r.dataset.key") == box["key"]
    shot_path = ARTIFACTS / "flame-zoomed.png"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(shot_path))
    # the zoom is in the URL: a reload shows the same frame
    pg.evaluate("() => window.__callpath.flushUrl()")
    pg.reload()
    pg.wait_for_selector(".tv-row")
    settle(pg)
    assert frame(pg)["node"] == box["key"]
    # clicking the frame's root goes one level out
    root = pg.evaluate("(k) => window.__callpath.flame.rectOf(k)", box["key"])
    click_box(pg, root)
    settle(pg)
    assert frame(pg)["node"] != box["key"]
    # selecting in the tree outlines the same node in the graph
    pg.click("#flame-pane .flame-reset")
    settle(pg)
    # the tree keeps the selected only_extra in view: its first rows may be scrolled out (and
    # not drawn) when the pane is short, as with the share bar above it. Scrolled to the top
    # until the row is drawn inside the tree pane: the rows are drawn for a new scroll position
    # on a later frame (clicked before, the row found could be one of the old position's,
    # below the tree pane, where the flame pane takes the click), and a reveal of the
    # selection the reset's reload scheduled for a later frame may scroll back down after
    # a single scroll to the top (a CI run: 20 s of waiting for a row scrolled out again)
    pg.wait_for_function(
        "() => { const t = window.__callpath.tree; "
        "const s = t.scroller.getBoundingClientRect(); "
        "const r = [...document.querySelectorAll('.tv-row')]"
        ".find(e => e.textContent.includes('main thread')); if (r) { "
        "const b = r.getBoundingClientRect(); "
        "if (b.top >= s.top && b.bottom <= s.bottom) return true; } "
        "if (t.scroller.scrollTop !== 0) { t.scroller.scrollTop = 0; "
        "t.scroller.dispatchEvent(new Event('scroll')); } return false; }")
    settle(pg)
    row = pg.locator(".tv-row", has_text="main thread").first
    row.click()
    key = row.get_attribute("data-key")
    pg.wait_for_function("(k) => document.querySelector('.flame-canvas').dataset.selected === k",
                         arg=key)


def test_find_highlights_matches(page: Any, server: Any) -> None:  # noqa: F811
    pg = page
    open_flame(pg, server.url, LOOPS)
    f = frame(pg)
    expected = sum("func" in n.lower() for n in f["name"])
    assert expected >= 2
    other = box_of(pg, "main thread")
    before = pixel(pg, other)
    pg.fill("#flame-pane .flame-find", "FUNC")
    pg.wait_for_function("(n) => document.getElementById('flame-pane').dataset.matches === n",
                         arg=str(expected))
    hit = box_of(pg, "func1")
    assert pixel(pg, hit)[:3] == [230, 0, 230]  # matches in magenta
    assert pixel(pg, other) != before  # the rest is dimmed
    assert "matches" in pg.inner_text("#flame-pane .flame-count")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "flame-find.png"))


def test_icicle_of_bottom_up_selects_in_tree(page: Any, server: Any) -> None:  # noqa: F811
    pg = page
    open_flame(pg, server.url, LOOPS, "bottom-up")
    f = frame(pg)
    assert f["column"] == "m0e"  # an icicle of exclusive values, which add up
    level1 = [i for i, d in enumerate(f["depth"]) if d == 1]
    assert sum(f["w"][i] for i in level1) <= 1 + 1e-6
    box = box_of(pg, "« main._omp_fn.0")
    click_box(pg, box)
    settle(pg)
    pg.wait_for_function("(k) => window.__callpath.tree.selected && "
                         "window.__callpath.tree.selected.row.key === k", arg=box["key"])
    assert selected_row(pg) == box["key"]
    label = pg.eval_on_selector(".tv-row.selected .tv-label", "e => e.textContent")
    assert "main._omp_fn.0" in label
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "flame-icicle.png"))


def test_diff_colours(page: Any, server: Any) -> None:  # noqa: F811
    pg = page
    open_flame(pg, server.url, DIFF)
    f = frame(pg)
    assert f["color_name"].endswith("[delta] (I)") and f["column_name"].endswith("[new] (I)")
    red = pixel(pg, box_of(pg, "» only_extra"))
    blue = pixel(pg, box_of(pg, "» common"))
    assert red[0] > red[2] + 60, red
    assert blue[2] > blue[0] + 60, blue
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "flame-diff.png"))


def test_compare_two_open_databases(page: Any, server: Any) -> None:  # noqa: F811
    pg = page
    state = {"db": NEW, "dbs": {str(NEW): {"view": "top-down"}}, "filters": []}
    pg.goto(f"{server.url}/#s={urllib.parse.quote(json.dumps(state))}")
    pg.wait_for_selector(".tv-row")
    n_tabs = pg.locator("#db-tabs [role=tab]").count()
    pg.click("#tb-compare")
    pg.select_option("#cmp-base", str(BASE))
    pg.select_option("#cmp-new", str(NEW))
    pg.click("#cmp-ok")
    pg.wait_for_function("(n) => document.querySelectorAll('#db-tabs [role=tab]').length === n",
                         arg=n_tabs + 1)
    pg.wait_for_selector(".tv-row")
    settle(pg)
    heads = pg.eval_on_selector_all(".tv-hcell.tv-metric .tv-hname",
                                    "els => els.map(e => e.textContent)")
    assert [h.split(" [")[1] for h in heads[:4]] == ["base] (I)", "new] (I)", "delta] (I)",
                                                     "ratio] (I)"], heads
    # the root's delta cell is the difference of the two databases' roots
    root = pg.eval_on_selector_all(".tv-row:first-child .tv-cell.tv-metric",
                                   "els => els.map(e => e.textContent)")
    import callpath
    a = callpath.open(server.dbs[BASE].path)
    b = callpath.open(server.dbs[NEW].path)
    delta = b.inclusive(0)[0] - a.inclusive(0)[0]
    assert float(root[2].split()[0]) == pytest.approx(delta, rel=5e-3, abs=1e-9)
    red = pixel(pg, box_of(pg, "» only_extra"))
    assert red[0] > red[2] + 60, red
    # coloured bars in the tree's delta column: more in only_extra, less in common
    for name, want in (("» common", "less"), ("» only_extra", "more")):
        pg.click("#flame-pane .flame-reset")
        settle(pg)
        click_box(pg, box_of(pg, name))
        settle(pg)
        pg.wait_for_function("""(want) => {
            const heads = [...document.querySelectorAll('.tv-hcell.tv-metric')];
            const i = heads.findIndex(h => h.title.includes('[delta] (I)'));
            const row = document.querySelector('.tv-row.selected');
            const cell = row && row.querySelectorAll('.tv-cell.tv-metric')[i];
            return cell && cell.dataset.delta === want
                && cell.style.background.includes('gradient');
        }""", arg=want)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "flame-compare-tab.png"))


def test_zoom_is_kept_per_view(page: Any, server: Any) -> None:  # noqa: F811
    """A flame graph zoom belongs to its view: switching to Bottom-up shows the whole icicle
    without a failed request, and switching back finds the Top-down zoom again. The zoom
    was one key for every view, so Bottom-up asked for the Top-down node (a 400 in the
    console) and the fallback dropped the Top-down zoom as well."""
    pg = page
    failed: list[str] = []
    pg.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
    open_flame(pg, server.url, LOOPS)
    box = box_of(pg, "» main._omp_fn.0")
    click_box(pg, box)
    settle(pg)
    assert frame(pg)["node"] == box["key"]
    pg.click("#view-tabs [data-view=bottom-up]")
    settle(pg)
    pg.wait_for_function("() => window.__callpath.flame.view === 'bottom-up'")
    assert frame(pg)["node"] == "r"
    ice = box_of(pg, "main._omp_fn.0")  # zoom the icicle too: its own zoom
    click_box(pg, ice)
    settle(pg)
    assert frame(pg)["node"] == ice["key"]
    pg.click("#view-tabs [data-view=top-down]")
    settle(pg)
    pg.wait_for_function("() => window.__callpath.flame.view === 'top-down'")
    assert frame(pg)["node"] == box["key"]
    pg.click("#view-tabs [data-view=bottom-up]")
    settle(pg)
    pg.wait_for_function("() => window.__callpath.flame.view === 'bottom-up'")
    assert frame(pg)["node"] == ice["key"]
    assert not failed, failed
