"""Benchmark: the Lines views (PerfVisS, issue 18) on 10^5 source lines × 1,024 contexts.

Generates once (cached under ``bench/.cache/``) a v4 database with callpath's model and
writer: 20 source files of 5,000 lines (10^5 lines, files written beside it so the axis holds
every line), 500 procedures of 200 lines, a line scope on every 4th line of the 60% of
procedures that ran (about 15,000), and 1,024 execution contexts (128 ranks × 8 threads) in
which each line scope has a value with probability 1/2 (about 7.5 M values), every 7th rank
twice as costly.

Then, in this process, medians of ``--repeat`` runs:

* ``matrix``   - :func:`build_line_matrix` from the opened database (the first run also
  decodes ``profile.db``: reported apart as ``matrix (first)``);
* ``overview`` - Figure 4's parameters (skip > 50, bins of 4 by max, strips of 80), all
  1,024 contexts; also with the contexts binned to 64 and with the top 8 per row;
* ``detail``   - a 100-line window: the dense values, the per-line min/max/mean/stdev with
  the contexts that have them, and the source text of the window;
* ``minmax``   - the min/max statistics of that window alone;
* ``ranked``   - the top 10 procedures;
* peak memory: tracemalloc's peak during one matrix build and the process's maximum RSS.

The peer, in the same run: the same overview by a straightforward pandas pivot from the
long (line, context, value) table — empty runs found with pandas, kept lines binned, then
``pivot_table(aggfunc="max")`` — checked equal to ours. The machine is shared: read the
ratio, not the absolute times. ``--quick`` for a small database that takes seconds.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
CACHE = BENCH / ".cache"


def generate(d: Path, n_files: int, lines_per_file: int, ranks: int, threads: int,
             seed: int = 18) -> Path:
    """The database (cached): see the module docstring."""
    from callpath.formats.v4.writer import write_v4
    from callpath.model import (
        CCT,
        ExecutionContext,
        Function,
        Identifier,
        IdKind,
        LoadModule,
        NodeKind,
        ProfileBlock,
        SourceFile,
        build_experiment,
        propagate,
        standard_metric,
        standard_scopes,
    )

    db = d / "lines.d"
    if (db / "profile.db").is_file():
        return db
    d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    files = []
    for f in range(n_files):
        p = d / f"src{f:02d}.c"
        p.write_text("".join(f"  x[{i}] = y[{i}] * {f};\n" for i in range(lines_per_file)))
        files.append(SourceFile(str(p)))
    proc_lines = 200
    parent, kind, fn, fl, ln = [-1, 0], [NodeKind.ROOT, NodeKind.ENTRY], [-1, -1], [-1, -1], \
        [0, 0]
    functions = []
    line_nodes = []
    for f in range(n_files):
        for p0 in range(0, lines_per_file, proc_lines):
            functions.append(Function(f"proc_{f:02d}_{p0:05d}", 0, 0x1000 * len(functions), f,
                                      p0 + 1))
            me = len(parent)
            parent.append(1)
            kind.append(NodeKind.FUNCTION)
            fn.append(len(functions) - 1)
            fl.append(f)
            ln.append(p0 + 1)
            if rng.random() < 0.4:
                continue  # a procedure never run: no line scope (skipped by the overview)
            for line in range(p0 + 2, p0 + proc_lines + 1, 4):
                line_nodes.append(len(parent))
                parent.append(me)
                kind.append(NodeKind.LINE)
                fn.append(-1)
                fl.append(f)
                ln.append(line)
    n = len(parent)
    cct = CCT.from_columns(parent, kind, function=fn, file=fl, line=ln,
                           module=[0 if k == NodeKind.FUNCTION else -1 for k in kind],
                           entry_point=[0, 1] + [0] * (n - 2), entry_names={1: "main thread"})
    scopes = standard_scopes()
    metrics = [standard_metric("CPUTIME (sec)", 0, scopes)]
    nodes = np.asarray(line_nodes, dtype=np.int64)
    weight = rng.pareto(1.5, len(nodes)) + 0.01  # a few hot lines, many cold ones
    blocks, contexts = [], []
    for c in range(ranks * threads):
        r, t = divmod(c, threads)
        has = rng.random(len(nodes)) < 0.5
        vals = weight[has] * rng.uniform(0.5, 1.5, int(has.sum())) * (1 + (r % 7 == 0))
        blk = ProfileBlock.from_triples(nodes[has], np.zeros(int(has.sum()), np.int64),
                                        np.round(vals, 3) + 0.001)
        blocks.append(propagate(cct, metrics, scopes, blk))
        contexts.append(ExecutionContext(c + 1, (Identifier(IdKind.RANK, r),
                                                 Identifier(IdKind.THREAD, t))))
    exp = build_experiment(cct, metrics, scopes, contexts, blocks,
                           modules=[LoadModule("/opt/bench/lines.exe")], files=files,
                           functions=functions, title="lines bench")
    write_v4(exp, db, copy_sources=False)
    return db


CPU: dict[int, float] = {}  # id of a timed result -> median CPU seconds of this process


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Median wall time (and, in CPU, the median CPU time of this process: on a machine
    shared with other jobs the wall time includes waiting for a core)."""
    times, cpus = [], []
    out = None
    for _ in range(repeat):
        c = time.process_time()
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    med = statistics.median(times)
    CPU[id(med)] = statistics.median(cpus)
    return med, out


def pandas_overview(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, n_rows: int,
                    skip: int, b: int) -> np.ndarray:
    """The overview as a pandas user would write it from the long table."""
    import pandas as pd

    df = pd.DataFrame({"row": rows, "context": cols, "value": vals})
    has = df.groupby("row")["value"].apply(lambda v: (v != 0).any())
    has = has.reindex(range(n_rows), fill_value=False)
    run = (has != has.shift()).cumsum()
    run_len = run.map(run.value_counts())
    kept = has | (run_len <= skip)
    kidx = kept.cumsum() - 1
    df = df[df["row"].map(kept)]
    df["bin"] = df["row"].map(kidx) // b
    table = df.pivot_table(index="bin", columns="context", values="value", aggfunc="max",
                           fill_value=0.0)
    n_bins = -(-int(kept.sum()) // b)
    table = table.reindex(index=range(n_bins), columns=range(int(cols.max()) + 1),
                          fill_value=0.0)
    return table.to_numpy()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10^4 lines × 64 contexts")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    import callpath
    from callpath.analysis import lines as L
    from callpath.analysis import lines_matrix

    shape = (4, 2400, 16, 4) if args.quick else (20, 5000, 128, 8)
    t0 = time.perf_counter()
    db = generate(CACHE / ("lines-quick" if args.quick else "lines"), *shape)
    print(f"database: {db} ({shape[0] * shape[1]:,} lines, {shape[2] * shape[3]:,} contexts; "
          f"ready in {time.perf_counter() - t0:.1f} s)")
    exp = callpath.open(db)

    def build() -> L.LineMatrix:
        lines_matrix._CACHE.clear()
        return L.build_line_matrix(exp, 0)

    first, m = timed(build, 1)
    tracemalloc.start()
    build()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    t_matrix, m = timed(build, args.repeat)
    print(f"matrix: {m.n_rows:,} rows × {m.n_cols:,} columns, {len(m.vals):,} values")
    res: dict[str, float] = {"matrix (first)": first, "matrix": t_matrix}
    res["overview"], ov = timed(lambda: L.overview(m, 50, 4, "max", 80), args.repeat)
    res["overview, 64 context bins"], _ = timed(
        lambda: L.overview(m, 50, 4, "max", 80, context_bins=64), args.repeat)
    res["overview, top 8 contexts"], _ = timed(
        lambda: L.overview(m, 50, 4, "max", 80, top_contexts=8), args.repeat)
    start = int(m.nz_rows[len(m.nz_rows) // 2])
    rows = np.arange(start, min(start + 100, m.n_rows))

    def detail() -> Any:
        w = L.window(m, start, 100)
        st = L.line_stats(m, rows)
        src = L.source_text(m, int(m.file_of_row[start]))
        return w, st, src

    res["detail (100 lines)"], _ = timed(detail, args.repeat)
    res["min/max of the window"], _ = timed(lambda: L.line_stats(m, rows), args.repeat)
    res["ranked (top 10)"], top = timed(lambda: L.ranked_procedures(m, 10), args.repeat)

    counts = np.diff(m.indptr)
    long_rows = np.repeat(m.nz_rows, counts)
    t_pd, pd_vals = timed(lambda: pandas_overview(long_rows, m.cols, m.vals, m.n_rows, 50, 4),
                          max(1, min(args.repeat, 3)))
    same = pd_vals.shape == ov.values.shape and bool(np.array_equal(pd_vals, ov.values))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    targets = {"matrix": 3.0, "overview": 0.3, "detail (100 lines)": 0.05}
    print(f"overview: {ov.kept.sum():,} kept lines, {ov.n_orows:,} rows, {ov.n_strips} strips")
    print(f"\n{'operation':<28}{'wall':>10}{'cpu':>11}  target (on CPU time)")
    for k, v in res.items():
        tgt = targets.get(k)
        cpu = CPU.get(id(v), float("nan"))
        mark = "" if tgt is None else f"< {tgt * 1000:.0f} ms  {'ok' if cpu < tgt else 'MISSED'}"
        print(f"{k:<28}{v * 1000:>8.1f} ms{cpu * 1000:>8.1f} ms  {mark}")
    cpu_pd = CPU.get(id(t_pd), float("nan"))
    print(f"{'pandas pivot overview':<28}{t_pd * 1000:>8.1f} ms{cpu_pd * 1000:>8.1f} ms  "
          f"(same values: {same})")
    print(f"\npandas / callpath overview: {t_pd / res['overview']:.1f}x wall, "
          f"{cpu_pd / CPU[id(res['overview'])]:.1f}x cpu")
    print(f"peak memory: matrix build {peak / 2**20:.0f} MiB (tracemalloc), "
          f"process max RSS {rss:.0f} MiB")
    print(f"top procedure: {top[0]['procedure']} {top[0]['percent']:.2f}%")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
