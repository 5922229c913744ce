"""Benchmark ``callpath struct`` of one whole large binary (issue 27: libtorch_cpu.so, 446 MB,
no DWARF; goal <= 60 s with ``-j 2`` and <= 1.5 GB on two cores), and the instruction decoder
that most of its code goes through.

Prints, in one run: the load average before and after; seconds per million instructions of
the C decoder (``structure/_callpath_decode.c``) and of iced-x86 alone on slices of the
library's ``.text``, and their ratio; then wall time, user + system CPU, the peak RSS of the
largest process and the peaks of RSS and PSS summed over the process tree (sampled every
0.1 s from /proc: the analysis forks one child per extra process, and another to write the
second half of the XML; RSS counts the pages they share copy-on-write once per process, PSS
once in all) of ``callpath struct LIBRARY -j 2 --no-cache`` in a child process. With
``--baseline SRC`` (the ``src`` directory of another checkout, e.g. ``git worktree add
/tmp/base main``) the same command runs on that code too, in the same run, and the two
structure files are compared byte for byte (``--compare FILE``: with a structure file
written before).

    python bench/struct_whole.py [LIBRARY] [--baseline SRC] [--compare FILE] [--no-decode]

Measured 2026-11-28 on the two shared cores (libtorch_cpu.so of torch 2.13.0+cpu, 414 MiB;
before = main at b18cada, which at these loads ran one process; after = this tree, which
runs the two that ``-j 2`` asks for; both in the same run, other sessions' work holding most
of a core):

    after    32.8 s wall, 51.6 s CPU, largest process 1194 MiB, all processes 2084 MiB RSS /
             1335 MiB PSS (1.40e9 bytes), load 2.31 -> 2.30
    before   120.4 s wall, 101.3 s CPU, 1260 MiB (one process), load 2.30 -> 2.77
    XML      identical (607,091,247 bytes)
    decoder  C 0.216 s, iced-x86 0.767 s per million instructions (3.6x), same run

An earlier run of the same kind (before the segments were cut a batch at a time, load 0.64
-> 1.96): after 46.0 s wall, 49.0 s CPU, 1202 MiB largest, 1383 MiB PSS; before 107.0 s,
100.4 s CPU, 1279 MiB. ``-j 1`` of the final code: 48.2 s wall, 48.0 s CPU, 1200 MiB. The
first round (2026-11-27, one process at every load): 579 s, 234.3 s CPU, 2490 MiB before
it; 111.2 s, 110.5 s CPU, 1496 MiB after.
"""

from __future__ import annotations

import os
import sys

# keep this folder off the path (bench/ has a file named like a standard module)
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import filecmp  # noqa: E402
import glob  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

SRC = os.path.join(os.path.dirname(_HERE), "src")


def default_library() -> str:
    got = sorted(glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "torch",
                                        "lib", "libtorch_cpu.so")))
    got += sorted(glob.glob("/work/torchenv/lib/python3*/site-packages/torch/lib/"
                            "libtorch_cpu.so"))
    if not got:
        raise SystemExit("libtorch_cpu.so not found (pip install torch); pass a library path")
    return got[0]


def decode_rates(lib: str) -> None:
    """C decoder against iced-x86 on 8 slices of 1 MiB spread over the largest .text."""
    sys.path.insert(0, SRC)
    from callpath.structure import cfg
    from callpath.structure.elf import open_elf

    if cfg._c_decode is None:
        print("decoder      the C extension is not built: iced-x86 only")
        return
    mod = open_elf(lib)
    sec = max(mod.text_sections, key=lambda s: s.size)
    part = min(1 << 20, sec.size // 8)
    tc = ti = 0.0
    n = 0
    for k in range(8):
        lo = sec.addr + k * (sec.size // 8)
        t = time.perf_counter()
        a = cfg.decode(sec.data, sec.addr, lo, lo + part)
        tc += time.perf_counter() - t
        t = time.perf_counter()
        b = cfg.decode(sec.data, sec.addr, lo, lo + part, use_c=False)
        ti += time.perf_counter() - t
        if (a.ip, a.kind, a.target) != (b.ip, b.kind, b.target):
            raise SystemExit(f"decoders disagree in {lib} at {lo:#x}")
        n += len(b.ip)
    mod.close()
    print(f"decoder      {n / 1e6:.2f} M instructions: C {tc / n * 1e6:.3f} s/M, iced-x86 "
          f"{ti / n * 1e6:.3f} s/M ({ti / tc:.1f}x)")


def _pss(pid: int) -> int:
    """Proportional set size of ``pid`` in bytes (pages shared copy-on-write after a fork
    count once over the processes that share them), 0 where it cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for ln in f:
                if ln.startswith("Pss:"):
                    return int(ln.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tree_rss(pid: int) -> tuple[int, int, int]:
    """(resident bytes of ``pid`` and all its descendants together, their proportional set
    size together, number of processes), from /proc (0 where it cannot be read)."""
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(d))
        rss[int(d)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, pss, n, todo = 0, 0, 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        if p in rss:
            n += 1
            pss += _pss(p)
        todo.extend(kids.get(p, []))
    return total, pss, n


def run_struct(src: str, lib: str, out: str
               ) -> tuple[float, float, float, float, float, int]:
    """(wall s, user+sys CPU s, peak RSS MiB of the largest process, peaks of the RSS and of
    the PSS summed over the process tree in MiB (sampled every 0.1 s), most processes seen at
    once) of ``callpath struct lib -j 2`` on ``src``."""
    env = dict(os.environ, PYTHONPATH=src)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "callpath", "struct", lib, "-j", "2",
                              "--no-cache", "-o", out], env=env, stdout=subprocess.DEVNULL)
    peak_sum, peak_pss, most = 0, 0, 0
    while child.poll() is None:
        got, pss, n = _tree_rss(child.pid)
        peak_sum, peak_pss, most = max(peak_sum, got), max(peak_pss, pss), max(most, n)
        time.sleep(0.1)
    wall = time.perf_counter() - t
    if child.returncode:
        raise SystemExit(f"callpath struct failed ({child.returncode}) on {src}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, after.ru_maxrss / 1024, peak_sum / 2**20, peak_pss / 2**20, most


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("library", nargs="?")
    ap.add_argument("--baseline", help="src directory of the code to compare against")
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--compare", metavar="FILE",
                    help="a structure file to compare this tree's output with, byte for byte")
    a = ap.parse_args()
    lib = a.library or default_library()
    print(f"library      {lib} ({os.path.getsize(lib) / 2**20:.0f} MiB)")
    print(f"cores        {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} at start")
    if not a.no_decode:
        decode_rates(lib)
    with tempfile.TemporaryDirectory(prefix="struct-whole-") as d:
        runs = [("this tree", SRC)] + ([("baseline", a.baseline)] if a.baseline else [])
        files = []
        for label, src in runs:
            out = os.path.join(d, f"{len(files)}.hpcstruct")
            load = os.getloadavg()[0]
            wall, cpu, rss, rss_sum, pss_sum, procs = run_struct(src, lib, out)
            files.append(out)
            print(f"{label:12} {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {rss:.0f} MiB "
                  f"(largest process), {rss_sum:.0f} MiB RSS / {pss_sum:.0f} MiB PSS (all "
                  f"{procs} processes together; "
                  f"load {load:.2f} -> {os.getloadavg()[0]:.2f}), "
                  f"{os.path.getsize(out) / 2**20:.0f} MiB of XML")
            if label == "this tree":
                print(f"goal         <= 60 s: {'yes' if wall <= 60 else 'NO'}; <= 1.5 GiB: "
                      f"{'yes' if rss <= 1536 else 'NO'} (largest), "
                      f"{'yes' if pss_sum <= 1536 else 'NO'} (PSS sum); <= 1.5e9 bytes: "
                      f"{'yes' if rss * 2**20 <= 1.5e9 else 'NO'} (largest), "
                      f"{'yes' if pss_sum * 2**20 <= 1.5e9 else 'NO'} (PSS sum)")
        if len(files) == 2:
            same = filecmp.cmp(files[0], files[1], shallow=False)
            print(f"identical    {'yes' if same else 'NO'} (structure files byte for byte)")
        if a.compare:
            same = filecmp.cmp(files[0], a.compare, shallow=False)
            print(f"identical    {'yes' if same else 'NO'} (to {a.compare}, byte for byte)")


if __name__ == "__main__":
    main()
