"""Overhead of measuring a CPU-bound pure-Python program: callpath, py-spy, pyinstrument, cProfile.

One workload (recursion, loops, method calls, string and dict work; a few seconds) is run plain
and under each tool, ``--repeat`` times each (default 5), interleaved so that drifting load on a
shared machine hits every configuration alike, in a new (seeded) order every round and with one
``PYTHONHASHSEED`` per round for every configuration (the workload's speed depends on the seed
by up to 10%). Four times are taken per run, and one ratio per round (*paired*: work CPU over
plain's in the same round, same seed):

- *work*: the workload's own ``perf_counter`` around its computation (printed by the workload):
  the slowdown of the program itself, free of each tool's start-up and post-processing;
- *work CPU*: the workload process's CPU time over the same span: all that an in-process
  profiler costs, and much less disturbed than wall-clock time when other jobs share the CPUs
  (but blind to an external sampler's cost: py-spy's reading and pausing happen elsewhere);
- *total*: the wall-clock time of the whole command (interpreter and tool start-up, writing the
  profile), as a user waits for it;
- *tree CPU*: the CPU time of every process of the command (``RUSAGE_CHILDREN``): the tool's own
  processes included, start-up and post-processing too.

Three reference configurations show what any in-process sampler at the same rate costs on
this machine: *signal only* arms the sampler's own timer (a POSIX timer on ``CLOCK_MONOTONIC``
signalling the main thread) with a C function that returns at once as the handler (the
interrupt and the signal alone), *empty handler* the same timer with a Python handler that
does nothing, and *callpath bootstrap* runs the program under the launcher and bootstrap with
a timer that never fires (``-F 0.001``).

Medians, and ratios to the plain run's medians, are printed as one table. py-spy and pyinstrument
are installed on first use into ``bench/.env-pyprof`` (a virtualenv of their own: peers to
measure against, never dependencies of callpath); a tool that cannot be installed or run (py-spy
needs ptrace) is reported as such and skipped.

    .venv/bin/python bench/measure_python.py [--repeat 5] [--seconds 3] [--only callpath]
    .venv/bin/python bench/measure_python.py --decompose [--repeat 5] [--depth 0] [--modes ...]

``--decompose`` measures the cost of sampling at 1 kHz (and 100 Hz) in-process instead, far more
precisely than whole runs can on a shared machine: one process alternates blocks of the
workload (about 0.1 s each) with the timer armed and disarmed, 30 pairs, and reports the ratio of
CPU time armed/disarmed for a signal whose handler is a C function that does nothing (the
interrupt and the signal alone), an empty Python handler, and callpath's handler: in C (the
default), in Python with the C stack walk (``CALLPATH_PY_WALK=c-walk``) and all in Python
(``CALLPATH_PY_WALK=python``); ``--modes`` picks some of them; the rounds are interleaved.
``--depth N`` runs the workload under N extra Python frames, as in programs built on frameworks,
whose stacks are 50-100 frames deep.

``--native`` compares ``callpath run --native`` (one call path through Python and native code)
on a mixed workload instead: a third of the time in Python (recursion, loops), a third in a C
library called through ctypes (built here with ``-O2 -g -fomit-frame-pointer``), a third in
numpy matrix products (OpenBLAS, one thread: ``OPENBLAS_NUM_THREADS=1`` for every
configuration); against plain, callpath without ``--native`` and ``py-spy record --native``,
all at 1 kHz (and 100 Hz). *total* and *tree CPU* include callpath's post-mortem merge.

    .venv/bin/python bench/measure_python.py --native [--repeat 5] [--seconds 3]

``--torch PYTHON`` (with ``--native``) runs a small PyTorch CPU training loop instead (a
three-layer MLP, batch 64, SGD: every module call goes through ``tp_call``, every operator
into libtorch and its BLAS) under PYTHON, an interpreter that has torch installed
(``python3.11 -m venv E && E/bin/pip install torch``); callpath runs under this one.

    .venv/bin/python bench/measure_python.py --native --torch E/bin/python [--repeat 5]

``--torch-threads 1`` runs that loop on one thread (``torch.set_num_threads``): torch's OpenMP
workers spin-wait between operators, so with its default (one thread per core) the process's
CPU time moves with how the sampled main thread is scheduled. For ``--native`` the table adds
*proc* and *proc CPU*: the measured process's own wall-clock and CPU time from its start
(``import torch`` included) to the end of the workload, without a tool's post-processing.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PEER_ENV = BENCH / ".env-pyprof"
SAMPLER = REPO / "src" / "callpath" / "measure" / "python" / "sampler.py"
PEERS = ["py-spy==0.4.3", "pyinstrument==5.1.3"]

WORKLOAD = '''
import sys, time

def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

class Vec:
    __slots__ = ("x", "y")
    def __init__(self, x, y):
        self.x, self.y = x, y
    def add(self, o):
        return Vec(self.x + o.x, self.y + o.y)

def vectors(n):
    v = Vec(0, 0)
    d = Vec(1, 2)
    for _ in range(n):
        v = v.add(d)
    return v.x

def words(n):
    counts = {}
    for i in range(n):
        w = "w" + str(i % 97)
        counts[w] = counts.get(w, 0) + 1
    return len(counts)

def loops(n):
    s = 0
    for i in range(n):
        s += i * i % 7
    return s

def work(scale):
    for _ in range(int(scale)):
        fib(22); vectors(60_000); words(60_000); loops(150_000)

def main(scale):
    t0, c0 = time.perf_counter(), time.process_time()
    work(scale)
    print(f"WORK {time.perf_counter() - t0:.6f} CPU {time.process_time() - c0:.6f}")

if __name__ == "__main__":
    main(float(sys.argv[1]))
'''

NATIVE_LIB = r'''
double kernel(long n)
{
    double s = 0.0;
    for (long i = 0; i < n; i++)
        s += (double)(i & 1023) * 1e-9 / (1.0 + (double)(i & 7));
    return s;
}
'''

NATIVE_WORKLOAD = '''
import ctypes, os, sys, time
import numpy as np

lib = ctypes.CDLL(os.environ["BENCH_NATIVE_LIB"])
lib.kernel.restype = ctypes.c_double
lib.kernel.argtypes = [ctypes.c_long]
A = np.random.default_rng(1).random((300, 300))

def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

def loops(n):
    t = 0
    for i in range(n):
        t += i % 7
    return t

def python_part():
    fib(20); loops(100_000)

def c_part():
    lib.kernel(4_000_000)

def numpy_part():
    for _ in range(6):
        (A @ A)[0, 0]

def work(scale):
    for _ in range(int(scale)):
        python_part(); c_part(); numpy_part()

if __name__ == "__main__":
    t0, c0 = time.perf_counter(), time.process_time()
    work(float(sys.argv[1]))
    print(f"WORK {time.perf_counter() - t0:.6f} CPU {time.process_time() - c0:.6f}")
    # the whole process so far: wall-clock time since it started (/proc, clock ticks) and
    # the CPU time of all its threads: import torch, the capture's start and the program
    import os
    with open("/proc/self/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    print(f"PROC {up - start:.3f} {time.process_time():.6f}")
'''


TORCH_WORKLOAD = '''
import sys, time
import torch
from torch import nn

torch.manual_seed(0)
if int(__import__("os").environ.get("BENCH_TORCH_THREADS", "0")):
    torch.set_num_threads(int(__import__("os").environ["BENCH_TORCH_THREADS"]))
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
x = torch.randn(64, 256)
y = torch.randint(0, 10, (64,))

def step():
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return float(loss)

def work(scale):
    for _ in range(int(scale) * 20):
        step()

if __name__ == "__main__":
    t0, c0 = time.perf_counter(), time.process_time()
    work(float(sys.argv[1]))
    print(f"WORK {time.perf_counter() - t0:.6f} CPU {time.process_time() - c0:.6f}")
    # the whole process so far: wall-clock time since it started (/proc, clock ticks) and
    # the CPU time of all its threads: import torch, the capture's start and the program
    import os
    with open("/proc/self/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    print(f"PROC {up - start:.3f} {time.process_time():.6f}")
'''


def native_setup(tmp: Path) -> tuple[Path, str | None]:
    """The mixed workload's script and C library, or why it cannot run here."""
    if shutil.which("gcc") is None:
        return tmp, "gcc is not installed"
    src = tmp / "kernel.c"
    src.write_text(NATIVE_LIB)
    lib = tmp / "libkernel.so"
    r = subprocess.run(["gcc", "-O2", "-g", "-fomit-frame-pointer", "-shared", "-fPIC", "-o",
                        str(lib), str(src)], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        return tmp, f"gcc failed: {r.stderr.strip()[-200:]}"
    os.environ["BENCH_NATIVE_LIB"] = str(lib)
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    script = tmp / "mixed.py"
    script.write_text(NATIVE_WORKLOAD)
    return script, None


def native_configurations(script: Path, scale: float, tmp: Path,
                          spy: str | None, py: str = sys.executable) -> dict[str, list[str]]:
    """Name -> command line for --native (``{i}``: the run number); ``py`` runs the workload
    (another interpreter for ``--torch``; callpath itself runs under this one)."""
    w = [str(script), str(scale)]
    cfg: dict[str, list[str]] = {"plain": [py, *w]}
    run = ["env", f"PYTHONPATH={REPO / 'src'}", sys.executable, "-m", "callpath", "run"]
    for hz in (100, 1000):
        ev = ["-e", f"cpu-clock@f{hz}"]
        cfg[f"callpath {hz} Hz"] = [*run, *ev, "-o", str(tmp / f"py-{hz}-{{i}}"), "--", py, *w]
        cfg[f"callpath --native {hz} Hz"] = [*run, "--native", *ev, "-o",
                                             str(tmp / f"nat-{hz}-{{i}}"), "--", py, *w]
        if spy is not None:
            cfg[f"py-spy --native {hz} Hz"] = [spy, "record", "--native", "-r", str(hz), "-o",
                                               str(tmp / f"spy-{hz}-{{i}}.svg"), "--", py, *w]
    if spy is not None:
        cfg["py-spy 1000 Hz"] = [spy, "record", "-r", "1000", "-o",
                                 str(tmp / "spyp-{i}.svg"), "--", py, *w]
    return cfg


# Installs libc's abs(int) as the SIGPROF handler with sigaction: a C function that returns at
# once, so that a signal costs only the interrupt and its delivery (shared by the scripts below).
C_NOOP_HANDLER = '''
def install_c_noop():
    import ctypes, signal, struct
    libc = ctypes.CDLL(None)
    act = ctypes.create_string_buffer(256)  # struct sigaction: handler, 128-byte mask, flags
    struct.pack_into("<Q", act, 0, ctypes.cast(libc.abs, ctypes.c_void_p).value)
    struct.pack_into("<i", act, 136, 0x10000000)  # SA_RESTART
    if libc.sigaction(signal.SIGPROF, act, None) != 0:
        sys.exit("sigaction failed")
'''

# Runs the workload (argv: KIND HZ WORKLOAD SCALE) with the sampler's own timer signalling, for
# KIND "empty", a Python handler that does nothing (the floor under any in-process
# signal-driven sampler written in Python), for KIND "c" a C function that returns at once (the
# interrupt and the signal alone, what any sampler woken by a timer pays before it does
# anything).
REFERENCE_HANDLER = '''
import importlib.util, runpy, signal, sys
C_NOOP_HANDLER
spec = importlib.util.spec_from_file_location("_s", SAMPLER)
s = importlib.util.module_from_spec(spec); spec.loader.exec_module(s)
def empty(signum, frame):
    pass
if sys.argv[1] == "c":
    install_c_noop()
    handler = None
else:
    signal.signal(signal.SIGPROF, empty)
    handler = empty
timer = s.timer.Timer(signal.SIGPROF)
timer.start(int(1e9 / float(sys.argv[2])), handler)
sys.argv = sys.argv[3:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    timer.stop()
'''

# One process, alternating blocks of work with the timer armed and disarmed (argv: MODE HZ
# PAIRS WORKLOAD_DIR CHUNK OUT); prints the ratio of the CPU time of the armed blocks to that of
# the disarmed ones, and the signals per CPU-second.
DECOMPOSE = '''
import importlib.util, os, signal, sys, time
C_NOOP_HANDLER
mode, hz, pairs, wdir, chunk, out = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), \\
    sys.argv[4], float(sys.argv[5]), sys.argv[6]
depth = int(sys.argv[7])

def nest(n, fn, arg):
    """fn(arg) under n more frames: the deep stacks of programs built on frameworks"""
    return nest(n - 1, fn, arg) if n else fn(arg)
sys.path.insert(0, wdir)
import workload
spec = importlib.util.spec_from_file_location("_s", SAMPLER)
s = importlib.util.module_from_spec(spec); spec.loader.exec_module(s)
count = [0]
if mode == "c":
    install_c_noop()
    handler = None
elif mode == "empty":
    def handler(signum, frame):
        count[0] += 1
    signal.signal(signal.SIGPROF, handler)
else:
    sampler = s.Sampler(out, hz, False)
    handler = sampler.make_handler()
    signal.signal(signal.SIGPROF, handler)
    sampler._open()
timer = s.timer.Timer(signal.SIGPROF)
period = int(1e9 / hz)
workload.work(chunk)
armed = disarmed = 0
for p in range(pairs):
    for on in ((False, True) if p % 2 else (True, False)):
        if on:
            timer.start(period, handler)
        c0 = time.process_time_ns()
        nest(depth, workload.work, chunk)
        c = time.process_time_ns() - c0
        timer.stop()
        if on:
            armed += c
        else:
            disarmed += c
if mode.startswith("callpath"):
    sampler.finish("exit", 0)
    count[0] = sampler.samples
print("RATIO", armed / disarmed, "RATE", count[0] / (armed / 1e9) if mode != "c" else 0)
'''


def peer_python() -> Path | None:
    """The virtualenv holding py-spy and pyinstrument, created on first use."""
    py = PEER_ENV / "bin" / "python"
    if not py.exists():
        print(f"installing {', '.join(PEERS)} into {PEER_ENV.relative_to(REPO)} ...",
              file=sys.stderr)
        try:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEER_ENV)], check=True)
            subprocess.run([str(py), "-m", "pip", "install", "-q", *PEERS], check=True)
        except (subprocess.CalledProcessError, OSError) as e:
            print(f"cannot install the peers: {e}", file=sys.stderr)
            return None
    return py


def _script(template: str) -> str:
    """A script above, with the shared C handler and the sampler's path filled in."""
    return (template.replace("C_NOOP_HANDLER", C_NOOP_HANDLER)
            .replace("SAMPLER", repr(str(SAMPLER))))


def calibrate(py: str, script: Path, seconds: float) -> float:
    """The workload scale that takes about ``seconds`` here."""
    out = subprocess.run([py, str(script), "3"], capture_output=True, text=True, check=True)
    one = float(out.stdout.split("WORK")[1].split()[0]) / 3
    return max(1.0, round(seconds / one))


def configurations(script: Path, scale: float, tmp: Path,
                   peer: Path | None) -> dict[str, list[str]]:
    """Name -> command line; ``{i}`` in an argument stands for the run number."""
    py = sys.executable
    w = [str(script), str(scale)]
    cfg: dict[str, list[str]] = {"plain": [py, *w]}
    launcher = ["env", f"PYTHONPATH={REPO / 'src'}", py, "-m", "callpath.measure.python", "-q"]
    cfg["callpath bootstrap"] = [*launcher, "-o", str(tmp / "cp-0-{i}"), "-F", "0.001", *w]
    ref = _script(REFERENCE_HANDLER)
    for hz in (100, 1000):
        cfg[f"signal only {hz} Hz"] = [py, "-c", ref, "c", str(hz), *w]
        cfg[f"empty handler {hz} Hz"] = [py, "-c", ref, "empty", str(hz), *w]
        cfg[f"callpath {hz} Hz"] = [*launcher, "-o", str(tmp / f"cp-{hz}-{{i}}"), "-F", str(hz),
                                    *w]
    if peer is not None:
        spy = str(peer.parent / "py-spy")
        for hz in (100, 1000):
            for mode in ([], ["--nonblocking"]):
                name = f"py-spy {hz} Hz" + (" nonblocking" if mode else "")
                cfg[name] = [spy, "record", "-r", str(hz), *mode, "-o",
                             str(tmp / f"spy-{hz}-{{i}}.svg"), "--", py, *w]
        for hz in (100, 1000):
            cfg[f"pyinstrument {hz} Hz"] = [
                str(peer), "-m", "pyinstrument", "-i", str(1 / hz), "-r", "text", "-o",
                str(tmp / f"pyi-{hz}-{{i}}.txt"), *w]
    cfg["cProfile"] = [py, "-m", "cProfile", "-o", str(tmp / "cprof-{i}.out"), *w]
    return cfg


class Sample(NamedTuple):
    work: float  # the workload's own wall-clock time for its computation
    work_cpu: float  # ... and its process's CPU time meanwhile (in-process profiling costs)
    total: float  # wall-clock time of the whole command
    tree_cpu: float  # CPU time of the whole command tree (the tool's own processes included)
    proc: float = 0.0  # --native: the measured process's wall-clock time from its start
    proc_cpu: float = 0.0  # ... and its CPU time, all threads (0 where not printed)


def run_once(cmd: list[str], hash_seed: int) -> Sample | str:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=False,
                       env=dict(os.environ, PYTHONHASHSEED=str(hash_seed)))
    total = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0 or "WORK" not in p.stdout:
        return (p.stderr.strip().splitlines() or ["failed"])[-1][:100]
    words = p.stdout.split("WORK")[1].split()
    tree = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    proc = p.stdout.split("PROC")[1].split() if "PROC" in p.stdout else ["0", "0"]
    return Sample(float(words[0]), float(words[2]), total, tree, float(proc[0]), float(proc[1]))


DECOMPOSE_MODES = {"c": "C function (signal only)", "empty": "empty Python handler",
                   "callpath": "callpath, C handler", "callpath-cwalk": "callpath, C walk",
                   "callpath-py": "callpath, Python walk"}
WALK_ENV = {"callpath": "", "callpath-cwalk": "c-walk", "callpath-py": "python"}


def decompose(tmp: Path, repeat: int, depth: int, modes: list[str], pairs: int = 30) -> None:
    """In-process costs of sampling: ratios of armed to disarmed CPU time, per handler."""
    (tmp / "workload.py").write_text(WORKLOAD)
    src = _script(DECOMPOSE)
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                          "import workload, time; t = time.process_time(); workload.work(3); "
                          "print(time.process_time() - t)", str(tmp)],
                         capture_output=True, text=True, check=True)
    chunk = max(1, round(0.1 / (float(out.stdout) / 3)))  # about 0.1 s per block
    rows: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for i in range(repeat):
        for hz in (1000, 100):
            for mode in modes:
                env = dict(os.environ, CALLPATH_PY_WALK=WALK_ENV.get(mode, ""))
                r = subprocess.run([sys.executable, "-c", src, mode, str(hz), str(pairs),
                                    str(tmp), str(chunk), str(tmp / f"dec-{mode}-{hz}-{i}"),
                                    str(depth)],
                                   capture_output=True, text=True, check=False, env=env)
                if "RATIO" not in r.stdout:
                    print(f"  {mode} {hz} Hz failed: {r.stderr.strip()[-200:]}", file=sys.stderr)
                    continue
                words = r.stdout.split()
                rows.setdefault((mode, hz), []).append((float(words[1]), float(words[3])))
                print(f"  round {i + 1}/{repeat} {mode} {hz} Hz: {words[1]}", file=sys.stderr)
    print(f"in-process cost of sampling: CPU time with the timer armed / disarmed, {pairs} "
          f"alternating pairs of ~0.1 s blocks per run, medians of {repeat} runs; "
          f"workload under {depth} extra frames; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'handler':28s} {'rate':>7s} {'cost':>7s} {'runs':>30s}  samples/CPU-s")
    for (mode, hz), rs in rows.items():
        ratios = [r for r, _ in rs]
        rates = [q for _, q in rs if q]
        print(f"{DECOMPOSE_MODES[mode]:28s} {hz:5d}Hz {statistics.median(ratios) - 1:7.2%} "
              f"{' '.join(f'{r:.3f}' for r in ratios):>30s}  "
              f"{statistics.median(rates) if rates else float('nan'):.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--decompose", action="store_true",
                    help="in-process cost of the signal, an empty handler and callpath's handler")
    ap.add_argument("--modes", default=",".join(DECOMPOSE_MODES),
                    help="--decompose: the handlers to measure, comma-separated, of "
                    + ", ".join(DECOMPOSE_MODES))
    ap.add_argument("--depth", type=int, default=0,
                    help="--decompose: run the workload under this many extra frames")
    ap.add_argument("--seconds", type=float, default=3.0, help="plain duration of the workload")
    ap.add_argument("--native", action="store_true",
                    help="mixed Python/native workload: callpath run --native vs py-spy --native")
    ap.add_argument("--torch", metavar="PYTHON", default=None,
                    help="with --native: a small PyTorch CPU training loop run by PYTHON (an "
                    "interpreter that has torch, of the version callpath's capture is built "
                    "for) instead of the mixed workload")
    ap.add_argument("--torch-threads", type=int, default=0, metavar="N",
                    help="with --torch: torch.set_num_threads(N) (default: torch's own, one "
                    "per core; its OpenMP workers spin-wait, which moves CPU figures)")
    ap.add_argument("--only", action="append", default=[],
                    help="run only configurations whose name starts with this (and plain)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-pyrun-"))
    if args.decompose:
        try:
            modes = [m for m in args.modes.split(",") if m]
            unknown = [m for m in modes if m not in DECOMPOSE_MODES]
            if unknown:
                ap.error(f"--modes: unknown {', '.join(unknown)}; expected some of "
                         f"{', '.join(DECOMPOSE_MODES)}")
            decompose(tmp, args.repeat, args.depth, modes)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return 0
    try:
        script = tmp / "workload.py"
        script.write_text(WORKLOAD)
        peer = None if args.only and not any(
            o.startswith(("py-spy", "pyinstrument")) for o in args.only) else peer_python()
        wpy = sys.executable
        if args.torch is not None:
            if not args.native:
                ap.error("--torch: expected with --native")
            wpy = args.torch
            if args.torch_threads:
                os.environ["BENCH_TORCH_THREADS"] = str(args.torch_threads)
            script = tmp / "train.py"
            script.write_text(TORCH_WORKLOAD)
        elif args.native:
            script, why = native_setup(tmp)
            if why is not None:
                print(f"--native: cannot build the mixed workload: {why}", file=sys.stderr)
                return 2
        try:
            scale = calibrate(wpy, script, args.seconds)
        except (subprocess.CalledProcessError, OSError) as e:
            print(f"the workload does not run under {wpy}: {e}", file=sys.stderr)
            return 2
        if args.native:
            spy = str(peer.parent / "py-spy") if peer is not None else None
            cfg = native_configurations(script, scale, tmp, spy, wpy)
        else:
            cfg = configurations(script, scale, tmp, peer)
        if args.only:
            cfg = {k: v for k, v in cfg.items()
                   if k == "plain" or any(k.startswith(o) for o in args.only)}
        results: dict[str, list[Sample]] = {k: [] for k in cfg}
        # work CPU / plain's work CPU in the same round: runs taken back to back share the
        # machine's state of the moment, so the median of these ratios is steadier
        paired: dict[str, list[float]] = {k: [] for k in cfg}
        failed: dict[str, str] = {}
        for i in range(args.repeat):
            # a new order every round (seeded: the same for the same --repeat), so that no
            # configuration always runs right after another or at the same place in the round;
            # one string-hash seed per round for every configuration: the workload's speed
            # depends on it by up to 10% (its dicts of strings), which is noise between rounds
            # and must not be a difference between configurations of one round
            order = list(cfg)
            random.Random(i).shuffle(order)
            this_round: dict[str, Sample] = {}
            for name in order:
                if name in failed:
                    continue
                r = run_once([a.replace("{i}", str(i)) for a in cfg[name]], hash_seed=i + 1)
                if isinstance(r, str):
                    failed[name] = r
                else:
                    results[name].append(r)
                    this_round[name] = r
                print(f"  run {i + 1}/{args.repeat} {name}: {r}", file=sys.stderr)
            if "plain" in this_round:
                for name, r in this_round.items():
                    if name != "plain":
                        paired[name].append(r.work_cpu / this_round["plain"].work_cpu)
        fields = Sample._fields
        base = {f: statistics.median(getattr(x, f) for x in results["plain"]) for f in fields}
        print(f"workload: scale {scale:g}, plain {base['work']:.3f} s; medians of {args.repeat};"
              f" {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
        print("ratios to plain of the medians of: work = the workload's own wall-clock time; "
              "work CPU = its process's CPU time; total = the command's wall-clock time; tree "
              "CPU = CPU time of every process of the command (the tool's included); paired = "
              "median over rounds of work CPU / plain's work CPU in the same round; proc, proc CPU "
              "(--native) = the measured process's own wall-clock and CPU time from its start "
              "to the end of the workload: the whole process, without a tool's post-processing")
        print(f"{'configuration':28s} {'work s':>8s} {'work':>7s} {'work CPU':>9s} "
              f"{'total':>7s} {'tree CPU':>9s} {'paired':>7s} {'proc':>7s} {'proc CPU':>9s}")
        for name, rs in results.items():
            if name in failed:
                print(f"{name:28s} not run: {failed[name]}")
                continue
            med = {f: statistics.median(getattr(x, f) for x in rs) for f in fields}
            print(f"{name:28s} {med['work']:8.3f} {med['work'] / base['work']:7.3f} "
                  f"{med['work_cpu'] / base['work_cpu']:9.3f} {med['total'] / base['total']:7.3f}"
                  f" {med['tree_cpu'] / base['tree_cpu']:9.3f} "
                  f"{statistics.median(paired[name]) if paired[name] else 1.0:7.3f}"
                  f" {med['proc'] / base['proc'] if base['proc'] else 0:7.3f}"
                  f" {med['proc_cpu'] / base['proc_cpu'] if base['proc_cpu'] else 0:9.3f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
