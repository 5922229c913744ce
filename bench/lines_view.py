"""Benchmark: the viewer's Lines tab over HTTP on bench/lines.py's database (10^5 source lines ×
1,024 contexts, generated once and cached by that script).

Starts the real server (uvicorn in a thread, as ``callpath view``) and times, through HTTP,
each request the Lines tab makes until its whole response has arrived: the first ``meta``
(builds the line matrix), a 100-line detail window (all 1,024 contexts, and binned to 32
columns as the page asks by default), the overview with Figure 4's parameters (contexts binned
to 32, and the top 8 per row), the overview's rectangles, the ranked list, the calling
contexts of a line. Medians of ``--repeat``; "first" is the first (cold) request: the server
caches an overview per parameters, so its median is the cached answer (JSON + transport). The
peer, in the same run: the same library calls in this process without HTTP, JSON or caching
(``ratio`` = HTTP median / library median: what the server adds or saves). ``--browser``
also times, in Chromium, opening the tab until every pane is drawn. The machine is shared:
read the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """(first, median) in milliseconds."""
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(1e3 * (time.perf_counter() - t))
    return ts[0], statistics.median(ts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="bench/lines.py's small database")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--browser", action="store_true", help="also time the tab in Chromium")
    args = ap.parse_args(argv)
    import callpath
    import lines as bench_lines
    from callpath.analysis import lines as L
    from callpath.view.server import BackgroundServer

    shape = (4, 2400, 16, 4) if args.quick else (20, 5000, 128, 8)
    db = bench_lines.generate(bench_lines.CACHE / ("lines-quick" if args.quick else "lines"),
                              *shape)
    server = BackgroundServer.start([str(db)], host="127.0.0.1", port=0)
    try:
        def get(what: str, **params: Any) -> Any:
            q = urllib.parse.urlencode(params)
            with urllib.request.urlopen(f"{server.url}/api/db/0/lines/{what}?{q}",
                                        timeout=600) as r:
                return json.loads(r.read())

        t = time.perf_counter()
        meta = get("meta")
        first_meta = 1e3 * (time.perf_counter() - t)
        rows, ctxs = meta["rows"], len(meta["contexts"])
        print(f"database: {db} ({rows:,} lines, {ctxs:,} contexts)")
        print(f"first meta (opens the database's values and builds the matrix): "
              f"{first_meta:.0f} ms")
        hot = meta["hottest_row"]
        start = max(0, hot - 50)
        fig4 = {"skip": 50, "bin": 4, "reduce": "max", "strip": 80}
        segs = json.dumps([[start, start + 99], [0, rows - 1]])
        cases: list[tuple[str, Callable[[], Any]]] = [
            ("window 100 lines x all contexts",
             lambda: get("window", start=start, count=100, cbins=0)),
            ("window 100 lines, 32 columns", lambda: get("window", start=start, count=100,
                                                         cbins=32)),
            ("overview, contexts binned to 32", lambda: get("overview", cbins=32, **fig4)),
            ("overview, top 8 contexts per row", lambda: get("overview", cbins=8, ctop=1,
                                                             **fig4)),
            ("rectangles (window, whole axis)", lambda: get("rects", cbins=32, segments=segs,
                                                            **fig4)),
            ("ranked top 10 with a line's procedure", lambda: get("ranked", n=10, row=hot)),
            ("calling contexts of a line", lambda: get("contexts", row=hot)),
            ("assembler of a line +-2", lambda: get("asm", row=hot, around=2)),
            ("meta (matrix cached)", lambda: get("meta")),
        ]
        exp = callpath.open(db)
        m = L.build_line_matrix(exp, 0)
        peers: dict[str, Callable[[], Any]] = {
            "window 100 lines x all contexts":
                lambda: (L.window(m, start, 100), L.line_stats(m, range(start, start + 100))),
            "overview, contexts binned to 32":
                lambda: L.overview(m, 50, 4, "max", 80, context_bins=32),
            "overview, top 8 contexts per row":
                lambda: L.overview(m, 50, 4, "max", 80, top_contexts=8),
            "ranked top 10 with a line's procedure":
                lambda: (L.ranked_procedures(m, 10), L.procedure_at(m, hot)),
        }
        print(f"{'request':42s} {'first ms':>9s} {'median ms':>10s} {'library ms':>11s} "
              f"{'ratio':>6s}")
        for name, fn in cases:
            first, med = timed(fn, args.repeat)
            line = f"{name:42s} {first:9.1f} {med:10.1f}"
            if name in peers:
                _, lib = timed(peers[name], args.repeat)
                line += f" {lib:11.1f} {med / lib if lib else float('nan'):6.2f}"
            print(line)
        if args.browser:
            browser_open(server.url)
    finally:
        server.stop()
    return 0


def browser_open(url: str) -> None:
    """Chromium: the Lines tab opened from a link until every pane has its data (medians of 3
    fresh pages)."""
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        print("browser: no Chromium here")
        return
    state = {"db": 0, "dbs": {"0": {"mode": "lines"}}, "filters": []}
    link = f"{url}/#s={urllib.parse.quote(json.dumps(state))}"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox",
                                                         "--disable-dev-shm-usage"])
        ts = []
        for _ in range(3):
            pg = b.new_page(viewport={"width": 1400, "height": 900})
            t = time.perf_counter()
            pg.goto(link)
            pg.wait_for_selector("#ln-heat .ln-row")
            pg.wait_for_function("() => document.getElementById('lines').dataset.pending "
                                 "=== '0' && document.getElementById('ln-overview')"
                                 ".dataset.window")
            ts.append(1e3 * (time.perf_counter() - t))
            pg.close()
        b.close()
    print(f"browser: link opened to every pane drawn: first {ts[0]:.0f} ms, "
          f"median {statistics.median(ts):.0f} ms")


if __name__ == "__main__":
    sys.exit(main())
