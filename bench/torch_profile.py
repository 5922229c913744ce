"""``callpath profile --native`` of a PyTorch CPU training loop: time from program exit to
report, cold and warm, peak memory of ``prof``, disk used (issue 27's goals).

    python bench/torch_profile.py [--seconds 5] [--whole] [--before OTHER/src] [--python PY]

Installs torch (``--torch torch==2.13.0+cpu``: a CPU build, the ``+cpu`` local version never
matches PyPI's CUDA wheels; add ``--index-url https://download.pytorch.org/whl/cpu`` where the
wheel is not on a local index) and callpath into its own venv ``bench/.env-torch`` (once; CI
never runs this). Then, with a fresh structure cache (cold) and again with it filled (warm):

- ``callpath profile --native`` of a small MLP training loop, its wall time, and the time of
  the same loop run alone: their difference is what profiling added (sampling, the native
  stacks' unwinding, structure, attribution, writing, the report); the phases ``profile``
  prints (measure, structure, attribute, write);
- ``callpath prof MEASDIR`` alone, its wall time and peak RSS (``wait4``'s ``ru_maxrss``);
- the measurement directory's and callpath's cache's size (structure, unwind rows,
  recipes: everything under ``$XDG_CACHE_HOME/callpath``).

``--before OTHER/src`` first measures another callpath source tree (main's, before a change)
the same way, with its own fresh cache, in the same run and on the same loop: the figures
before and after a change under the same load. Both trees are byte-compiled first, as an
installed package is.

``--python PY`` uses an interpreter that already has torch instead of the bench's venv
(callpath then runs from this checkout's ``src``, as ``--before``'s tree does; build the C
extensions in place first, ``make lint``).

``--whole`` also times ``callpath struct MEASDIR`` (whole-binary structure of every mapped
module: the way ``profile`` worked before issue 27) and ``prof`` with those files. It takes
minutes and gigabytes on libtorch_cpu.so: that is the point of comparison.

Each ``profile`` line also gives the time after the program (the phases after measure,
summed) and whether structure was built beside the merge ("structure children": only when a
core is free as the merge starts; ``CALLPATH_STRUCTURE_AHEAD=on|off`` in the environment
decides instead, for a comparison on a machine shared with other work).

``--warm N`` repeats the warm run N times (each with the cache the runs before it left) and
prints the median of their time after the program.

Goals (issue 27, two cores): after the program ≤ 15 s cold, ≤ 3 s warm; ``prof`` ≤ 1 GB;
measurement directory + cache ≤ 100 MB. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = ROOT / "bench" / ".env-torch"

TRAIN = '''
import sys, time
import torch
torch.manual_seed(0)
torch.set_num_threads(2)
seconds = float(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 512), torch.nn.ReLU(),
                            torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
x = torch.randn(128, 256)
y = torch.randint(0, 10, (128,))
t0 = time.perf_counter()
steps = 0
while time.perf_counter() - t0 < seconds:
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    steps += 1
print(f"steps {steps} loss {loss.item():.4f}")
'''


def ensure_env(torch_spec: str, index_url: str | None) -> Path:
    py = ENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(ENV)], check=True)
    probe = subprocess.run([str(py), "-c", "import torch, callpath; "
                            "print(torch.__version__, torch.version.cuda)"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        cmd = [str(py), "-m", "pip", "install", "--quiet", torch_spec]
        if index_url:
            cmd += ["--extra-index-url", index_url]
        subprocess.run(cmd, check=True)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", "-e", str(ROOT)],
                       check=True)
        probe = subprocess.run([str(py), "-c", "import torch; print(torch.__version__, "
                                "torch.version.cuda)"], capture_output=True, text=True,
                               check=True)
    print(f"torch {probe.stdout.strip()} in {ENV}")
    return py


CPU: dict[str, float] = {}


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (KiB, the largest process of the tree that ran) and stdout; the
    CPU seconds (user + system, the process and its children) go to ``CPU["last"]``: on a
    machine shared with other work they say more than the wall time."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        CPU["last"] = ru.ru_utime + ru.ru_stime
        out.seek(0)
        text = out.read()
    if p.returncode != 0:
        sys.stdout.write(text[-3000:])
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}")
    return wall, ru.ru_maxrss, text


def du(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def compiled(src: Path, py: Path) -> None:
    """Byte-compile a callpath source tree, as an installed package is: the session's
    PYTHONDONTWRITEBYTECODE would otherwise make every callpath process of the bench compile
    its ~200 modules at start (0.3-0.5 s each, no user pays that)."""
    subprocess.run([str(py), "-m", "compileall", "-q", str(src / "callpath")], check=True,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})


def measure(label: str, py: Path, src: Path | None, work: Path, args: argparse.Namespace,
            alone: float, alone_cpu: float) -> None:
    """Cold and warm ``profile --native``, ``prof`` alone, disk: with the callpath of ``src``
    (None: this checkout, as installed in the bench's venv) and a fresh cache."""
    cp = [str(py), "-m", "callpath"]
    train = work / "train.py"
    cache = work / f"cache-{label}"
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    if src is not None:
        env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    afters: list[float] = []
    for k, kind in enumerate(["cold"] + ["warm"] * args.warm):
        tag = kind if k < 2 else f"warm{k}"
        meas, db = work / f"{label}-{tag}.m", work / f"{label}-{tag}.d"
        wall, _, out = timed([*cp, "profile", "--native", "-m", str(meas), "-o", str(db),
                              "--", str(py), str(train), str(args.seconds)], env)
        phases = re.search(r"^Time:\s+(.*)$", out, re.M)
        # from the program's end to the report's (profile says it), else the phases' sum
        told = re.search(r"\(([\d.]+) s after the program\)", out)
        after = float(told.group(1)) if told else sum(
            float(v) for k, v in re.findall(r"(\w+) ([\d.]+) s", phases.group(1))
            if k != "measure") if phases else float("nan")
        try:
            head = json.loads((meas / "measurement.json").read_text())
        except (OSError, ValueError):
            head = {}
        children = "yes" if "structure_ahead_s" in head else "no"
        if kind == "warm":
            afters.append(after)
        print(f"[{label}] profile --native ({kind} cache): {wall:.2f} s, {wall - alone:.2f} s "
              f"more than the loop alone (CPU {CPU['last']:.2f} s, "
              f"{CPU['last'] - alone_cpu:.2f} s more); after the program {after:.2f} s; "
              f"phases: {phases.group(1) if phases else '?'}; structure children: {children}; "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"[{label}]   measurement directory {du(meas) / 2**20:.1f} MiB, callpath's cache "
              f"{du(cache / 'callpath') / 2**20:.1f} MiB (structure "
              f"{du(cache / 'callpath' / 'structs') / 2**20:.1f} MiB), together "
              f"{(du(meas) + du(cache / 'callpath')) / 1e6:.1f} MB; database "
              f"{du(db) / 2**20:.1f} MiB")
    if len(afters) > 1:
        print(f"[{label}] warm, after the program: "
              f"{', '.join(f'{a:.2f}' for a in sorted(afters))} s; median "
              f"{statistics.median(afters):.2f} s")
    meas = work / f"{label}-warm.m"
    wall, rss, _ = timed([*cp, "prof", str(meas), "-o", str(work / f"{label}-p.d")], env)
    print(f"[{label}] prof alone (warm): {wall:.2f} s, CPU {CPU['last']:.2f} s, peak RSS "
          f"{rss / 1024:.0f} MiB; load average {os.getloadavg()[0]:.1f}")
    shutil.rmtree(meas / "structs", ignore_errors=True)
    shutil.rmtree(cache / "callpath", ignore_errors=True)
    wall, rss, _ = timed([*cp, "prof", str(meas), "-o", str(work / f"{label}-p2.d")], env)
    print(f"[{label}] prof alone (cold): {wall:.2f} s, CPU {CPU['last']:.2f} s, peak RSS "
          f"{rss / 1024:.0f} MiB; load average {os.getloadavg()[0]:.1f}")
    if args.whole:
        wall, rss, _ = timed([*cp, "struct", str(meas), "--no-cache"], env)
        print(f"[{label}] struct MEASDIR (whole binaries, before issue 27): {wall:.2f} s, peak "
              f"RSS {rss / 1024:.0f} MiB, {du(meas / 'structs') / 2**20:.0f} MiB of XML")
        wall, rss, _ = timed([*cp, "prof", str(meas), "-o", str(work / f"{label}-w.d")], env)
        print(f"[{label}] prof with whole structures: {wall:.2f} s, peak RSS "
              f"{rss / 1024:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--torch", default="torch==2.13.0+cpu")
    ap.add_argument("--index-url", default=None)
    ap.add_argument("--whole", action="store_true")
    ap.add_argument("--before", metavar="SRC", default=None,
                    help="also measure the callpath of this source tree (the 'src' folder of "
                    "another checkout, e.g. main's) first, in the same run: before and after")
    ap.add_argument("--python", metavar="PY", default=None,
                    help="an interpreter that has torch (callpath from this checkout's src) "
                    "instead of the bench's own venv")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--warm", type=int, default=1, metavar="N",
                    help="warm runs (each with the cache the runs before it left; the median "
                    "of their time after the program is printed)")
    args = ap.parse_args()
    py = Path(args.python) if args.python else ensure_env(args.torch, args.index_url)
    this = ROOT / "src" if args.python else None
    compiled(ROOT / "src", py)
    before = Path(args.before).resolve() if args.before else None
    if before is not None:
        compiled(before, py)
    work = Path(tempfile.mkdtemp(prefix="torch-bench-"))
    (work / "train.py").write_text(TRAIN)
    env = dict(os.environ, XDG_CACHE_HOME=str(work / "cache-alone"))
    try:
        alone, _, out = timed([str(py), str(work / "train.py"), str(args.seconds)], env)
        alone_cpu = CPU["last"]
        print(f"loop alone: {alone:.2f} s, CPU {alone_cpu:.2f} s "
              f"({out.strip().splitlines()[-1]}); load average {os.getloadavg()[0]:.1f}")
        if before is not None:
            measure("before", py, before, work, args, alone, alone_cpu)
        measure("after" if before is not None else "this", py, this, work, args, alone,
                alone_cpu)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
