"""The reduction in several processes (``-j``) and across MPI ranks (``--mpi``) writes the same
database, byte for byte, as the single-process reduction."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mpi_launch
from conftest import ROOT, perf_reason, run_cli, shared_path

DB_FILES = ("meta.db", "profile.db", "cct.db", "trace.db")


def _same_files(a: Path, b: Path) -> None:
    for name in DB_FILES:
        assert (a / name).exists() == (b / name).exists(), name
        if (a / name).exists():
            assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} differs"


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A callpath measurement of a shell running a C program twice: three process files."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    reason = perf_reason()
    if reason is not None:
        pytest.skip(f"perf_event sampling is not available here: {reason}")
    d = tmp_path_factory.mktemp("prof-par")
    exe = d / "hotloop"
    subprocess.run(["gcc", "-O2", "-g", "-o", str(exe),
                    str(ROOT / "tests" / "prof_programs" / "hotloop.c")], check=True)
    meas = d / "two.m"
    run_cli("run", "-t", "-o", str(meas), "--", "sh", "-c", f"{exe} 6000; {exe} 6000",
            check=True)
    run_cli("struct", str(meas), check=True)
    assert len(list(meas.glob("process-*.cpm"))) >= 2
    return meas


def test_hpctoolkit_threads_in_parallel(tmp_path: Path) -> None:
    meas = shared_path("hpctoolkit", "meas", "loops-cputime-t.m")
    for j in (1, 2, 3):
        run_cli("prof", str(meas), "-j", str(j), "-o", str(tmp_path / f"j{j}"), check=True)
    _same_files(tmp_path / "j1", tmp_path / "j2")
    _same_files(tmp_path / "j1", tmp_path / "j3")


def test_callpath_processes_in_parallel(two_processes: Path, tmp_path: Path) -> None:
    for j in (1, 2):
        run_cli("prof", str(two_processes), "-j", str(j), "-o", str(tmp_path / f"j{j}"),
                check=True)
    _same_files(tmp_path / "j1", tmp_path / "j2")


def _mpi_reason() -> str | None:
    if mpi_launch.mpirun() is None:
        return "no mpirun (pip install 'callpath[mpi]' brings MPICH's)"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed (pip install 'callpath[mpi]')"
    return None


def _mpirun_prof(launcher: str, meas: Path, out: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1",
               PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([launcher, "-n", "2", sys.executable, "-m", "callpath", "prof",
                           "--mpi", str(meas), "-o", str(out)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)


@pytest.mark.parametrize("source", ["hpctoolkit", "callpath"])
def test_mpirun_two_ranks(source: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    reason = _mpi_reason()
    if reason is not None:
        pytest.skip(reason)
    launcher = mpi_launch.mpirun()
    assert launcher is not None
    if source == "hpctoolkit":
        meas = shared_path("hpctoolkit", "meas", "loops-cputime-t.m")
    else:
        meas = request.getfixturevalue("two_processes")
    run_cli("prof", str(meas), "-j", "1", "-o", str(tmp_path / "one"), check=True)
    r = _mpirun_prof(launcher, meas, tmp_path / "mpi")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("written to") == 1  # rank 0 alone writes
    _same_files(tmp_path / "one", tmp_path / "mpi")


@pytest.mark.parametrize("which", [0, -1])
def test_corrupt_file_in_any_share_is_one_line(which: int, tmp_path: Path) -> None:
    """A truncated profile in the share of a forked worker (the first file) or of the parent
    (the last) stops every -j with the same one-line error; a worker's error once hung the
    multiprocessing pool (its exception could not be unpickled)."""
    meas = tmp_path / "m"
    shutil.copytree(shared_path("hpctoolkit", "meas", "loops-cputime-t.m"), meas)
    bad = sorted(meas.glob("*.hpcrun"))[which]
    bad.write_bytes(bad.read_bytes()[:300])
    for j in ("1", "2", "3"):
        p = run_cli("prof", str(meas), "-j", j, "-o", str(tmp_path / f"j{j}"))
        assert p.returncode == 2, (j, p.stderr)
        assert p.stderr.strip() == (f"callpath: error: {bad} at offset 0x124: bad footer "
                                    "(expected magic 'HPCRUNsm')"), (j, p.stderr)


@pytest.mark.parametrize("which", [0, -1])
def test_mpirun_corrupt_file_in_either_rank_is_one_line(which: int, tmp_path: Path) -> None:
    """A truncated profile in rank 0's share (the first file) or rank 1's (the last): rank 0
    hears every rank out, then ends the job with the one-line error of ``-j 1``; no rank is
    left waiting, and no database is written."""
    reason = _mpi_reason()
    if reason is not None:
        pytest.skip(reason)
    launcher = mpi_launch.mpirun()
    assert launcher is not None
    meas = tmp_path / "m"
    shutil.copytree(shared_path("hpctoolkit", "meas", "loops-cputime-t.m"), meas)
    bad = sorted(meas.glob("*.hpcrun"))[which]
    bad.write_bytes(bad.read_bytes()[:300])
    r = _mpirun_prof(launcher, meas, tmp_path / "mpi")
    assert r.returncode != 0, r.stdout
    lines = [x for x in r.stderr.splitlines() if x.startswith("callpath")]
    assert lines == [f"callpath: error: {bad} at offset 0x124: bad footer (expected magic "
                     "'HPCRUNsm')"], r.stderr
    assert not (tmp_path / "mpi" / "meta.db").exists()
