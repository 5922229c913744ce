"""Benchmark of ``callpath prof``: a measurement directory of 256 execution contexts (32
processes × 8 threads) with about 20,000 call paths each, attributed through the real structure
of libc, timed with 1 and 2 workers (median of ``--repeat`` runs), with peak memory.

The timed runs are not watched: peak memory comes from one more run per worker count whose
process tree is sampled from /proc every 0.1 s. Reading ``smaps_rollup`` walks each process's
page tables under its memory-map lock, and on two cores that are both busy at ``-j 2`` it took
about a second from a 14 s run (it costs ``-j 1`` nothing: its second core is idle), which
made the speed-up look worse than it is.

Two references measured in the same run say what two cores can give this job here:

- **independent halves**: two ``callpath prof -j 1`` at once, each on half of the process
  files, writing databases of their own (no shared file, no merge, nothing serial between
  them). The ratio of their wall time to ``-j 1`` is the best a 2-worker split of this job
  could do on this machine at this moment (memory bandwidth, page cache, hypervisor
  included); ``-j 2`` against it is what callpath's coordination costs (the merge, the
  serial steps, the workers taking turns on the shared files).
- **page-cache writes**: 1.5 GB written in 6 MB ``pwrite`` calls by one process into one
  file, by two processes into disjoint halves of one file, and by two processes into two
  files. The kernel copies a buffered write into the page cache under the file's inode lock
  (ext4, xfs), so two writers of one file take turns: a floor under ``-j 2``, whose workers
  write ``profile.db`` and then ``cct.db`` (1.4 GB each) together.

The call paths are synthetic but shaped like an SPMD run: every thread has the same tree
(depth 8, 20,000 leaves, frames at addresses inside libc's procedures, callers as return
addresses, leaves as exact pcs) and its own sample counts, so the merged tree has one copy of
the paths and each context its own values.

Usage: .venv/bin/python bench/prof.py [--contexts 256] [--paths 20000] [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from callpath.formats import measdir as md
from callpath.formats.hpcstruct import read_hpcstruct
from callpath.model import Identifier, IdKind
from callpath.structure.parallel import fork_map

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
THREADS_PER_PROCESS = 8


def _tree(paths: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Parents (preorder-compatible: parents first) and leaf mask of a depth-8 tree."""
    sizes = [4, 16, 64, 256, 1024, 4000, max(paths // 2, 1), paths]
    parent = [-1]
    prev = np.array([0])
    leaf = [False]
    for level, n in enumerate(sizes):
        first = len(parent)
        par = np.sort(rng.choice(prev, size=n))
        parent.extend(par.tolist())
        leaf.extend([level == len(sizes) - 1] * n)
        prev = np.arange(first, first + n)
    p = np.asarray(parent, dtype=np.int64)
    is_leaf = np.asarray(leaf)
    # interior nodes without children are leaves too
    has_child = np.zeros(len(p), bool)
    has_child[p[1:]] = True
    return p, is_leaf | ~has_child


def generate(out: Path, contexts: int, paths: int, struct_file: Path) -> int:
    rng = np.random.default_rng(42)
    s = read_hpcstruct(struct_file)[0]
    ok = s.map_hi - s.map_lo >= 2
    lo, hi = s.map_lo[ok], s.map_hi[ok]
    pick = rng.choice(len(lo), size=5000)
    pool = (lo[pick] + (rng.random(5000) * (hi[pick] - lo[pick] - 1)).astype(np.uint64))
    parent, is_leaf = _tree(paths, rng)
    n = len(parent)
    addr = pool[rng.integers(0, len(pool), size=n)]
    addr = np.where(is_leaf, addr, addr + np.uint64(1))  # callers: return addresses
    flags = np.where(is_leaf, int(md.NodeFlag.EXACT_PC), 0)
    kind = np.full(n, int(md.NodeKind.NATIVE))
    kind[0] = int(md.NodeKind.ROOT)
    module = np.zeros(n, dtype=np.int64)
    module[0] = -1
    nodes = md.make_nodes(parent, kind, module, np.where(kind == 0, 0, addr), flags)
    leaves = np.flatnonzero(is_leaf)
    metric = md.MetricInfo("cpu-clock", "ns", 1_000_000, event="cpu-clock")
    out.mkdir(parents=True)
    md.write_header(out, [metric], command=["synthetic"], status="complete")
    (out / "structs").mkdir()
    shutil.copy(struct_file, out / "structs" / "libc.hpcstruct")
    mod = md.Module(0, LIBC, 0x7F0000000000, 0x7F0000200000, 0, 0)
    total = 0
    for p in range(contexts // THREADS_PER_PROCESS):
        with md.ProcessWriter(out, 1000 + p) as w:
            w.process(pid=1000 + p, ppid=1, generation=0, exe=LIBC, rank=p)
            w.metrics([metric])
            w.modules([mod])
            for t in range(THREADS_PER_PROCESS):
                ids = (Identifier(IdKind.NODE, 0, 0, 1), Identifier(IdKind.RANK, p),
                       Identifier(IdKind.THREAD, t))
                w.thread(t, tid=100000 + p * 100 + t, ids=ids, index=t)
                w.nodes(t, nodes)
                samples = rng.integers(1, 10, size=len(leaves)).astype(np.uint64)
                counts = np.zeros(len(leaves), dtype=md.COUNT_DTYPE)
                counts["node"] = leaves
                counts["samples"] = samples
                counts["value"] = samples.astype(np.float64) * 1e6
                w.counts(t, counts)
                total += int(samples.sum())
    return total


def _tree_pids(root: int) -> list[int]:
    """``root`` and its descendants (from the parent pids in /proc)."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        parent[int(d)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(c for c, pp in parent.items() if pp == p)
    return out


def _memory(pids: list[int]) -> tuple[int, int]:
    """Summed RSS and PSS (KiB) of these processes (PSS splits the pages that forked
    workers share with their parent, so it does not count them twice)."""
    rss = pss = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            continue
    return rss, pss


@dataclass
class Run:
    wall: float  # seconds
    cpu: float  # user + system seconds of the process tree
    rss: int  # peak of the summed RSS of the process tree (KiB, sampled)
    pss: int  # peak of the summed PSS (KiB, sampled)
    max_rss: int  # largest single process (KiB, from the kernel)


def _timed(cmd: list[str], watch: bool = False) -> Run:
    """Run ``cmd``; its wall and CPU time, and with ``watch`` the peak memory of its process
    tree sampled from /proc every 0.1 s (which takes CPU from the run: see the module's
    docstring); without, only the largest process's peak (from the kernel)."""
    peak = [0, 0]
    done = threading.Event()
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)

    def sample() -> None:
        while not done.is_set():
            rss, pss = _memory(_tree_pids(proc.pid))
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
            done.wait(0.1)

    th = threading.Thread(target=sample, daemon=True)
    if watch:
        th.start()
    ru = _reap(cmd, proc)
    wall = time.perf_counter() - t
    done.set()
    if watch:
        th.join()
    return Run(wall, ru.ru_utime + ru.ru_stime, peak[0], peak[1], ru.ru_maxrss)


def _reap(cmd: list[str], proc: subprocess.Popen[bytes]) -> Any:
    """Wait for ``proc`` (running ``cmd``); its resource usage. A failed run ends the bench."""
    _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit status {proc.returncode}")
    return ru


def _spin(_: int) -> float:
    """About a second of CPU-bound numpy work; its wall time."""
    t = time.perf_counter()
    a = np.random.default_rng(0).random(2_000_000)
    for _ in range(60):
        np.sort(a)
    return time.perf_counter() - t


def cores_available() -> float:
    """How many cores two CPU-bound processes actually get together right now (2.0 on an
    idle 2-core machine; 1.0 when other jobs leave the equivalent of one core): what a
    2-worker speed-up can be, at most, at this moment."""
    one = _spin(0)
    t = time.perf_counter()
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(_spin, [0, 1])
    return 2 * one / (time.perf_counter() - t)


def split_halves(meas: Path, out: Path) -> list[Path]:
    """Two measurement directories under ``out``, each with half of ``meas``'s process files
    (the first and the second half in file order, as ``-j 2`` splits them; symbolic links)
    and the same header and structures."""
    files = sorted(meas.glob("*.cpm"))
    cut = (len(files) + 1) // 2
    dirs = []
    for k, part in enumerate((files[:cut], files[cut:])):
        d = out / f"half{k}.m"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        shutil.copy(meas / md.HEADER_FILE, d / md.HEADER_FILE)
        (d / "structs").symlink_to((meas / "structs").resolve())
        for f in part:
            (d / f.name).symlink_to(f.resolve())
        dirs.append(d)
    return dirs


def _timed_together(cmds: list[list[str]]) -> Run:
    """Run ``cmds`` at once; the wall time until the last ends, the CPU time of all."""
    t = time.perf_counter()
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL) for c in cmds]
    cpu = 0.0
    max_rss = 0
    for c, proc in zip(cmds, procs, strict=True):
        ru = _reap(c, proc)
        cpu += ru.ru_utime + ru.ru_stime
        max_rss = max(max_rss, ru.ru_maxrss)
    return Run(time.perf_counter() - t, cpu, 0, 0, max_rss)


WRITE_BYTES = 1536 << 20
WRITE_PIECE = 6 << 20


def _write_share(k: int, paths: list[Path], writers: int) -> None:
    """Writer ``k`` of ``writers``: its share of :data:`WRITE_BYTES`, into a file of its own
    when there is one per writer, else into its part of the one file."""
    buf = np.random.default_rng(k).integers(0, 255, WRITE_PIECE, dtype=np.uint8)
    share = WRITE_BYTES // writers
    at = k * share if len(paths) == 1 else 0
    fd = os.open(paths[k % len(paths)], os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for pos in range(0, share, WRITE_PIECE):
            view = buf.data[:min(WRITE_PIECE, share - pos)]
            done = 0
            while done < len(view):
                done += os.pwrite(fd, view[done:], at + pos + done)
    finally:
        os.close(fd)


def write_rates(base: Path) -> dict[str, float]:
    """Seconds to write :data:`WRITE_BYTES` into the page cache: one process, two processes
    into one file, two into two files (each after the last test's file is gone and 3 s of
    rest, so that its memory can go back to the host as a database's would). The writers
    run through ``fork_map`` (all but the last in a forked child)."""
    out: dict[str, float] = {}
    for name, writers, files in (("one process", 1, 1), ("two processes, one file", 2, 1),
                                 ("two processes, two files", 2, 2)):
        paths = [base / f"write-test-{i}.bin" for i in range(files)]
        time.sleep(3)
        t = time.perf_counter()
        fork_map(functools.partial(_write_share, paths=paths, writers=writers),
                 list(range(writers)))
        out[name] = time.perf_counter() - t
        for path in paths:
            path.unlink(missing_ok=True)
        os.sync()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, default=256)
    ap.add_argument("--paths", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="keep the data in this directory")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="prof-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        struct_file = base / "libc.hpcstruct"
        if not struct_file.exists():
            subprocess.run([sys.executable, "-m", "callpath", "struct", LIBC, "-o",
                            str(struct_file)], check=True)
        meas = base / "bench.m"
        if not meas.exists():
            t = time.perf_counter()
            total = generate(meas, args.contexts, args.paths, struct_file)
            print(f"generated {args.contexts} contexts x ~{args.paths} call paths "
                  f"({total} samples) in {time.perf_counter() - t:.1f} s")
        # callpath prof keeps parsed structure files in a cache ($XDG_CACHE_HOME/callpath/
        # parsed): prime it, so that every timed run is a warm one, and say what cold costs
        t = time.perf_counter()
        read_hpcstruct(meas / "structs" / "libc.hpcstruct", cache=False)
        cold = time.perf_counter() - t
        read_hpcstruct(meas / "structs" / "libc.hpcstruct")
        t = time.perf_counter()
        read_hpcstruct(meas / "structs" / "libc.hpcstruct")
        print(f"structure of libc: parse {cold:.2f} s, from the parse cache "
              f"{time.perf_counter() - t:.2f} s; every run below reads it from the cache")
        results: dict[int, list[Run]] = {}
        halves: list[Run] = []
        half_dirs = split_halves(meas, base)
        load = [os.getloadavg()[0]]
        cores = [cores_available()]
        # alternate -j 1 and -j 2 so that both see the same background load
        for _ in range(args.repeat):
            for j in (1, 2):
                # not timed: replacing the 3 GB database of the run before last waits for the
                # kernel to finish writing it back (up to 1.5 s in os.replace), which measures
                # the bench's history, not callpath prof; so it is removed and synced first
                shutil.rmtree(base / f"j{j}.d", ignore_errors=True)
                os.sync()
                results.setdefault(j, []).append(_timed(
                    [sys.executable, "-m", "callpath", "prof", str(meas), "-j", str(j), "-o",
                     str(base / f"j{j}.d")]))
                load.append(os.getloadavg()[0])
            outs = [base / f"half{k}.d" for k in range(2)]
            for o in outs:
                shutil.rmtree(o, ignore_errors=True)
            os.sync()
            halves.append(_timed_together(
                [[sys.executable, "-m", "callpath", "prof", str(d), "-j", "1", "-o", str(o)]
                 for d, o in zip(half_dirs, outs, strict=True)]))
            for o in outs:
                shutil.rmtree(o, ignore_errors=True)
            cores.append(cores_available())
        watched: dict[int, Run] = {}
        for j in (1, 2):  # peak memory, from runs of their own (watching them costs time)
            shutil.rmtree(base / f"m{j}.d", ignore_errors=True)
            os.sync()
            watched[j] = _timed([sys.executable, "-m", "callpath", "prof", str(meas), "-j",
                                 str(j), "-o", str(base / f"m{j}.d")], watch=True)
            shutil.rmtree(base / f"m{j}.d", ignore_errors=True)
        med: dict[int, float] = {}
        for j, runs in results.items():
            med[j] = statistics.median(r.wall for r in runs)
            cpu = statistics.median(r.cpu for r in runs)
            w = watched[j]
            print(f"callpath prof -j {j}: {med[j]:6.1f} s wall, {cpu:6.1f} s CPU (medians of "
                  f"{args.repeat}; walls {', '.join(f'{r.wall:.1f}' for r in runs)}); peak "
                  f"memory of the process tree (a run of its own, {w.wall:.1f} s while "
                  f"watched): RSS {w.rss / 1024:.0f} MiB, PSS {w.pss / 1024:.0f} MiB; largest "
                  f"process {max(r.max_rss for r in [*runs, w]) / 1024:.0f} MiB")
        print(f"load average (1 min) before and after each run: "
              f"{', '.join(f'{x:.1f}' for x in load)} on {os.cpu_count()} cores")
        print(f"cores two CPU-bound processes got together (before the runs and after each "
              f"pair): {', '.join(f'{c:.2f}' for c in cores)} (2.00 = two idle cores)")
        ratios = [b.wall / a.wall for a, b in zip(results[1], results[2], strict=True)]
        same = all((base / "j1.d" / f).read_bytes() == (base / "j2.d" / f).read_bytes()
                   for f in ("meta.db", "profile.db", "cct.db"))
        print(f"-j 2 / -j 1 wall time: {statistics.median(ratios):.2f} (median of the "
              f"ratios of runs taken back to back: {', '.join(f'{r:.2f}' for r in ratios)}); "
              f"databases identical: {same}")
        hmed = statistics.median(r.wall for r in halves)
        h_one = [h.wall / a.wall for a, h in zip(results[1], halves, strict=True)]
        j2_h = [b.wall / h.wall for b, h in zip(results[2], halves, strict=True)]
        print(f"independent halves (two prof -j 1 at once, half of the files each): "
              f"{hmed:.1f} s wall, {statistics.median(r.cpu for r in halves):.1f} s CPU "
              f"(walls {', '.join(f'{r.wall:.1f}' for r in halves)}); halves / -j 1: "
              f"{statistics.median(h_one):.2f} ({', '.join(f'{r:.2f}' for r in h_one)}), "
              f"the best a 2-way split gets here; -j 2 / halves: "
              f"{statistics.median(j2_h):.2f} ({', '.join(f'{r:.2f}' for r in j2_h)})")
        rates = write_rates(base)
        print(f"page-cache writes of {WRITE_BYTES >> 20} MiB in {WRITE_PIECE >> 20} MiB "
              f"pwrites: " + ", ".join(f"{k} {v:.2f} s" for k, v in rates.items()))
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
