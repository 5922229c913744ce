"""A matrix of real programs, measured as a new user would measure them.

Our own test programs passed while the first real MPI program came out 100% partial (UCX
patches libc's code at run time). Each case here builds a program of a kind users run — MPI
with the ``mpi`` extra's MPICH (under ``mpirun -n 2`` and as a singleton) and with Debian's
Open MPI, OpenMP, pthreads, fork+exec chains, ``dlopen``/``dlclose`` between phases, code
written at run time, a static binary, PIE and non-PIE, C++ exceptions, Fortran, Python calling
C through ctypes — measures it with ``callpath run``, and checks the exact call chain of a known
routine and the share of samples on complete call paths (>= 99%), printing
``matrix: PROGRAM mpi=... samples=... complete=...``.

Sampling: 4 kHz (``cpu-clock@250000``) for short runs, so that every case has hundreds to
thousands of samples. Partial paths in these programs come from a few places that are the
same in every run (UCX's start-up with stack frames deeper than the 8 KiB stack copy: 2 to 4
samples a rank, measured over many runs); the 1% budget is 10 to 40 times that count at these
sample sizes, so a false failure needs a run with 10x the usual start-up partials.
The chain checks are exact: every sample in ``compute`` must be under the chain the source
dictates.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import mpi_launch
from callpath.formats import measdir
from test_run_native import callpath, perf_ok, symbolised_paths  # noqa: F401
from test_run_python import paths as python_paths

ROOT = Path(__file__).resolve().parents[1]
FIELD = ROOT / "tests" / "field_programs"
RATE = "cpu-clock@250000"
START = [("", "_start"), ("libc.so.6", "__libc_start_main"),
         ("libc.so.6", "__libc_start_call_main")]

Paths = dict[tuple[tuple[str, str], ...], int]


def compile_(out: Path, cc: str, srcs: list[str], name: str, *flags: str) -> Path:
    exe = out / name
    if not exe.exists():
        if shutil.which(cc) is None and not os.path.exists(cc):
            pytest.skip(f"{cc} is not installed")
        # in the output folder: gfortran writes its .mod files where it runs
        subprocess.run([cc, "-O2", "-g", f"-I{FIELD}", *flags, "-o", str(exe),
                        *[str(FIELD / s) for s in srcs]], check=True, capture_output=True,
                       cwd=out)
    return exe


@pytest.fixture(scope="module")
def bindir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    return tmp_path_factory.mktemp("field")


def run(out: Path, *argv: str, env: dict[str, str] | None = None,
        rate: str = RATE) -> measdir.Measurement:
    full = dict(os.environ, **(env or {}))
    full["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + full.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "callpath", "run", "-e", rate, "-o",
                           str(out), "--", *argv], capture_output=True, text=True,
                          env=full, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return measdir.read(out)


def all_paths(m: measdir.Measurement,
              keep: Callable[[measdir.ProcessProfile], bool] = lambda p: True) -> list[Paths]:
    """Symbolised leaf paths of every thread of the processes ``keep`` selects; the module of
    the program itself is written "" so that chains read the same for every build."""
    out = []
    for p in m.processes:
        if not keep(p):
            continue
        exe = os.path.basename(str(p.info.get("exe", "")))
        for t in p.threads:
            paths = symbolised_paths(m, p, t)
            out.append({tuple(("" if mod == exe else mod, f) for mod, f in path): c
                        for path, c in paths.items()})
    return out


def complete_share(threads: list[Paths]) -> tuple[int, float]:
    total = sum(c for t in threads for c in t.values())
    partial = sum(c for t in threads for path, c in t.items() if path[0][1] == "PARTIAL")
    return total, (1 - partial / total) if total else 0.0


def note(capsys: pytest.CaptureFixture[str], program: str, mpi: str, threads: list[Paths]
         ) -> None:
    total, share = complete_share(threads)
    with capsys.disabled():
        print(f"\nmatrix: {program} mpi={mpi} samples={total} complete={100 * share:.2f}%")
    assert total >= 200, f"{program}: only {total} samples"
    assert share >= 0.99, f"{program}: {100 * share:.2f}% complete"


def in_compute(threads: list[Paths], chain: list[tuple[str, str]],
               routine: str = "compute") -> int:
    """Samples with ``routine`` on their path; each must be reached through ``chain`` exactly
    (the frames from the root to ``routine``). Returns how many there were."""
    n = 0
    for t in threads:
        for path, c in t.items():
            names = [f for _m, f in path]
            if routine not in names:
                continue
            upto = names[:names.index(routine) + 1]
            assert upto == [f for _m, f in chain] + [routine], (path, chain)
            n += c
    return n


# -- MPI ---------------------------------------------------------------------------------------

def _mpicc_wheel() -> str:
    cc = Path(sys.executable).parent / "mpicc"
    if not cc.exists():
        pytest.skip("the mpi extra's mpicc is not installed (pip install 'callpath[mpi]')")
    return str(cc)


def _mpi_env() -> dict[str, str]:
    return {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1"}


def _check_mpi_ranks(m: measdir.Measurement, ranks: int) -> list[Paths]:
    ranked = [p for p in m.processes if isinstance(p.info.get("rank"), int)]
    assert sorted(int(p.info["rank"]) for p in ranked) == list(range(ranks))
    threads = all_paths(m, lambda p: isinstance(p.info.get("rank"), int))
    for p in ranked:  # main -> compute exact in every rank, with that rank's work
        mine = all_paths(m, lambda q, p=p: q is p)  # type: ignore[misc]
        assert in_compute(mine, [*START, ("", "main")]) >= 100, p.info["rank"]
    return threads


def _prof_mpi(meas: Path, out: Path, launcher: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **_mpi_env(),
               PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([launcher, "-n", "2", sys.executable, "-m", "callpath", "prof",
                           "--mpi", str(meas), "-o", str(out)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


def _labels(db: Path) -> list[str]:
    rep = callpath("report", str(db), "--contexts")
    assert rep.returncode == 0, rep.stderr
    return [w[1] for w in (ln.split() for ln in rep.stdout.splitlines()[1:])
            if len(w) > 2 and w[0].isdigit() and w[0] != "0" and w[2] == "NODE"]


def test_mpich_wheel_two_ranks(perf_ok: None, bindir: Path, tmp_path: Path,  # noqa: F811
                               capsys: pytest.CaptureFixture[str]) -> None:
    """UCX patches libc pages at run time: the load map must keep libc whole."""
    exe = compile_(bindir, _mpicc_wheel(), ["mpi_app.c"], "mpi_app_mpich")
    launcher = mpi_launch.mpirun()
    assert launcher is not None
    m = run(tmp_path / "m", launcher, "-n", "2", str(exe), "0.5", env=_mpi_env())
    note(capsys, "mpi_app (MPICH wheel, mpirun -n 2)", "MPICH", _check_mpi_ranks(m, 2))
    # launchers: measured, but not contexts of the database; none shares a label
    assert len(m.processes) > 2
    one = callpath("prof", str(tmp_path / "m"), "-o", str(tmp_path / "db"))
    assert one.returncode == 0, one.stderr
    assert "launcher process" in one.stderr
    labels = _labels(tmp_path / "db")
    assert sorted(labels) == ["0.0", "0.1", "1.0", "1.1"], labels
    keep = callpath("prof", "--keep-launchers", str(tmp_path / "m"), "-o",
                    str(tmp_path / "keep"))
    assert keep.returncode == 0, keep.stderr
    labels = _labels(tmp_path / "keep")
    assert len(labels) > 4 and len(set(labels)) == len(labels), labels
    # prof --mpi under mpirun -n 2 writes the same database as prof
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed (pip install 'callpath[mpi]')")
    r = _prof_mpi(tmp_path / "m", tmp_path / "mpi", launcher)
    assert r.returncode == 0, r.stderr
    for name in ("meta.db", "profile.db", "cct.db"):
        assert (tmp_path / "db" / name).read_bytes() == (tmp_path / "mpi" / name).read_bytes()


def test_mpich_wheel_singleton(perf_ok: None, bindir: Path, tmp_path: Path,  # noqa: F811
                               capsys: pytest.CaptureFixture[str]) -> None:
    exe = compile_(bindir, _mpicc_wheel(), ["mpi_app.c"], "mpi_app_mpich")
    m = run(tmp_path / "m", str(exe), "0.4")
    threads = all_paths(m)
    assert in_compute(threads, [*START, ("", "main")]) >= 500
    note(capsys, "mpi_app (MPICH wheel, singleton)", "MPICH", threads)
    # libc is one module again, not the pages UCX patched
    (p,) = m.processes
    libc = [mod for mod in p.modules if os.path.basename(mod.path) == "libc.so.6"]
    assert len(libc) == 1 and libc[0].end - libc[0].start > 1 << 20, libc


def test_open_mpi_two_ranks(perf_ok: None, bindir: Path, tmp_path: Path,  # noqa: F811
                            capsys: pytest.CaptureFixture[str]) -> None:
    """Debian's Open MPI, a second MPI (.ci/run installs it where apt is available)."""
    cc, launcher = shutil.which("mpicc.openmpi"), shutil.which("mpirun.openmpi")
    if cc is None or launcher is None:
        pytest.skip("Debian's Open MPI is not installed (apt-get install openmpi-bin "
                    "libopenmpi-dev)")
    exe = compile_(bindir, cc, ["mpi_app.c"], "mpi_app_ompi")
    flags = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    m = run(tmp_path / "m", launcher, *flags, "--oversubscribe", "-n", "2", str(exe), "0.25",
            env=_mpi_env())
    note(capsys, "mpi_app (Open MPI, mpirun -n 2)", "Open MPI", _check_mpi_ranks(m, 2))
    r = callpath("prof", str(tmp_path / "m"), "-o", str(tmp_path / "db"))
    assert r.returncode == 0, r.stderr
    labels = _labels(tmp_path / "db")
    assert len(set(labels)) == len(labels) and {"0.0", "1.0"} <= set(labels), labels


# -- threads and processes ---------------------------------------------------------------------

def test_openmp(perf_ok: None, bindir: Path, tmp_path: Path,  # noqa: F811
                capsys: pytest.CaptureFixture[str]) -> None:
    exe = compile_(bindir, "gcc", ["omp_app.c"], "omp_app", "-fopenmp")
    m = run(tmp_path / "m", str(exe), "0.3", env={"OMP_NUM_THREADS": "2"})
    (p,) = m.processes
    assert len(p.threads) >= 2
    threads = all_paths(m)
    note(capsys, "omp_app (gcc -fopenmp, 2 threads)", "no", threads)
    # the outlined region under main's GOMP_parallel in the main thread; under the worker's
    # start routine in the other thread
    main_t, worker_t = threads[0], threads[1]
    assert in_compute([main_t], [*START, ("", "main"), ("libgomp.so.1", "GOMP_parallel"),
                                 ("", "main._omp_fn.0")]) >= 100
    n = 0
    for path, c in worker_t.items():
        names = [f for _m, f in path]
        if "compute" in names:
            assert names[0] in ("clone", "clone3", "__clone3") and names[1] == "start_thread", \
                names
            assert names[names.index("compute") - 1] == "main._omp_fn.0", names
            n += c
    assert n >= 100


def test_pthreads(perf_ok: None, bindir: Path, tmp_path: Path,  # noqa: F811
                  capsys: pytest.CaptureFixture[str]) -> None:
    exe = compile_(bindir, "gcc", ["threads_app.c"], "threads_app", "-pthread")
    m = run(tmp_path / "m", str(exe), "0.2")
    threads = all_paths(m)
    assert len(threads) == 3
    note(capsys, "threads_app (pthreads, 3 threads)", "no", threads)
    assert in_compute([threads[0]], [*START, ("", "main")]) >= 100
    for t in threads[1:]:
        assert in_compute([t], [("libc.so.6", "__clone3"), ("libc.so.6", "start_thread"),
                                ("", "worker")]) >= 100


def test_fork_exec_chain(perf_ok: None, bindir: Path, tmp_path: Path,  # noqa: F811
                         capsys: pytest.CaptureFixture[str]) -> None:
    exe = compile_(bindir, "gcc", ["chain.c"], "chain")
    m = run(tmp_path / "m", str(exe), "3", "0.15")
    # three execs of chain (and the forks before each exec)
    execd = [p for p in m.processes if os.path.basename(str(p.info.get("exe", ""))) == "chain"]
    assert len(execd) >= 3
    threads = all_paths(m)
    note(capsys, "chain (fork + exec, 3 programs)", "no", threads)
    for p in m.processes:
        mine = all_paths(m, lambda q, p=p: q is p)  # type: ignore[misc]
        if sum(c for t in mine for c in t.values()) >= 300:
            assert in_compute(mine, [*START, ("", "main")]) >= 200
    db = tmp_path / "db"
    r = callpath("prof", str(tmp_path / "m"), "-o", str(db))
    assert r.returncode == 0, r.stderr
    labels = _labels(db)
    assert len(set(labels)) == len(labels), labels  # one PROCESS n per process


def test_dlopen_dlclose_phases(perf_ok: None, bindir: Path, tmp_path: Path,  # noqa: F811
                               capsys: pytest.CaptureFixture[str]) -> None:
    """Phase 1 in libdla.so, dlclose, phase 2 in libdlb.so loaded at the same address: each
    sample is resolved with the load map of its time."""
    for lib, name in (("libdla.so", "dla_work"), ("libdlb.so", "dlb_work")):
        compile_(bindir, "gcc", ["dlwork.c"], lib, "-shared", "-fPIC", f"-DNAME={name}")
    exe = compile_(bindir, "gcc", ["dlphase.c"], "dlphase", "-ldl")
    env = dict(os.environ)
    out = subprocess.run([str(exe), str(bindir), "0.01"], capture_output=True, text=True,
                         check=True, env=env).stdout
    bases = [ln.split()[-1] for ln in out.splitlines()]
    m = run(tmp_path / "m", str(exe), str(bindir), "0.25")
    threads = all_paths(m)
    note(capsys, "dlphase (dlopen/dlclose, two libraries at "
         f"{'the same' if bases[0] == bases[1] else 'different'} address)", "no", threads)
    for lib, fn in (("libdla.so", "dla_work"), ("libdlb.so", "dlb_work")):
        n = 0
        for path, c in threads[0].items():
            if fn in [f for _m, f in path]:
                assert path[:6] == (*START, ("", "main"), ("", "phase"), (lib, fn)), path
                n += c
        assert n >= 200, (fn, threads[0])
    # no sample of one phase was attributed to the other library's routine
    for path in threads[0]:
        names = [f for _m, f in path]
        assert not ("dla_work" in names and "dlb_work" in names)


def test_jit_code(perf_ok: None, bindir: Path, tmp_path: Path,  # noqa: F811
                  capsys: pytest.CaptureFixture[str]) -> None:
    """Code written at run time is marked [jit], and its caller is proved, not guessed."""
    exe = compile_(bindir, "gcc", ["jit.c"], "jit")
    m = run(tmp_path / "m", str(exe), "0.3")
    threads = all_paths(m)
    note(capsys, "jit (mmap + mprotect(PROT_EXEC) code)", "no", threads)
    jit = sum(c for path, c in threads[0].items() if path[-1][0] == "[jit]")
    assert jit >= 0.8 * sum(threads[0].values())
    for path in threads[0]:
        if path[-1][0] == "[jit]":
            assert path[:-1] == (*START, ("", "main"), ("", "jit_caller")), path


def test_static_binary(perf_ok: None, bindir: Path, tmp_path: Path,  # noqa: F811
                       capsys: pytest.CaptureFixture[str]) -> None:
    try:
        exe = compile_(bindir, "gcc", ["threads_app.c"], "threads_static", "-static",
                       "-pthread")
    except subprocess.CalledProcessError:
        pytest.skip("no static libc here (libc6-dev's libc.a)")
    m = run(tmp_path / "m", str(exe), "0.2")
    threads = all_paths(m)
    note(capsys, "threads_app (static)", "no", threads)
    static_start = [("", "_start"), ("", "__libc_start_main_impl"),
                    ("", "__libc_start_call_main")]
    assert in_compute([threads[0]], [*static_start, ("", "main")]) >= 100
    (p,) = m.processes
    assert not any("libc.so" in mod.path for mod in p.modules)


@pytest.mark.parametrize("pie", ["-pie", "-no-pie"])
def test_pie_and_non_pie(perf_ok: None, bindir: Path, tmp_path: Path, pie: str,  # noqa: F811
                         capsys: pytest.CaptureFixture[str]) -> None:
    flags = [pie, "-fPIE" if pie == "-pie" else "-fno-pie"]
    exe = compile_(bindir, "gcc", ["threads_app.c"], f"threads{pie}", *flags, "-pthread")
    m = run(tmp_path / "m", str(exe), "0.15")
    threads = all_paths(m)
    note(capsys, f"threads_app ({pie})", "no", threads)
    assert in_compute([threads[0]], [*START, ("", "main")]) >= 100


def test_cxx_exceptions(perf_ok: None, bindir: Path, tmp_path: Path,  # noqa: F811
                        capsys: pytest.CaptureFixture[str]) -> None:
    """Samples while exceptions unwind through level3..level1 (libgcc's unwinder, the C++
    runtime) and while level3 computes: every one on a complete path from _start."""
    exe = compile_(bindir, "g++", ["throw.cpp"], "throw")
    m = run(tmp_path / "m", str(exe), "100000", "0.000002")
    threads = all_paths(m)
    note(capsys, "throw (C++ exceptions through 3 frames)", "no", threads)
    prefix = [f for _m, f in START] + ["main", "_Z6level1d", "_Z6level2d"]
    assert in_compute(threads, [*START, ("", "main"), ("", "_Z6level1d"), ("", "_Z6level2d"),
                                ("", "_Z6level3d")]) >= 100
    # while the exception unwinds: __cxa_throw under level3 (its cold part), under main
    unwinding = 0
    for path, c in threads[0].items():
        names = [f for _m, f in path]
        if "__cxa_throw" in names:
            at = names.index("__cxa_throw")
            assert names[:at - 1] == prefix and names[at - 1].startswith("_Z6level3d"), names
            unwinding += c
    assert unwinding >= 100, threads[0]


# -- Fortran and Python ------------------------------------------------------------------------

def test_fortran_loop_nest(perf_ok: None, bindir: Path, tmp_path: Path,  # noqa: F811
                           capsys: pytest.CaptureFixture[str]) -> None:
    """gfortran: the do loop nest of smooth comes out as three loops at lines 8, 9, 10."""
    exe = compile_(bindir, "gfortran", ["loops.f90"], "loops_f")
    m = run(tmp_path / "m", str(exe), "600")
    threads = all_paths(m)
    note(capsys, "loops (gfortran do-loop nest)", "no", threads)
    assert in_compute(threads, [*START, ("", "main"), ("", "MAIN__")],
                      routine="__kernels_MOD_smooth") >= 100
    # the program's own structure is enough for its loops (libgfortran's would take longer)
    db, st = tmp_path / "db", tmp_path / "loops.hpcstruct"
    r = callpath("struct", str(exe), "-o", str(st), "--no-cache")
    assert r.returncode == 0, r.stderr
    r = callpath("prof", str(tmp_path / "m"), "-S", str(st), "-o", str(db))
    assert r.returncode == 0, r.stderr
    rep = callpath("report", str(db), "-v", "flat", "-d", "8", "-f", "csv")
    assert rep.returncode == 0, rep.stderr
    loops = {ln.split("loop at ")[1].split(",")[0].strip('"') for ln in rep.stdout.splitlines()
             if "loop at loops.f90" in ln}
    assert {"loops.f90:8", "loops.f90:9", "loops.f90:10"} <= loops, rep.stdout


def test_python_ctypes(perf_ok: None, bindir: Path, tmp_path: Path,  # noqa: F811
                       capsys: pytest.CaptureFixture[str]) -> None:
    """Python calling C through ctypes: the Python sampler attributes the C call's time to the
    Python line that made it, under the right Python function (1 : 2 by the work asked)."""
    lib = compile_(bindir, "gcc", ["cwork.c"], "libcwork.so", "-shared", "-fPIC")
    out = tmp_path / "m"
    full = dict(os.environ)
    full["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + full.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "callpath", "run", "-o", str(out), "--",
                           sys.executable, str(FIELD / "ctypes_app.py"), str(lib), "0.3"],
                          capture_output=True, text=True, env=full, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    m = measdir.read(out)
    (p,) = [q for q in m.processes if q.info.get("language") == "python"]
    # a sample's value is the thread's CPU time since the previous one: a long C call holds
    # the signal until it returns, then its time arrives in one sample at the calling line
    funcs: dict[str, float] = {}
    for path in python_paths(p, p.threads[0], p.metrics or m.metrics):
        names = [f for _file, f, _line in path.frames]
        for f in ("short_phase", "long_phase"):
            if f in names:
                assert names[:2] == ["<module>", f], names
                funcs[f] = funcs.get(f, 0.0) + path.cpu * 1e-9  # ns
    with capsys.disabled():
        print(f"\nmatrix: ctypes_app (Python -> C) mpi=no short={funcs.get('short_phase', 0):.3g} "
              f"long={funcs.get('long_phase', 0):.3g} (CPU)")
    # 0.3 s and 0.6 s of CPU asked of the C routine (by its thread's CPU clock)
    assert funcs.get("short_phase", 0) >= 0.25
    ratio = funcs.get("long_phase", 0) / funcs["short_phase"]
    assert 1.7 <= ratio <= 2.3, funcs
