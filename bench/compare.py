"""Benchmark: comparing runs (``callpath diff``) against Hatchet's GraphFrame subtraction, and a
flame-graph frame of a 10^6-node tree on the viewer's server.

Generates (once, cached under ``bench/.cache/``) two v4 databases of ``--contexts`` calling
contexts (default 10^6) with the tree generator of ``bench/read_db.py``: *base*, and *new*, in
which a tenth of the leaves differ (half of them moved to another line, so they are contexts
of one run only, half with 1.5x their cost). Then, each in a fresh subprocess, ``--repeat``
times (median reported):

* callpath: ``callpath diff base new -o out`` (read both, match, write the comparison);
  in-process phases: open both, ``analysis.compare.compare``, write;
* Hatchet: ``GraphFrame.from_hpctoolkit_latest`` of both, then ``new - base`` (Hatchet
  unifies the two graphs and subtracts the metric columns), run with the Python of
  ``bench/.env-hatchet`` (created as ``bench/read_db.py`` does: ``pip install llnl-hatchet``);
* the flame-graph frame: the viewer's ``/api/db/{db}/flame`` handler on the base database,
  1,500 pixels wide, first call (builds the Top-down view) and then warm calls.

Targets: the diff under 5 s and at least 10x faster than Hatchet; a flame frame under 100 ms.
The sections are functions listed in ``SECTIONS``; exports of the same database (another
engineer's work) add their own section there.

Run ``python bench/compare.py --quick`` for 10^4 contexts (seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
CACHE = BENCH / ".cache"
GEN_VERSION = 2
N_PROFILES = 2


# ---- database generation -------------------------------------------------------------------


def _experiment(cct: Any, tree: dict[str, Any], point: Any, seed: int) -> Any:
    """An experiment over ``cct`` whose leaf costs ``point`` (per node, 0 elsewhere) are
    split between two threads."""
    import numpy as np

    from callpath.model import (
        ExecutionContext,
        Function,
        Identifier,
        IdKind,
        LoadModule,
        ProfileBlock,
        SourceFile,
        build_experiment,
        propagate,
        standard_metric,
        standard_scopes,
    )

    scopes = standard_scopes()
    metrics = [standard_metric("CPUTIME (sec)", 0, scopes)]
    rng = np.random.default_rng(seed)
    nodes = np.flatnonzero(point)
    share = rng.uniform(0.3, 0.7, len(nodes))
    blocks, contexts = [], []
    for t, part in enumerate((share, 1.0 - share)):
        blk = ProfileBlock.from_triples(cct.ctx_id[nodes].astype(np.int64),
                                        np.zeros(len(nodes), np.int64), point[nodes] * part)
        blocks.append(propagate(cct, metrics, scopes, blk))
        contexts.append(ExecutionContext(t + 1, (Identifier(IdKind.THREAD, t),)))
    return build_experiment(
        cct, metrics, scopes, contexts, blocks,
        modules=[LoadModule(p) for p in tree["modules"]],
        files=[SourceFile(p) for p in tree["files"]],
        functions=[Function(*f) for f in tree["functions"]])


def _distinct_siblings(cols: dict[str, Any]) -> dict[str, Any]:
    """The generator draws lines, callees and offsets at random, so two siblings can be the
    same thing (two statements of one line, two calls of one procedure from one call site),
    which a real database never has (hpcprof merges them) and a comparison would merge: move
    the k-th duplicate to line + 1000 k (and offset + 4 k)."""
    import numpy as np

    parent = np.asarray(cols["parent"], np.int64)
    kind = np.asarray(cols["kind"], np.int64)
    fn = np.asarray(cols["function"], np.int64)
    line = np.asarray(cols["line"], np.int64).copy()
    off = np.asarray(cols["offset"], np.int64).copy()
    order = np.lexsort((off, line, fn, kind, parent))
    keys = np.stack([parent, kind, fn, line, off])[:, order]
    head = np.r_[True, np.any(keys[:, 1:] != keys[:, :-1], axis=0)]
    grp_start = np.maximum.accumulate(np.where(head, np.arange(len(order)), 0))
    k = np.zeros(len(order), np.int64)
    k[order] = np.arange(len(order)) - grp_start
    dup = k > 0
    line[dup] += 1000 * k[dup]
    off[dup] += 4 * k[dup]
    file = np.asarray(cols["file"], np.int64).copy()
    file[dup & (file < 0) & (kind != 3)] = 0  # a line is stored only with a file
    cols.update(line=line, offset=off, file=file)
    return cols


def ensure_pair(n_nodes: int, seed: int) -> tuple[Path, Path, int]:
    """The cached (base, new) databases and the number of leaves that differ."""
    import numpy as np

    sys.path.insert(0, str(BENCH))
    from callpath.formats.v4.writer import write_v4
    from callpath.model import CCT, NodeKind
    from read_db import generate_tree

    d = CACHE / f"compare-n{n_nodes}-s{seed}-g{GEN_VERSION}"
    meta = d / "pair.json"
    if meta.exists():
        info = json.loads(meta.read_text())
        print(f"databases: {d.relative_to(REPO)} (cached)")
        return d / "base.d", d / "new.d", int(info["differing"])
    print(f"databases: generating two trees of {n_nodes:,} contexts (seed {seed})")
    t0 = time.perf_counter()
    n_functions = int(min(5000, max(50, n_nodes // 250)))
    tree = generate_tree(n_nodes, n_functions, seed)
    cols = _distinct_siblings(dict(tree["columns"]))
    cct = CCT.from_columns(**cols)
    rng = np.random.default_rng(seed + 7)
    leaves = np.flatnonzero(cct.subtree_end == np.arange(len(cct)) + 1)
    leaves = leaves[cct.kind[leaves] < NodeKind.ENTRY]
    point = np.zeros(len(cct))
    point[leaves] = 0.005 * (1 + rng.poisson(rng.lognormal(0.0, 1.5, len(leaves))))
    # a tenth of the leaves differ: half moved to another line (one-sided), half 1.5x
    pick = rng.permutation(len(leaves))[: len(leaves) // 10]
    moved, scaled = leaves[pick[: len(pick) // 2]], leaves[pick[len(pick) // 2:]]
    new_cols = dict(cols)
    line = np.asarray(cols["line"]).astype(np.int64).copy()
    line[moved] += 100000
    new_cols["line"] = line
    cct_new = CCT.from_columns(**new_cols)
    point_new = point.copy()
    point_new[scaled] *= 1.5
    d.mkdir(parents=True, exist_ok=True)
    write_v4(_experiment(cct, tree, point, seed), d / "base.d", copy_sources=False)
    write_v4(_experiment(cct_new, tree, point_new, seed), d / "new.d", copy_sources=False)
    meta.write_text(json.dumps({"contexts": len(cct), "differing": len(pick),
                                "leaves": len(leaves)}) + "\n")
    print(f"  {len(cct):,} contexts, {len(leaves):,} leaves, {len(pick):,} differing "
          f"({time.perf_counter() - t0:.1f} s)")
    return d / "base.d", d / "new.d", len(pick)


# ---- subprocess workers ----------------------------------------------------------------------


def worker_callpath(base: str, new: str, out: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    import callpath
    from callpath.analysis.compare import compare
    from callpath.analysis.derived import save_derived
    from callpath.formats.v4.writer import write_v4

    t1 = time.perf_counter()
    c1 = time.process_time()
    a, b = callpath.open(base), callpath.open(new)
    t2 = time.perf_counter()
    exp, derived = compare([a, b], ["base", "new"], diff=True)
    t3 = time.perf_counter()
    write_v4(exp, out, copy_sources=False)
    save_derived(out, derived)
    t4 = time.perf_counter()
    return {"import_s": t1 - t0, "open_s": t2 - t1, "compare_s": t3 - t2, "write_s": t4 - t3,
            "total_s": t4 - t1, "cpu_s": time.process_time() - c1, "nodes": len(exp.cct),
            "root_delta": float(exp.inclusive(1)[0] - exp.inclusive(0)[0])}


def worker_hatchet(base: str, new: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    import hatchet

    t1 = time.perf_counter()
    c1 = time.process_time()
    ga = hatchet.GraphFrame.from_hpctoolkit_latest(base, metric_names=["time"])
    gb = hatchet.GraphFrame.from_hpctoolkit_latest(new, metric_names=["time"])
    # Hatchet's v4 reader lists the 'name' column among the exclusive metrics, and its
    # subtraction then fails subtracting strings: drop it, as a Hatchet user has to
    for g in (ga, gb):
        g.exc_metrics = [m for m in g.exc_metrics if m != "name"]
    t2 = time.perf_counter()
    gd = gb - ga
    t3 = time.perf_counter()
    return {"import_s": t1 - t0, "open_s": t2 - t1, "compare_s": t3 - t2, "write_s": 0.0,
            "total_s": t3 - t1, "cpu_s": time.process_time() - c1, "nodes": len(gd.dataframe),
            "version": getattr(hatchet, "__version__", "?")}


def worker_flame(db: str, repeat: int) -> dict[str, Any]:
    import callpath.view.flame_api as fa
    from callpath.engine.database import open_databases

    (database,) = open_databases([db], warm=False)
    params = {"view": "top-down", "width": "1500"}
    t0 = time.perf_counter()
    first = fa.flame(database, params, b"")
    t1 = time.perf_counter()
    times, cpu = [], []
    for _ in range(repeat):
        s, c = time.perf_counter(), time.process_time()
        fr = fa.flame(database, params, b"")
        json.dumps(fr)
        times.append(time.perf_counter() - s)
        cpu.append(time.process_time() - c)
    return {"first_s": t1 - t0, "warm_s": statistics.median(times), "runs": times,
            "cpu_s": statistics.median(cpu), "rects": len(first["key"]),
            "nodes": len(database.exp.cct)}


def worker_main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "callpath":
        res = worker_callpath(argv[1], argv[2], argv[3])
    elif mode == "hatchet":
        res = worker_hatchet(argv[1], argv[2])
    elif mode == "flame":
        res = worker_flame(argv[1], int(argv[2]))
    else:
        raise SystemExit(f"unknown worker mode {mode!r}")
    print("RESULT " + json.dumps(res))


# ---- driver ------------------------------------------------------------------------------------


def run_worker(python: Path | str, args: list[str], timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run([str(python), str(Path(__file__).resolve()), "_worker", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHONHASHSEED="0"))
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"worker {args[0]} failed (exit {proc.returncode})")
    res: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    res["wall_s"] = wall
    return res


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def section_diff(ctx: dict[str, Any]) -> None:
    """callpath diff against Hatchet's subtraction of the same pair."""
    args = ctx["args"]
    base, new = ctx["base"], ctx["new"]
    cp: list[dict[str, Any]] = []
    cli: list[float] = []
    cli_cpu: list[float] = []
    ht: list[dict[str, Any]] = []
    h_py = None
    if not args.skip_hatchet:
        sys.path.insert(0, str(BENCH))
        from read_db import hatchet_python
        h_py = hatchet_python()
    with tempfile.TemporaryDirectory(prefix="compare-bench-") as tmp:
        for i in range(args.repeat):
            out = Path(tmp) / f"diff{i}.d"
            cp.append(run_worker(sys.executable, ["callpath", str(base), str(new), str(out)],
                                 args.timeout))
            t0 = time.perf_counter()
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-m", "callpath", "diff", str(base), str(new),
                            "-o", str(Path(tmp) / f"cli{i}.d")], check=True,
                           capture_output=True)
            cli.append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cli_cpu.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
            print(f"  run {i + 1}: callpath {cp[-1]['total_s']:.2f} s "
                  f"(CLI {cli[-1]:.2f} s)", flush=True)
            if h_py is not None and i < args.hatchet_repeat:
                ht.append(run_worker(h_py, ["hatchet", str(base), str(new)], args.timeout))
                print(f"  run {i + 1}: hatchet  {ht[-1]['total_s']:.2f} s", flush=True)
    print(f"\ndiff of two databases of {cp[0]['nodes']:,} contexts in the union "
          f"({ctx['differing']:,} leaves differ); medians, seconds")
    print("(total = open + compare + write in the worker; CPU = its process time over the same "
          "span, which a loaded machine inflates less; wall = the whole subprocess)")
    print(f"{'':10s} {'total':>8s} {'CPU':>8s} {'open':>8s} {'compare':>8s} {'write':>8s} "
          f"{'wall':>8s}")
    rows = [("callpath", cp)] + ([("hatchet", ht)] if ht else [])
    for label, runs in rows:
        print(f"{label:10s} {med(runs, 'total_s'):8.2f} {med(runs, 'cpu_s'):8.2f} "
              f"{med(runs, 'open_s'):8.2f} {med(runs, 'compare_s'):8.2f} "
              f"{med(runs, 'write_s'):8.2f} {med(runs, 'wall_s'):8.2f}")
    c_cli = statistics.median(cli)
    c_cpu = statistics.median(cli_cpu)
    print(f"'callpath diff' command (whole process, interpreter start included): {c_cli:.2f} s "
          f"wall, {c_cpu:.2f} s CPU (user + sys)")
    c = med(cp, "total_s")
    verdict = (f"diff under 5 s: {'met' if c_cli < 5 else 'NOT met'} ({c_cli:.2f} s wall), "
               f"{'met' if c_cpu < 5 else 'NOT met'} ({c_cpu:.2f} s CPU)")
    if ht:
        h = med(ht, "total_s")
        hc = med(ht, "compare_s")
        print(f"ratio hatchet/callpath: total {h / c:.1f}x (CPU "
              f"{med(ht, 'cpu_s') / med(cp, 'cpu_s'):.1f}x; Hatchet writes nothing); compare alone "
              f"{hc / med(cp, 'compare_s'):.1f}x (Hatchet {ht[0]['version']}, "
              f"{ht[0]['nodes']:,} rows)")
        verdict += f"; >= 10x faster than Hatchet: {'met' if h / c >= 10 else 'NOT met'}"
    print("target: " + verdict)


def section_flame(ctx: dict[str, Any]) -> None:
    """A flame-graph frame of the whole base tree, as the viewer's server computes it."""
    args = ctx["args"]
    r = run_worker(sys.executable, ["flame", str(ctx["base"]), str(max(5, args.repeat))],
                   args.timeout)
    print(f"\nflame frame, {r['nodes']:,}-node tree, 1,500 px: {r['rects']:,} rectangles; "
          f"first request {r['first_s'] * 1000:.0f} ms (builds the Top-down view), then "
          f"median {r['warm_s'] * 1000:.1f} ms (layout + labels + JSON; runs "
          + ", ".join(f"{t * 1000:.1f}" for t in r["runs"]) + f"); CPU {r['cpu_s'] * 1000:.1f} ms")
    print(f"target: flame frame under 100 ms: {'met' if r['warm_s'] < 0.1 else 'NOT met'} "
          f"(wall), {'met' if r['cpu_s'] < 0.1 else 'NOT met'} (CPU)")


def ensure_traced(base: Path, samples: int = 100_000, run: int = 20) -> Path:
    """The base database with a trace per execution context for the Chrome export: ``samples``
    samples 1 ms apart, in runs of ``run`` samples at one random leaf (a program stays a while
    where it is; independent samples would make every sample a change of the whole stack).
    Cached beside the pair."""
    out = base.parent / f"traced-{samples}-{run}.d"
    if (out / "trace.db").exists():
        return out
    import numpy as np

    import callpath
    from callpath.formats.v4.writer import write_v4
    from callpath.model import TraceLine, Traces

    exp = callpath.open(base)
    rng = np.random.default_rng(3)
    leaves = np.flatnonzero(exp.cct.subtree_end == np.arange(len(exp.cct)) + 1)
    lines = []
    t0 = 1_700_000_000_000_000_000
    for p in exp.contexts:
        ctx = np.repeat(exp.cct.ctx_id[rng.choice(leaves, samples // run)], run)
        lines.append(TraceLine(p.index, t0 + np.arange(samples, dtype=np.uint64) * 1_000_000,
                               ctx.astype(np.uint32)))
    exp.traces = Traces(t0, t0 + (samples - 1) * 1_000_000, lines)
    write_v4(exp, out, copy_sources=False)
    return out


def section_export(ctx: dict[str, Any]) -> None:
    """``callpath export`` of the base database to each format (whole command, medians); the
    Chrome trace from a copy with a trace of 10^5 samples per execution context."""
    args = ctx["args"]
    traced = ensure_traced(ctx["base"])
    print(f"\nexport of the {args.contexts:,}-context database (whole 'callpath export' "
          "command: interpreter start, open, render, write; medians; CPU = user + sys of the "
          "process, the figure a loaded shared machine does not inflate)")
    with tempfile.TemporaryDirectory(prefix="export-bench-") as tmp:
        for fmt in ("speedscope", "pprof", "chrome", "folded"):
            db = traced if fmt == "chrome" else ctx["base"]
            out = Path(tmp) / f"out.{fmt}"
            times, cpus = [], []
            for _ in range(args.repeat):
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "callpath", "export", str(db), "--to", fmt,
                                "-o", str(out)], check=True, capture_output=True)
                times.append(time.perf_counter() - t0)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpus.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
            t = statistics.median(times)
            print(f"  {fmt:10s} wall {t:6.2f} s, CPU {statistics.median(cpus):6.2f} s "
                  f"({out.stat().st_size / 2**20:7.1f} MiB; wall runs "
                  + ", ".join(f"{x:.2f}" for x in times)
                  + f")  target under 10 s: {'met' if t < 10 else 'NOT met'}", flush=True)


# Each section takes the shared context (args, base, new, differing) and prints its figures.
# Exports of the 10^6-node database (issue 20, item 3) add their section here.
SECTIONS: list[Callable[[dict[str, Any]], None]] = [section_diff, section_flame,
                                                    section_export]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", type=int, default=10**6, help="calling contexts (10^6)")
    ap.add_argument("--quick", action="store_true", help="10^4 contexts")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="repetitions (3)")
    ap.add_argument("--hatchet-repeat", type=int, default=1,
                    help="repetitions for Hatchet (1: it takes minutes at 10^6)")
    ap.add_argument("--skip-hatchet", action="store_true")
    ap.add_argument("--only", default=None, help="comma-separated section names to run")
    ap.add_argument("--timeout", type=float, default=3600.0, help="per run, seconds")
    args = ap.parse_args(argv)
    if args.quick:
        args.contexts = 10**4
    base, new, differing = ensure_pair(args.contexts, args.seed)
    print(f"{os.cpu_count()} CPUs (a shared machine: other work runs beside this)")
    ctx = {"args": args, "base": base, "new": new, "differing": differing}
    only = set(args.only.split(",")) if args.only else None
    for section in SECTIONS:
        if only is None or section.__name__.removeprefix("section_") in only:
            section(ctx)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        worker_main(sys.argv[2:])
    else:
        sys.exit(main())
