"""Benchmark: open an HPCToolkit sparse v4 database and compute all summary values.

Generates (once, cached under ``bench/.cache/``) a synthetic v4 database with ``--contexts``
calling contexts (default 10^6) and ``--profiles`` execution contexts (default 64) using
callpath's own model and writer, then times, each in a fresh subprocess and ``--repeat``
times (median reported):

* callpath: ``callpath.open(dir)``, then ``exp.inclusive(m)`` and ``exp.exclusive(m)`` for
  every metric ``m``;
* Hatchet: ``hatchet.GraphFrame.from_hpctoolkit_latest(dir, metric_names=[...])`` in its
  default summary-profile mode (it reads the summed inclusive and exclusive value of every
  metric for every calling context from the summary profile, builds its node graph and a
  pandas DataFrame), run with the Python of a separate virtualenv ``bench/.env-hatchet``
  (created on first use with ``pip install llnl-hatchet``; Hatchet is not a dependency of
  callpath).

Run ``python bench/read_db.py --quick`` for a small size that takes seconds, and see
``docs/benchmarks.md``. This file is also its own subprocess worker (``_worker`` argument):
the worker modes import only the standard library at module level so that the Hatchet
virtualenv's Python can run them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
CACHE = BENCH / ".cache"
HATCHET_ENV = BENCH / ".env-hatchet"
HATCHET_REQ = "llnl-hatchet==2026.2.0"
GEN_VERSION = 1  # bump when the generator changes: it is part of the cache key

METRICS = (("CPUTIME (sec)", 0), ("PAPI_TOT_INS", 3))  # (name, first metric id)


# ---- database generation (driver side, uses numpy and callpath) --------------------------


def level_sizes(n_nodes: int, max_depth: int, growth: float, mu: float, sigma: float
                ) -> list[int]:
    """Nodes per depth: ``[1 root, 1 entry, 1 main, ...]`` summing to ``n_nodes``. The shape is
    exponential growth by ``growth`` per level, capped by a Gaussian bump centred at depth
    ``mu``, so the tree is bushy in the middle and thins out towards ``max_depth``."""
    import numpy as np

    d = np.arange(3, max_depth + 1, dtype=np.float64)
    expo = growth ** (d - 2)
    bump = np.exp(-((d - mu) ** 2) / (2 * sigma**2))
    want = n_nodes - 3
    lo, hi = 0.0, float(want) * 10
    for _ in range(200):  # bisection on the bump's height
        a = (lo + hi) / 2
        if np.minimum(expo, a * bump).sum() < want:
            lo = a
        else:
            hi = a
    shape = np.minimum(expo, hi * bump)
    sizes = np.floor(shape).astype(np.int64)
    sizes[int(np.argmax(sizes))] += want - int(sizes.sum())
    out = [1, 1, 1]
    for s in sizes.tolist():
        if s <= 0:
            break
        out.append(int(s))
    out[int(np.argmax(out))] += n_nodes - sum(out)
    return out


def generate_tree(n_nodes: int, n_functions: int, seed: int) -> dict[str, Any]:
    """A synthetic calling context tree, generated one depth level at a time (no per-node Python
    loop) and returned as preorder columns for ``CCT.from_columns`` plus the tables.

    Shape: root, one entry point, ``main``; a FUNCTION's children are LOOPs (25%) and LINEs;
    a LOOP's are LOOPs (15%) and LINEs; a LINE with children is a call site whose children are
    callee FUNCTIONs (Zipf-distributed over the function table); functions of "library" load
    modules (no line information) have INSTRUCTION children only. Every FUNCTION and LOOP gets
    at least one child while the level budget allows; the rest of each level's budget goes to
    random parents with log-normal weights (uneven fanout)."""
    import numpy as np

    from callpath.model import NodeKind

    rng = np.random.default_rng(seed)
    F, L, S, INS = (int(NodeKind.FUNCTION), int(NodeKind.LOOP), int(NodeKind.LINE),
                    int(NodeKind.INSTRUCTION))
    sizes = level_sizes(n_nodes, max_depth=42, growth=2.0, mu=20.0, sigma=7.0)

    # function table: 4 modules with line information, 2 without (library code)
    modules = ["/opt/app/bin/solver", "/opt/app/lib/libphysics.so", "/opt/app/lib/libmesh.so",
               "/opt/app/lib/libio.so", "/usr/lib64/libc.so.6", "/usr/lib64/libmpi.so.40"]
    nodebug_module = np.array([False, False, False, False, True, True])
    fn_module = rng.choice(len(modules), size=n_functions, p=[.3, .25, .2, .1, .1, .05])
    fn_module[0] = 0  # main
    n_files = max(4, n_functions // 8)
    fn_file = np.where(nodebug_module[fn_module], -1, rng.integers(0, n_files, n_functions))
    fn_line = np.where(fn_file >= 0, rng.integers(10, 5000, n_functions), 0)
    fn_offset = rng.integers(0x1000, 0x400000, n_functions) & ~0xF
    prefixes = ["solve", "compute", "update", "exchange", "assemble", "apply", "reduce",
                "interp", "flux", "mesh_refine", "io_write", "pack", "unpack", "advance"]
    fn_names = ["main"] + [
        f"{'__' if nodebug_module[fn_module[i]] else ''}{prefixes[i % len(prefixes)]}_{i}"
        for i in range(1, n_functions)]
    files = [f"/opt/app/src/{prefixes[k % len(prefixes)]}/file_{k}.cpp" for k in range(n_files)]
    fn_nodebug = nodebug_module[fn_module]
    zipf = 1.0 / np.arange(1, n_functions) ** 1.1  # callee popularity (main never called)
    zipf /= zipf.sum()

    # level-order columns, level 2 = main
    kind_lv = [np.array([F], np.uint8)]
    fn_lv = [np.array([0], np.int64)]  # owning function (FUNCTION nodes: their own)
    par_lv = [np.array([1], np.int64)]  # BFS index of the parent
    first = 2  # BFS index of the first node of the current level
    for nxt in sizes[3:]:
        kind, fn = kind_lv[-1], fn_lv[-1]
        n = len(kind)
        must = (kind == F) | (kind == L)
        can = must | (kind == S)
        counts = np.zeros(n, np.int64)
        idx_must = np.nonzero(must)[0]
        if nxt <= len(idx_must):
            counts[np.sort(rng.choice(idx_must, size=nxt, replace=False))] = 1
        else:
            counts[idx_must] = 1
            cand = np.nonzero(can)[0]
            if len(cand) == 0:  # only instructions left (tiny trees): stop early
                break
            w = rng.lognormal(0.0, 1.0, len(cand)) * np.where(kind[cand] == S, 0.5, 1.0)
            extra = rng.choice(cand, size=nxt - len(idx_must), p=w / w.sum())
            counts += np.bincount(extra, minlength=n)
        par_local = np.repeat(np.arange(n), counts)
        pk = kind[par_local]
        pf = fn[par_local]
        u = rng.random(len(par_local))
        ck = np.where(pk == F, np.where(u < 0.25, L, S), np.where(u < 0.15, L, S))
        ck = np.where(fn_nodebug[pf] & (pk == F), INS, ck)
        is_call = pk == S
        ck = np.where(is_call, F, ck).astype(np.uint8)
        callee = rng.choice(np.arange(1, n_functions), size=int(is_call.sum()), p=zipf)
        cf = pf.copy()
        cf[is_call] = callee
        kind_lv.append(ck)
        fn_lv.append(cf)
        par_lv.append(first + par_local)
        first += n
    # BFS -> preorder, as the v4 reader does: subtree sizes bottom-up, positions top-down
    lv_par = [np.array([-1], np.int64), np.array([0], np.int64), *par_lv]
    lv_sizes = [len(p) for p in lv_par]
    n = sum(lv_sizes)
    bounds = np.concatenate([[0], np.cumsum(lv_sizes)])
    parent_bfs = np.concatenate(lv_par)
    size = np.ones(n, np.int64)
    for lv in range(len(lv_sizes) - 1, 0, -1):
        a, b = bounds[lv], bounds[lv + 1]
        np.add.at(size, parent_bfs[a:b], size[a:b])
    pos = np.zeros(n, np.int64)
    for lv in range(1, len(lv_sizes)):
        a, b = bounds[lv], bounds[lv + 1]
        par = parent_bfs[a:b]
        sz = size[a:b]
        csum = np.cumsum(sz) - sz
        head = np.r_[True, par[1:] != par[:-1]]
        grp = np.maximum.accumulate(np.where(head, np.arange(len(par)), 0))
        pos[a:b] = pos[par] + 1 + csum - csum[grp]
    order = np.empty(n, np.int64)
    order[pos] = np.arange(n)
    kind_bfs = np.concatenate([np.array([NodeKind.ROOT, NodeKind.ENTRY], np.uint8), *kind_lv])
    fn_bfs = np.concatenate([[-1, -1], *fn_lv])
    kind = kind_bfs[order]
    owner = fn_bfs[order]
    parent = np.where(parent_bfs[order] >= 0, pos[np.maximum(parent_bfs[order], 0)], -1)

    # per-node fields: FUNCTION -> function; LOOP/LINE -> file and line of the enclosing
    # function's file; INSTRUCTION -> load module and offset
    is_f, is_i = kind == F, kind == INS
    is_lex = (kind == L) | (kind == S)
    own = np.maximum(owner, 0)
    function = np.where(is_f, owner, -1)
    file = np.where(is_lex, fn_file[own], -1)
    line = np.where(is_lex, fn_line[own] + rng.integers(1, 400, n), 0)
    module = np.where(is_i, fn_module[own], -1)
    offset = np.where(is_i, fn_offset[own] + (rng.integers(0, 0x400, n) << 2), 0)
    entry_point = np.zeros(n, np.uint16)
    entry_point[1] = 1  # EntryPoint.MAIN_THREAD
    return {
        "columns": dict(parent=parent, kind=kind, function=function, file=file, line=line,
                        module=module, offset=offset, entry_point=entry_point,
                        entry_names={1: "main thread"}),
        "modules": modules, "files": files,
        "functions": [(fn_names[i], int(fn_module[i]), int(fn_offset[i]), int(fn_file[i]),
                       int(fn_line[i])) for i in range(n_functions)],
        "level_sizes": lv_sizes,
    }


def build_experiment_for(n_nodes: int, n_profiles: int, seed: int, log: Any = print) -> Any:
    """The whole synthetic experiment: tree, tables, 2 metrics, ``n_profiles`` threads whose
    point samples cover a random 10-30% of the leaves each, propagated with ``propagate``."""
    import numpy as np

    from callpath.model import (
        CCT,
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

    t0 = time.perf_counter()
    n_functions = int(min(5000, max(50, n_nodes // 250)))
    tree = generate_tree(n_nodes, n_functions, seed)
    cct = CCT.from_columns(**tree["columns"])
    t1 = time.perf_counter()
    log(f"  tree: {len(cct):,} nodes, depth {int(cct.depth.max())}, {n_functions} functions "
        f"({t1 - t0:.1f} s)")
    scopes = standard_scopes()
    metrics = [standard_metric(name, first, scopes) for name, first in METRICS]
    leaves = np.nonzero(cct.subtree_end == np.arange(len(cct)) + 1)[0]
    leaves = leaves[cct.kind[leaves] < 4]  # not the root or the entry point
    rng = np.random.default_rng(seed + 1)
    hot = rng.lognormal(0.0, 1.5, len(leaves))  # per-leaf cost, shared by all threads
    has_ins = rng.random(len(leaves)) < 0.7  # PAPI_TOT_INS is not sampled everywhere
    contexts, blocks = [], []
    t_prop = 0.0
    for t in range(n_profiles):
        frac = rng.uniform(0.1, 0.3)
        sel = rng.random(len(leaves)) < frac
        ctx = cct.ctx_id[leaves[sel]].astype(np.int64)
        samples = 1 + rng.poisson(hot[sel])
        cpu = samples * 0.005
        ins = samples * rng.uniform(1.5e6, 2.5e6, len(ctx))
        ins_keep = has_ins[sel]
        block = ProfileBlock.from_triples(
            np.concatenate([ctx, ctx[ins_keep]]),
            np.concatenate([np.zeros(len(ctx), np.int64),
                            np.full(int(ins_keep.sum()), METRICS[1][1], np.int64)]),
            np.concatenate([cpu, ins[ins_keep]]))
        tp = time.perf_counter()
        blocks.append(propagate(cct, metrics, scopes, block))
        t_prop += time.perf_counter() - tp
        contexts.append(ExecutionContext(
            t + 1, (Identifier(IdKind.NODE, 0, 0x1234, 1), Identifier(IdKind.THREAD, t))))
    t2 = time.perf_counter()
    n_values = sum(len(b) for b in blocks)
    log(f"  values: {n_values:,} in {n_profiles} profiles ({t2 - t1:.1f} s, of which "
        f"propagate {t_prop:.1f} s = {t_prop / max(n_profiles, 1):.2f} s per profile)")
    exp = build_experiment(
        cct, metrics, scopes, contexts, blocks,
        title=f"synthetic benchmark: {n_nodes} contexts, {n_profiles} profiles, seed {seed}",
        modules=[LoadModule(p) for p in tree["modules"]],
        files=[SourceFile(p) for p in tree["files"]],
        functions=[Function(*f) for f in tree["functions"]])
    log(f"  summary profile: {len(exp.values[0]):,} values "
        f"({time.perf_counter() - t2:.1f} s)")
    return exp


def hatchet_metric_name(name: str) -> str:
    """The name Hatchet's v4 reader gives a metric (it filters metrics by this name):
    lower-cased, a trailing ``(unit)`` dropped, and cputime/realtime/cycles renamed ``time``."""
    name = name.lower().strip()
    if name.endswith(")"):
        name = name[:-1].split("(")[0].lower().strip()
    return "time" if name in ("cputime", "realtime", "cycles") else name


# ---- subprocess workers (standard library only at module level) ---------------------------


def _peak_rss_mib() -> float:
    """Peak resident memory of this process. Linux's ``VmHWM`` first: ``ru_maxrss`` survives
    ``execve`` and, as subprocess starts children with ``vfork``, reports the driver's peak."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for ln in fh:
                if ln.startswith("VmHWM:"):
                    return int(ln.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def worker_callpath(db: str, check: str | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    import callpath

    t1 = time.perf_counter()
    exp = callpath.open(db)
    t2 = time.perf_counter()
    out = {}
    for m in exp.metrics:
        out[m.name] = (exp.inclusive(m), exp.exclusive(m))
    t3 = time.perf_counter()
    res = {"import_s": t1 - t0, "open_s": t2 - t1, "values_s": t3 - t2, "read_s": t3 - t1,
           "peak_rss_mib": _peak_rss_mib(), "nodes": len(exp.cct), "metrics": len(out)}
    if check:
        import numpy as np

        arrays = {"ctx": exp.cct.ctx_id}
        for name, (inc, exc) in out.items():
            arrays[f"{name}|inc"] = inc
            arrays[f"{name}|exc"] = exc
        np.savez(check, **arrays)
    return res


def worker_hatchet(db: str, check: str | None, metric_names: list[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    import hatchet

    t1 = time.perf_counter()
    # Default mode (parallel_profiles_mode=False): the summary profile's sum/min/max of the
    # inclusive ("i") and exclusive ("e") scopes of the metrics named in metric_names.
    gf = hatchet.GraphFrame.from_hpctoolkit_latest(db, metric_names=metric_names)
    t2 = time.perf_counter()
    df = gf.dataframe
    res = {"import_s": t1 - t0, "open_s": t2 - t1, "values_s": 0.0, "read_s": t2 - t1,
           "peak_rss_mib": _peak_rss_mib(), "nodes": len(df), "metrics": len(metric_names),
           "columns": [c for c in df.columns if c != "name"],
           "version": getattr(hatchet, "__version__", "?")}
    if check:
        import numpy as np

        arrays = {"ctx": np.array([n._hatchet_nid for n in df.index], np.int64)}
        for c in res["columns"]:
            arrays[c] = df[c].to_numpy(dtype=np.float64, na_value=0.0)
        np.savez(check, **arrays)
    return res


def worker_phases(db: str) -> dict[str, Any]:
    """callpath's read, timed phase by phase: the reader's and the model's functions are
    wrapped (inclusive times; a phase called inside another is counted in both)."""
    import functools

    t0 = time.perf_counter()
    import callpath
    import callpath.formats.v4.reader as rd
    import callpath.model.cct as cc
    import callpath.model.experiment as ex
    import callpath.model.values as va

    t_import = time.perf_counter() - t0
    acc: dict[str, list[float]] = {}

    def wrap(owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr, None)
        if fn is None:
            return

        @functools.wraps(fn)
        def timed(*a: Any, **k: Any) -> Any:
            s = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                e = acc.setdefault(label, [0.0, 0])
                e[0] += time.perf_counter() - s
                e[1] += 1

        setattr(owner, attr, timed)

    for attr in ("read_v4", "_read_meta", "_read_metrics", "_read_modules", "_read_files",
                 "_read_functions", "_read_tree", "_gather_words", "_read_profiles",
                 "_read_contexts", "_read_traces", "BinFile"):
        wrap(rd, attr, f"reader.{attr}")
    wrap(cc, "_depths", "CCT: _depths")
    wrap(cc, "_subtree_ends", "CCT: _subtree_ends")
    wrap(cc.CCT, "inclusive", "CCT.inclusive")
    wrap(cc.CCT, "exclusive", "CCT.exclusive")
    wrap(ex.Experiment, "summary", "Experiment.summary (profile 0 -> dense)")
    wrap(va.ProfileBlock, "dense", "ProfileBlock.dense")
    wrap(va.ProfileBlock, "ctx_of_values", "ProfileBlock.ctx_of_values")
    wrap(va.BlockStore, "__getitem__", "BlockStore[] (block load, cached)")
    t1 = time.perf_counter()
    exp = callpath.open(db)
    t2 = time.perf_counter()
    for m in exp.metrics:
        exp.inclusive(m)
        exp.exclusive(m)
    t3 = time.perf_counter()
    phases = {k: {"s": v[0], "calls": v[1]} for k, v in acc.items()}
    return {"import_s": t_import, "open_s": t2 - t1, "values_s": t3 - t2, "read_s": t3 - t1,
            "phases": phases, "peak_rss_mib": _peak_rss_mib()}


def worker_main(argv: list[str]) -> None:
    mode, db = argv[0], argv[1]
    check = argv[2] if len(argv) > 2 and argv[2] != "-" else None
    if mode == "callpath":
        res = worker_callpath(db, check)
    elif mode == "hatchet":
        res = worker_hatchet(db, check, argv[3].split(","))
    elif mode == "phases":
        res = worker_phases(db)
    else:
        raise SystemExit(f"unknown worker mode {mode!r}")
    print("RESULT " + json.dumps(res))


# ---- driver -------------------------------------------------------------------------------


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def mib(n: int) -> str:
    x = n / 2**20
    return f"{x:,.0f} MiB" if x >= 100 else f"{x:.1f} MiB"


def ensure_database(n_nodes: int, n_profiles: int, seed: int) -> Path:
    """The cached database for these parameters, generated, written and verified if absent."""
    import numpy as np

    from callpath.formats.v4.reader import read_v4
    from callpath.formats.v4.writer import write_v4

    db = CACHE / f"v4-n{n_nodes}-p{n_profiles}-s{seed}-g{GEN_VERSION}.d"
    if (db / ".complete").exists():
        print(f"database: {db.relative_to(REPO)} (cached, {mib(dir_size(db))})")
        return db
    CACHE.mkdir(parents=True, exist_ok=True)
    print(f"database: generating {n_nodes:,} contexts x {n_profiles} profiles (seed {seed})")
    t0 = time.perf_counter()
    exp = build_experiment_for(n_nodes, n_profiles, seed)
    tmp = Path(tempfile.mkdtemp(prefix=db.name + ".tmp-", dir=CACHE))
    try:
        t1 = time.perf_counter()
        write_v4(exp, tmp, copy_sources=False)
        t2 = time.perf_counter()
        print(f"  write_v4: {t2 - t1:.1f} s")
        back = read_v4(tmp)  # verify: same tree, same summary values
        if not (np.array_equal(back.cct.parent, exp.cct.parent)
                and np.array_equal(back.cct.ctx_id, exp.cct.ctx_id)
                and np.array_equal(back.cct.kind, exp.cct.kind)):
            raise SystemExit("verification failed: the tree read back differs")
        for m, mb in zip(exp.metrics, back.metrics, strict=True):
            for f in ("inclusive", "exclusive"):
                a, b = getattr(exp, f)(m), getattr(back, f)(mb)
                if not np.allclose(a, b, rtol=1e-12, atol=0):
                    raise SystemExit(f"verification failed: {m.name} {f} values differ")
        for k in (1, len(exp.profiles) - 1):
            a, b = exp.values[k], back.values[k]
            if not (np.array_equal(a.ctx_ids, b.ctx_ids) and np.array_equal(a.values, b.values)):
                raise SystemExit(f"verification failed: profile {k} differs")
        del back
        print(f"  verified with read_v4 ({time.perf_counter() - t2:.1f} s)")
        (tmp / ".complete").write_text(json.dumps(
            {"contexts": n_nodes, "profiles": n_profiles, "seed": seed,
             "generator": GEN_VERSION, "generate_s": round(t1 - t0, 1),
             "write_s": round(t2 - t1, 1)}) + "\n")
        if db.exists():
            shutil.rmtree(db)
        tmp.rename(db)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    print(f"  {db.relative_to(REPO)}: {mib(dir_size(db))} "
          f"(total {time.perf_counter() - t0:.1f} s)")
    return db


def hatchet_python() -> Path:
    """The Python of ``bench/.env-hatchet``, created with ``pip install llnl-hatchet`` if it
    is missing or cannot import hatchet."""
    py = HATCHET_ENV / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import hatchet"],
                                      capture_output=True).returncode == 0:
        return py
    print(f"creating {HATCHET_ENV.relative_to(REPO)} with {HATCHET_REQ} (once)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(HATCHET_ENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", HATCHET_REQ], check=True)
    return py


def run_worker(python: Path | str, args: list[str], timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONHASHSEED="0")
    proc = subprocess.run([str(python), str(Path(__file__).resolve()), "_worker", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"worker {args[0]} failed (exit {proc.returncode})")
    res: dict[str, Any] = json.loads(lines[-1][len("RESULT "):])
    res["wall_s"] = wall
    return res


def warm_page_cache(db: Path) -> None:
    """Read every file once so that all repetitions see the same (warm) page cache."""
    for p in sorted(db.iterdir()):
        if p.is_file():
            with open(p, "rb") as fh:
                while fh.read(1 << 24):
                    pass


def compare(cp_file: Path, ht_file: Path) -> tuple[bool, str]:
    """Check that Hatchet and callpath computed the same values, node by node (by ctx id)."""
    import numpy as np

    cp, ht = np.load(cp_file), np.load(ht_file)
    ctx_cp = cp["ctx"].astype(np.int64)
    slot = np.full(int(ctx_cp.max()) + 1, -1, np.int64)
    slot[ctx_cp] = np.arange(len(ctx_cp))
    rows = slot[ht["ctx"]]
    worst = 0.0
    n_cmp = 0
    for name, _ in METRICS:
        hn = hatchet_metric_name(name)
        for col, key in ((f"{hn} (inc)", f"{name}|inc"), (hn, f"{name}|exc")):
            a = cp[key][rows]
            b = ht[col]
            err = np.abs(a - b) / np.maximum(np.abs(a), 1e-300)
            worst = max(worst, float(err.max()) if len(err) else 0.0)
            n_cmp += len(a)
    ok = worst <= 1e-12
    return ok, (f"{'OK' if ok else 'MISMATCH'}: {n_cmp:,} values at {len(rows):,} Hatchet nodes "
            f"(all but the root) compared with callpath's, max relative difference {worst:.1e}")


def fmt_row(label: str, runs: list[dict[str, Any]]) -> str:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    return (f"{label:9s} {med('read_s'):10.3f} {med('open_s'):8.3f} {med('values_s'):8.3f} "
            f"{med('import_s'):8.3f} {med('wall_s'):8.3f} {med('peak_rss_mib'):9,.0f}   "
            + " ".join(f"{r['read_s']:.3f}" for r in runs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, default=10**6, help="calling contexts (10^6)")
    ap.add_argument("--profiles", type=int, default=64, help="execution contexts (64)")
    ap.add_argument("--quick", action="store_true", help="10^4 contexts, 4 profiles")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="repetitions per reader (3)")
    ap.add_argument("--hatchet-repeat", type=int, default=None,
                    help="repetitions for Hatchet (default: --repeat)")
    ap.add_argument("--skip-hatchet", action="store_true")
    ap.add_argument("--no-check", action="store_true",
                    help="do not compare Hatchet's values with callpath's")
    ap.add_argument("--phases", action="store_true",
                    help="also time callpath's read phase by phase")
    ap.add_argument("--timeout", type=float, default=3600.0, help="per run, seconds")
    args = ap.parse_args(argv)
    if args.quick:
        args.contexts, args.profiles = 10**4, 4
    db = ensure_database(args.contexts, args.profiles, args.seed)
    size = dir_size(db)
    files = ", ".join(f"{p.name} {p.stat().st_size / 2**20:,.1f}"
                      for p in sorted(db.iterdir()) if p.suffix == ".db")
    print(f"  files (MiB): {files}")
    warm_page_cache(db)
    h_py = None if args.skip_hatchet else hatchet_python()
    names = ",".join(hatchet_metric_name(n) for n, _ in METRICS)
    h_rep = args.repeat if args.hatchet_repeat is None else args.hatchet_repeat
    cp_runs: list[dict[str, Any]] = []
    same = True
    ht_runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="read_db-") as tmp:
        cp_chk = Path(tmp) / "callpath.npz"
        ht_chk = Path(tmp) / "hatchet.npz"
        check = not args.no_check
        for i in range(max(args.repeat, h_rep)):
            if i < args.repeat:
                chk = str(cp_chk) if check and i == 0 else "-"
                cp_runs.append(run_worker(sys.executable, ["callpath", str(db), chk],
                                          args.timeout))
                print(f"  run {i + 1}: callpath {cp_runs[-1]['read_s']:.3f} s", flush=True)
            if h_py is not None and i < h_rep:
                chk = str(ht_chk) if check and i == 0 else "-"
                ht_runs.append(run_worker(h_py, ["hatchet", str(db), chk, names],
                                          args.timeout))
                print(f"  run {i + 1}: hatchet  {ht_runs[-1]['read_s']:.3f} s", flush=True)
        if check and ht_runs:
            same, msg = compare(cp_chk, ht_chk)
            print("check: " + msg)
    print()
    print(f"{args.contexts:,} calling contexts ({cp_runs[0]['nodes']:,} nodes), "
          f"{args.profiles} execution contexts, {len(METRICS)} metrics; database "
          f"{mib(size)}; {os.cpu_count()} CPUs; warm page cache")
    print("medians, seconds (read = open + all inclusive/exclusive values; wall = whole "
          "subprocess incl. interpreter start and imports)")
    print(f"{'reader':9s} {'read':>10s} {'open':>8s} {'values':>8s} {'import':>8s} "
          f"{'wall':>8s} {'peak MiB':>9s}   read of each run")
    print(fmt_row("callpath", cp_runs))
    if ht_runs:
        print(fmt_row("hatchet", ht_runs))
        c = statistics.median(r["read_s"] for r in cp_runs)
        h = statistics.median(r["read_s"] for r in ht_runs)
        cw = statistics.median(r["wall_s"] for r in cp_runs)
        hw = statistics.median(r["wall_s"] for r in ht_runs)
        print(f"ratio hatchet/callpath: read {h / c:.1f}x, wall {hw / cw:.1f}x "
              f"(Hatchet {ht_runs[0]['version']}, columns {', '.join(ht_runs[0]['columns'])})")
        where = ("" if (args.contexts, args.profiles) == (10**6, 64)
                 else " (the target is set for 10^6 contexts x 64 profiles)")
        print(f"target (read): callpath >= 10x faster than Hatchet: "
              f"{'met' if h / c >= 10 else 'NOT met'}; under 2 s: "
              f"{'met' if c < 2 else 'NOT met'}{where}")
    if args.phases:
        ph = run_worker(sys.executable, ["phases", str(db)], args.timeout)
        print(f"\ncallpath phases (one run, inclusive times; read {ph['read_s']:.3f} s = open "
              f"{ph['open_s']:.3f} + values {ph['values_s']:.3f}):")
        for k, v in sorted(ph["phases"].items(), key=lambda kv: -kv[1]["s"]):
            print(f"  {k:42s} {v['s']:8.3f} s  {v['calls']:4d} calls")
    return 0 if same else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        worker_main(sys.argv[2:])
    else:
        sys.exit(main())
