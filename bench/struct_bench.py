"""Benchmark ``callpath struct`` on the largest debug-info library at hand (libpython3.11).

Installs Debian's ``libpython3.11-dbg`` (separate debug file under /usr/lib/debug/.build-id)
when run as root and it is missing, then reports, in one run: seconds and peak RSS of the whole
analysis (in a child process, so the RSS is the analysis's own), in one process and with its
procedures built by two (``analyze_binary(jobs=2)``), plus writing the XML; seconds per MiB of
``.text``; and the time of ``readelf --debug-dump=decodedline,info`` on the same debug file as
the floor a C tool sets. Targets: under 20 s and under 400 MB.

    python bench/struct_bench.py [LIBRARY]
"""

from __future__ import annotations

import os
import sys

# This file is named like the standard library's ``struct``: keep its folder off the path.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import glob  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402


def ensure_dbg(lib: str) -> None:
    from callpath.structure.elf import find_debug_file, open_elf
    mod = open_elf(lib)
    have = mod.has_dwarf() or find_debug_file(mod) is not None
    mod.close()
    if have and shutil.which("readelf"):
        return
    if os.geteuid() != 0:
        print("not root: cannot install libpython3.11-dbg; continuing without it")
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "libpython3.11-dbg", "binutils"]
    if subprocess.run(cmd, check=False, env=env, stdout=subprocess.DEVNULL).returncode:
        subprocess.run(["apt-get", "update", "-q"], check=False, env=env,
                       stdout=subprocess.DEVNULL)
        subprocess.run(cmd, check=False, env=env, stdout=subprocess.DEVNULL)


def find_library() -> str:
    # Bookworm's libpython3.11-dbg ships the debug build, libpython3.11d, with its DWARF inside
    # (10+ MB of debug info); prefer it, then the release library (+ /usr/lib/debug if any).
    for pat in ("libpython3.11d.so.1*", "libpython3.11.so.1*"):
        for c in sorted(glob.glob(f"/usr/lib/x86_64-linux-gnu/{pat}")):
            return os.path.realpath(c)
    raise SystemExit("libpython3.11 not found; pass a library path")


def child(path: str, jobs: int) -> None:
    from callpath.formats.hpcstruct import write_hpcstruct
    from callpath.structure.binary import analyze_binary
    from callpath.structure.model import Kind

    t = time.perf_counter()
    s = analyze_binary(path, jobs=jobs)
    dt = time.perf_counter() - t
    t = time.perf_counter()
    with open(os.devnull, "w") as f:
        write_hpcstruct([s], f)
    wt = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    crss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    kinds = {k.name: int((s.kind == k).sum()) for k in Kind}
    print(f"RESULT {dt:.3f} {wt:.3f} {rss:.1f} {crss:.1f} {kinds}")


def measure(lib: str, jobs: int, runs: int = 3) -> tuple[list[float], float, float, float, str]:
    """Analysis seconds per run, median XML-writing seconds, peak RSS (MB) of the analysing
    process and of its largest forked helper, and the scope counts."""
    times, writes, rss, crss, kinds = [], [], 0.0, 0.0, ""
    for _ in range(runs):
        out = subprocess.run([sys.executable, __file__, "--child", lib, str(jobs)],
                             capture_output=True, text=True, check=True).stdout
        line = next(x for x in out.splitlines() if x.startswith("RESULT"))
        _, dt, wt, r, cr, kinds = line.split(" ", 5)
        times.append(float(dt))
        writes.append(float(wt))
        rss, crss = max(rss, float(r)), max(crss, float(cr))
    return times, sorted(writes)[len(writes) // 2], rss, crss, kinds


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        return
    lib = sys.argv[1] if len(sys.argv) > 1 else find_library()
    ensure_dbg(lib)
    if len(sys.argv) <= 1:
        lib = find_library()
    from callpath.structure.elf import find_debug_file, open_elf
    mod = open_elf(lib)
    text = sum(s.size for s in mod.text_sections) / 2**20
    dbg = find_debug_file(mod) if not mod.has_dwarf() else lib
    mod.close()
    print(f"library      {lib}")
    print(f"debug file   {dbg or '(none)'}")
    print(f".text        {text:.2f} MiB")
    print(f"cores        {os.cpu_count()} (load average {os.getloadavg()[0]:.2f} at start)")
    med = 0.0
    rss_all = 0.0
    for jobs in (1, 2):
        times, wt, rss, crss, kinds = measure(lib, jobs)
        m = sorted(times)[1]
        if jobs == 1:
            print(f"scopes       {kinds}")
            med = m
        total_rss = rss + crss * (jobs - 1)
        rss_all = max(rss_all, total_rss)
        print(f"callpath -j{jobs} {m:.2f} s analysis (median of 3: "
              f"{', '.join(f'{x:.2f}' for x in times)}) + {wt:.2f} s XML, peak RSS {rss:.0f} MB"
              + (f" + {crss:.0f} MB per helper" if jobs > 1 else "")
              + f", {m / text:.2f} s/MiB of .text")
        med = min(med, m + wt) if jobs > 1 else m + wt
    if dbg and shutil.which("readelf"):
        t = time.perf_counter()
        subprocess.run(["readelf", "--debug-dump=decodedline,info", dbg],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        rt = time.perf_counter() - t
        print(f"readelf      {rt:.2f} s (--debug-dump=decodedline,info; best callpath "
              f"analysis + XML {med / rt:.1f}x that)")
    print(f"targets      < 20 s: {'yes' if med < 20 else 'NO'} ({med:.2f} s); < 400 MB: "
          f"{'yes' if rss_all < 400 else 'NO'} ({rss_all:.0f} MB, all processes)")


if __name__ == "__main__":
    main()
