"""Benchmark: the analysis engine on a 10^6-node database, against Hatchet in the same run.

Uses the synthetic v4 database of ``bench/read_db.py`` (generated once and cached under
``bench/.cache/``: 10^6 calling contexts, 64 execution contexts, two metrics). Each tool runs in
a fresh subprocess that opens the database once (not timed here; ``read_db.py`` times that)
and then times each operation ``--repeat`` times on fresh objects (median reported):

callpath (``callpath.analysis``):
* ``inclusive``  - inclusive and exclusive values of both metrics recomputed from point values
  over the whole tree (what every filtered or thread-selected view needs);
* ``bottom-up``  - the Bottom-up view's roots (one per procedure) with inclusive (recursion
  rule) and exclusive values of both metrics;
* ``flat``       - the whole Flat view (modules, files, procedures, loops, lines, call sites)
  with values of both metrics;
* ``derived``    - one derived metric, ``100*$0/@0 + $2/($0+1)``, over every Top-down node;
* ``filter``     - a "self only" filter eliding every procedure named ``compute_*`` (about 7%
  of procedures), then inclusive/exclusive values of the filtered tree.

Hatchet (``llnl-hatchet``, its own virtualenv ``bench/.env-hatchet``), nearest equivalents:
* ``inclusive``  - ``GraphFrame.update_inclusive_columns()``;
* ``bottom-up`` / ``flat`` - a per-procedure profile, ``gf.dataframe.groupby("name").sum()``
  (Hatchet has no Bottom-up or Flat view; its ``groupby_aggregate("name", "sum")`` raises
  inside pandas on this version, so the plain pandas group-by is what a user would run);
* ``derived``    - the same formula as pandas column arithmetic on ``gf.dataframe``;
* ``filter``     - ``filter(lambda row: not name.startswith("compute_"), squash=True)``.

Run ``python bench/analysis.py --quick`` for a small database that takes seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import read_db  # noqa: E402  (the generator and the Hatchet virtualenv live there)

OPS = ("inclusive", "bottom-up", "flat", "derived", "filter")


def worker_callpath(db: str, repeat: int) -> dict[str, Any]:
    import callpath
    from callpath.analysis.bottomup import BottomUpView
    from callpath.analysis.columns import ColumnSet
    from callpath.analysis.derived import DerivedMetric
    from callpath.analysis.flat import FlatView
    from callpath.analysis.source import TreeSource, tree_source
    from callpath.analysis.topdown import TopDownView
    from callpath.analysis.tree_filters import Filter, FilterType, apply_filters

    exp = callpath.open(db)
    for k in range(len(exp.metrics)):  # read the summary once, as a viewer would on open
        exp.inclusive(k)
        exp.exclusive(k)
    times: dict[str, list[float]] = {op: [] for op in OPS}
    sizes: dict[str, int] = {}
    for _ in range(repeat):
        t = time.perf_counter()
        src = TreeSource(exp, exp.cct, tree_source(exp).orig)
        for k in range(len(exp.metrics)):
            src._derived.clear()
            src.points(k)
            src.cct.inclusive(src.points(k))
            src.cct.exclusive(src.points(k))
        times["inclusive"].append(time.perf_counter() - t)

        base = tree_source(exp)
        t = time.perf_counter()
        bu = BottomUpView(base)
        for k in range(len(exp.metrics)):
            bu.inclusive(k)
            bu.exclusive(k)
        times["bottom-up"].append(time.perf_counter() - t)
        sizes["bottom-up roots"] = len(bu.children(0))

        t = time.perf_counter()
        flat = FlatView(base)
        for k in range(len(exp.metrics)):
            flat.inclusive(k)
            flat.exclusive(k)
        times["flat"].append(time.perf_counter() - t)
        sizes["flat nodes"] = len(flat)

        td = TopDownView(base)
        td.inclusive(0)
        td.inclusive(1)
        t = time.perf_counter()
        cols = ColumnSet(base, [DerivedMetric("d", "100*$0/@0 + $2/($0+1)")])
        vals = cols.values(td, cols.resolve("d"))
        times["derived"].append(time.perf_counter() - t)
        sizes["derived values"] = len(vals)

        t = time.perf_counter()
        filtered = apply_filters(base, [Filter("compute_*", FilterType.SELF_ONLY)])
        for k in range(len(exp.metrics)):
            filtered.inclusive(k)
            filtered.exclusive(k)
        times["filter"].append(time.perf_counter() - t)
        sizes["nodes after filter"] = len(filtered.cct)
    return {"times": times, "sizes": sizes, "peak_rss_mib": read_db._peak_rss_mib()}


def worker_hatchet(db: str, repeat: int, metric_names: list[str]) -> dict[str, Any]:
    import hatchet

    gf0 = hatchet.GraphFrame.from_hpctoolkit_latest(db, metric_names=metric_names)
    cols = [c for c in gf0.dataframe.columns if c != "name"]
    times: dict[str, list[float]] = {op: [] for op in OPS}
    sizes: dict[str, int] = {}
    inc = [c for c in cols if c.endswith("(inc)")]
    exc = [c for c in cols if not c.endswith("(inc)")]
    for _ in range(repeat):
        gf = gf0.deepcopy()
        t = time.perf_counter()
        gf.update_inclusive_columns()
        times["inclusive"].append(time.perf_counter() - t)

        gf = gf0.deepcopy()
        t = time.perf_counter()
        # groupby_aggregate("name", "sum") fails inside pandas on this Hatchet version
        # ("inhomogeneous shape"); a Hatchet user's flat profile is then plain pandas:
        agg = gf.dataframe.groupby("name")[cols[:-1] if "name" in cols else cols].sum()
        dt = time.perf_counter() - t
        times["bottom-up"].append(dt)
        times["flat"].append(dt)
        sizes["groups"] = len(agg)

        df = gf0.dataframe
        a, b = inc[0], inc[1] if len(inc) > 1 else inc[0]
        t = time.perf_counter()
        root = float(df[a].max())
        d = 100.0 * df[a] / root + df[b] / (df[a] + 1.0)
        times["derived"].append(time.perf_counter() - t)
        sizes["derived values"] = len(d)

        gf = gf0.deepcopy()
        t = time.perf_counter()
        out = gf.filter(lambda row: not str(row["name"]).startswith("function: compute_"),
                        squash=True)
        times["filter"].append(time.perf_counter() - t)
        sizes["nodes after filter"] = len(out.dataframe)
    return {"times": times, "sizes": sizes, "columns": inc + exc,
            "peak_rss_mib": read_db._peak_rss_mib(),
            "version": getattr(hatchet, "__version__", "?")}


def run(python: str, args: list[str], timeout: float) -> dict[str, Any]:
    proc = subprocess.run([python, __file__, "_worker", *args], capture_output=True, text=True,
                          timeout=timeout, check=False,
                          env={**__import__("os").environ,
                               "PYTHONPATH": str(read_db.REPO / "src")})
    if proc.returncode != 0:
        raise SystemExit(f"worker failed: {proc.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--profiles", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hatchet-repeat", type=int, default=1,
                    help="Hatchet takes minutes per operation at 10^6 nodes (default 1)")
    ap.add_argument("--quick", action="store_true", help="10^4 nodes, 4 profiles")
    ap.add_argument("--no-hatchet", action="store_true")
    a = ap.parse_args(argv)
    if a.quick:
        a.nodes, a.profiles = 10_000, 4
    db = read_db.ensure_database(a.nodes, a.profiles, 0)
    print(f"database: {db} ({a.nodes} contexts, {a.profiles} profiles)")
    cp = run(sys.executable, ["callpath", str(db), str(a.repeat)], 3600)
    ht = None
    if not a.no_hatchet:
        names = [read_db.hatchet_metric_name(n) for n, _ in read_db.METRICS]
        ht = run(str(read_db.hatchet_python()),
                 ["hatchet", str(db), str(a.hatchet_repeat), json.dumps(names)], 7200)
    print(f"{'operation':<12} {'callpath s':>11} {'Hatchet s':>11} {'ratio':>8}")
    for op in OPS:
        c = statistics.median(cp["times"][op])
        h = statistics.median(ht["times"][op]) if ht else float("nan")
        ratio = h / c if ht and c > 0 else float("nan")
        print(f"{op:<12} {c:>11.3f} {h:>11.3f} {ratio:>7.1f}x")
    print("inclusive and filter are the same work in both tools (update_inclusive_columns, "
          "filter+squash). Hatchet has no Bottom-up or Flat view and no formula language: its "
          "figures for bottom-up/flat (a pandas group-by on node names) and derived (pandas "
          "column arithmetic) are for scale, not the same work.")
    print(f"callpath sizes: {cp['sizes']}; peak RSS {cp['peak_rss_mib']:.0f} MiB")
    if ht:
        print(f"Hatchet {ht['version']} sizes: {ht['sizes']}; peak RSS "
              f"{ht['peak_rss_mib']:.0f} MiB")
    print(f"(callpath: median of {a.repeat}, Hatchet: median of {a.hatchet_repeat}; each tool "
          "in its own process, database opened once)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        tool = sys.argv[2]
        if tool == "callpath":
            res = worker_callpath(sys.argv[3], int(sys.argv[4]))
        else:
            res = worker_hatchet(sys.argv[3], int(sys.argv[4]), json.loads(sys.argv[5]))
        print(json.dumps(res))
        sys.exit(0)
    sys.exit(main())
