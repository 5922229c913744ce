"""Building one module's procedures in several processes gives exactly the one-process result."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import callpath.structure.binary as binary_mod
from callpath.errors import CallpathError
from callpath.structure.binary import analyze_binary
from callpath.structure.parallel import fork_map
from struct_compare import assert_identical

SRC = Path(__file__).parent / "struct_programs" / "calls.c"


def _modules(tmp: Path) -> list[Path]:
    out = []
    if shutil.which("gcc"):
        exe = tmp / "calls"
        subprocess.run(["gcc", "-O2", "-g", "-o", str(exe), str(SRC)], check=True)
        out.append(exe)
    for ld in ("/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"):
        if os.path.isfile(ld):  # ~300 procedures in ~100 files, with DWARF if libc6-dbg is in
            out.append(Path(ld))
            break
    if not out:
        pytest.skip("neither gcc nor the dynamic loader is available")
    return out


@pytest.mark.parametrize("jobs", [2, 3])
def test_parallel_build_isassert_identical(tmp_path: Path, jobs: int,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(binary_mod, "PARALLEL_MIN_PROCS", 0)  # split even small modules
    for path in _modules(tmp_path):
        one = analyze_binary(path)
        assert_identical(analyze_binary(path, jobs=jobs), one)


def _fails_on_two(x: int) -> int:
    if x == 2:
        raise CallpathError("two.so: corrupt")
    if x == 3:
        raise ZeroDivisionError("boom")
    return x * 10


def test_fork_map_results_and_errors() -> None:
    assert fork_map(_fails_on_two, [1, 4, 5]) == [10, 40, 50]
    with pytest.raises(CallpathError, match=r"two\.so: corrupt"):
        fork_map(_fails_on_two, [2, 1])  # raised in the child, reported by the parent
    with pytest.raises(RuntimeError, match="ZeroDivisionError: boom"):
        fork_map(_fails_on_two, [3, 1])


def _dies_unless_last(x: int) -> int:
    if x == 0:
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer would
    return x


def test_fork_map_worker_killed_is_an_error() -> None:
    """A child killed by a signal is reported (a multiprocessing pool would wait forever)."""
    with pytest.raises(CallpathError, match=r"killed by signal 9 \(SIGKILL"):
        fork_map(_dies_unless_last, [0, 1])


def _sleeps_or_fails(arg: tuple[int, str]) -> int:
    x, pidfile = arg
    if x == 0:  # the child: says who it is, then would work for ten minutes
        Path(pidfile).write_text(str(os.getpid()))
        time.sleep(600)
        return 0
    while not Path(pidfile).exists():  # the parent's own item fails once the child runs
        time.sleep(0.01)
    raise CallpathError("last.so: corrupt")


def test_fork_map_parent_failure_kills_the_children(tmp_path: Path) -> None:
    pidfile = str(tmp_path / "child.pid")
    t = time.monotonic()
    with pytest.raises(CallpathError, match=r"last\.so: corrupt"):
        fork_map(_sleeps_or_fails, [(0, pidfile), (1, pidfile)])
    assert time.monotonic() - t < 60  # not the child's ten minutes
    child = int(Path(pidfile).read_text())
    with pytest.raises(ChildProcessError):  # killed and reaped: no zombie left
        os.waitpid(child, os.WNOHANG)
