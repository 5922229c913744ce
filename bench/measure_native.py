"""Benchmark of ``callpath run`` on a CPU-bound C program, against running it plain and under
``perf record -g`` and ``perf record --call-graph dwarf,8192`` (when installed), at 1 kHz and
4 kHz; then post-mortem unwinding throughput against ``perf script`` on DWARF-mode data of the
same program; then unwind recipes (issue 22): their computation in ms per MiB of ``.text`` for
libc and libpython, and unwinding throughput with recipes against CFI on the same samples.

Run-time overhead is the program's own elapsed time (it prints it), median of 5 runs with the
configurations interleaved, as a ratio to the plain median measured in the same run. The total
command time (start-up, post-processing) is shown beside it.

    .venv/bin/python bench/measure_native.py [--runs 5] [--iterations N] [--recipes-only]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from callpath.measure import perf_events as events  # noqa: E402
from callpath.measure import perf_launch as launch  # noqa: E402
from callpath.measure import postmortem  # noqa: E402

SOURCE = ROOT / "tests" / "programs" / "callchain.c"


def elapsed_of(stdout: str) -> float:
    for line in stdout.splitlines():
        if line.startswith("elapsed "):
            return int(line.split()[1]) / 1e9
    raise RuntimeError(f"the benchmark printed no elapsed time:\n{stdout}")


def cpu_of(stdout: str) -> float:
    return sum(int(w[2]) for w in (ln.split() for ln in stdout.splitlines())
               if len(w) == 3 and w[0] == "thread") / 1e9


#: share of complete call paths per configuration (from the runs' own outputs)
COMPLETE: dict[str, list[float]] = {}


def run_once(cmd: list[str], tmp: Path, name: str = "") -> tuple[float, float, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tmp)
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    summary = re.search(r"(\d+) samples in .*? (\d+) partial call paths",
                        " ".join(proc.stderr.split()))
    if name and summary:
        samples, partial = int(summary.group(1)), int(summary.group(2))
        COMPLETE.setdefault(name, []).append(1 - partial / max(samples, 1))
    return elapsed_of(proc.stdout), cpu_of(proc.stdout), total


def perf_complete(perf: str, data: Path) -> float:
    """Share of a perf.data file's samples whose call path reaches the thread's root (``_start``
    for this single-threaded program), from ``perf script``'s call chains."""
    out = subprocess.run([perf, "script", "-i", str(data)], capture_output=True, text=True,
                         check=True).stdout
    n = complete = 0
    for block in out.split("\n\n"):
        frames = [ln.split() for ln in block.splitlines()[1:] if ln[:1].isspace()]
        if not block.strip():
            continue
        n += 1
        if frames and len(frames[-1]) >= 2 and frames[-1][1].split("+")[0] == "_start":
            complete += 1
    return complete / max(n, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=2500,
                    help="outer iterations of the benchmark (2500 ≈ 1.5 s on the dev VM)")
    ap.add_argument("--recipes-only", action="store_true",
                    help="only the unwind-recipe figures (computation, unwinding throughput)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="run-bench-"))
    exe = tmp / "callchain"
    subprocess.run(["gcc", "-O2", "-g", "-pthread", "-o", str(exe), str(SOURCE)], check=True)
    if args.recipes_only:
        recipes_bench(tmp, exe, args.iterations, args.runs)
        shutil.rmtree(tmp, ignore_errors=True)
        return 0
    prog = [str(exe), str(args.iterations), "0"]  # single-threaded: no extra threads
    cp = [sys.executable, "-m", "callpath", "run", "--top", "0"]
    perf = shutil.which("perf")
    configs: dict[str, list[str] | None] = {"plain": prog}
    for hz, period in ((1000, 1_000_000), (4000, 250_000)):
        configs[f"callpath run {hz} Hz"] = [*cp, "-e", f"cpu-clock@{period}", "-o",
                                            f"m-{hz}-{{i}}", "--", *prog]
        configs[f"perf record -g {hz} Hz"] = (
            [perf, "record", "-q", "-g", "-e", "cpu-clock", "-c", str(period), "-o",
             f"perf-{hz}-{{i}}.data", "--", *prog] if perf else None)
        # like for like: perf's DWARF mode also copies 8 KiB of stack with every sample, as
        # callpath does, to unwind code without frame pointers (-g follows frame pointers only)
        configs[f"perf record dwarf {hz} Hz"] = (
            [perf, "record", "-q", "--call-graph", "dwarf,8192", "-e", "cpu-clock", "-c",
             str(period), "-o", f"perf-dwarf-{hz}-{{i}}.data", "--", *prog] if perf else None)
    env_path = str(ROOT / "src")
    os.environ["PYTHONPATH"] = env_path + os.pathsep + os.environ.get("PYTHONPATH", "")
    times: dict[str, list[float]] = {k: [] for k, v in configs.items() if v}
    totals: dict[str, list[float]] = {k: [] for k in times}
    cpus: dict[str, list[float]] = {k: [] for k in times}
    for i in range(args.runs):
        for name, cmd in configs.items():
            if cmd is None:
                continue
            e, c, t = run_once([c.replace("{i}", str(i)) for c in cmd], tmp, name)
            times[name].append(e)
            cpus[name].append(c)
            totals[name].append(t)
    base = statistics.median(times["plain"])
    cbase = statistics.median(cpus["plain"])
    print(f"CPU-bound benchmark: {exe.name} {args.iterations} (single thread), "
          f"medians of {args.runs}; program = its own elapsed time, cpu = its own CPU time")
    print(f"{'configuration':26} {'program s':>10} {'ratio':>7} {'cpu s':>8} {'ratio':>7} "
          f"{'command s':>10}")
    for name in times:
        med = statistics.median(times[name])
        cmed = statistics.median(cpus[name])
        print(f"{name:26} {med:10.3f} {med / base:7.3f} {cmed:8.3f} {cmed / cbase:7.3f} "
              f"{statistics.median(totals[name]):10.3f}")
    for name in configs:
        if configs[name] is None:
            print(f"{name:26} (perf is not installed)")
    # what the overhead buys: call paths that reach the thread's root (-O2, no frame pointers)
    for name, cmd in configs.items():
        if cmd is None or name == "plain":
            continue
        if name.startswith("perf"):
            data = next(a for a in cmd if a.endswith(".data")).replace("{i}", "0")
            COMPLETE[name] = [perf_complete(cmd[0], tmp / data)]
        if name in COMPLETE:
            print(f"{name:26} complete call paths {100 * statistics.median(COMPLETE[name]):5.1f}%")

    # post-mortem unwinding throughput on the same program, with its two extra threads, at
    # 4 kHz and the default stack copies (tens of thousands of samples: fixed costs amortised)
    prog3 = [str(exe), str(args.iterations), "2"]
    out = tmp / "unwind"
    with open(os.devnull, "w") as devnull:  # the program's own output
        saved = os.dup(1)
        os.dup2(devnull.fileno(), 1)
        try:
            launch.run(prog3, launch.RunOptions([events.parse_event("cpu-clock@250000")], out))
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    t0 = time.perf_counter()
    res = postmortem.finish(out)
    dt = time.perf_counter() - t0
    print(f"\nunwinding (decode, unwind, build trees, write; one process, cold caches): "
          f"callpath {res.samples} samples in {dt:.3f} s = "
          f"{res.samples / dt:,.0f} samples/s ({res.partial} partial)")
    if perf:
        data = tmp / "dwarf.data"
        subprocess.run([perf, "record", "-q", "--call-graph", "dwarf,16384", "-e", "cpu-clock",
                        "-c", "250000", "-o", str(data), "--", *prog3], capture_output=True,
                       check=True)
        t0 = time.perf_counter()
        script = subprocess.run([perf, "script", "-i", str(data)], capture_output=True,
                                check=True)
        pdt = time.perf_counter() - t0
        n = sum(1 for ln in script.stdout.splitlines() if ln and not ln[:1].isspace())
        print(f"unwinding: perf script {n} samples in {pdt:.3f} s = {n / pdt:,.0f} samples/s")
        print(f"ratio (callpath / perf script throughput): "
              f"{(res.samples / dt) / (n / pdt):.2f}")
    recipes_bench(tmp, exe, args.iterations, args.runs)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


def _libraries() -> list[Path]:
    import sysconfig
    libs = [Path(p) for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6")
            if Path(p).exists()][:1]
    d, name = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if d and name and (Path(d) / name).exists():
        libs.append(Path(d) / name)
    return libs


def recipes_bench(tmp: Path, exe: Path, iterations: int, runs: int) -> None:
    """Recipe computation per MiB of code (medians of ``runs``), and post-mortem unwinding of
    one raw measurement of the CFI build finished twice: CFI first (every frame from CFI)
    and recipes first (every frame from recipes), recipes cached beforehand."""
    from callpath.structure.unwind_recipes import compute
    print("\nunwind recipes: computation (one process, medians of "
          f"{runs}; the machine was shared)")
    for lib in _libraries():
        secs, cpu = [], []
        for _ in range(runs):
            c0 = time.process_time()
            rec = compute(str(lib))
            cpu.append(time.process_time() - c0)
            secs.append(rec.seconds)
        mib = rec.text_bytes / (1 << 20)
        med, cmed = statistics.median(secs), statistics.median(cpu)
        print(f"  {lib.name:28} {mib:6.2f} MiB of code, {rec.procedures} procedures: "
              f"{med:6.3f} s = {1000 * med / mib:6.0f} ms/MiB elapsed, "
              f"{1000 * cmed / mib:6.0f} ms/MiB CPU")
    prog3 = [str(exe), str(iterations), "2"]
    raw = tmp / "raw-recipes"
    with open(os.devnull, "w") as devnull:
        saved = os.dup(1)
        os.dup2(devnull.fileno(), 1)
        try:
            launch.run(prog3, launch.RunOptions([events.parse_event("cpu-clock@250000")], raw))
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    cache = tmp / "recipe-cache"
    os.environ["CALLPATH_RECIPE_CACHE"] = str(cache)
    results: dict[str, list[float]] = {"cfi": [], "recipes": []}
    shutil.copytree(raw, tmp / "warm")
    os.environ["CALLPATH_UNWIND"] = "recipes"
    postmortem.finish(tmp / "warm")  # fills the recipe cache
    got = {}
    # the unwinding step alone: time spent in unwind.unwind (row lookups included: CFI rows
    # compiled with pyelftools on first use, recipe rows looked up in the cached arrays)
    from callpath.measure import unwind as unwind_mod
    original = unwind_mod.unwind
    in_unwind = [0.0]

    def timed(*a: Any) -> Any:
        t0 = time.process_time()
        try:
            return original(*a)
        finally:
            in_unwind[0] += time.process_time() - t0

    unwind_mod.unwind = timed  # type: ignore[assignment]
    step: dict[str, list[float]] = {"cfi": [], "recipes": []}
    try:
        for i in range(runs):
            for mode in ("cfi", "recipes"):
                d = tmp / f"{mode}-{i}"
                shutil.copytree(raw, d)
                os.environ["CALLPATH_UNWIND"] = mode
                in_unwind[0] = 0.0
                t0 = time.perf_counter()
                got[mode] = postmortem.finish(d)
                results[mode].append(time.perf_counter() - t0)
                step[mode].append(in_unwind[0])
    finally:
        unwind_mod.unwind = original  # type: ignore[assignment]
        del os.environ["CALLPATH_UNWIND"]
    print(f"unwinding the same {got['cfi'].samples} samples (finish: decode, unwind, trees, "
          f"write; medians of {runs}, interleaved):")
    for mode in ("cfi", "recipes"):
        med = statistics.median(results[mode])
        r = got[mode]
        print(f"  {mode + ' first':13} {med:7.3f} s = {r.samples / med:9,.0f} samples/s, "
              f"{r.partial} partial; frames by {r.frame_sources}")
    print(f"  ratio (recipes / CFI throughput): "
          f"{statistics.median(results['cfi']) / statistics.median(results['recipes']):.2f}")
    n = got["cfi"].samples
    for mode in ("cfi", "recipes"):
        med = statistics.median(step[mode])
        print(f"  unwinding step alone, {mode + ' first':13} {med:7.3f} s CPU = "
              f"{n / med:9,.0f} samples/s")
    print(f"  ratio (recipes / CFI, unwinding step): "
          f"{statistics.median(step['cfi']) / statistics.median(step['recipes']):.2f}")


if __name__ == "__main__":
    sys.exit(main())
