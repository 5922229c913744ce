"""``callpath profile -- CMD``: run + struct + prof in one command, on a C and a Python
program; the database holds every recorded sample and the report is printed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import callpath
from callpath.formats import measdir
from callpath.model import NodeKind
from conftest import ROOT, perf_reason, run_cli
from prof_tree import find

PROGS = ROOT / "tests" / "prof_programs"


def _check(meas: Path, db: Path) -> callpath.model.Experiment:
    m = measdir.read(meas)
    exp = callpath.open(db)
    for k, info in enumerate(m.metrics):
        recorded = sum(int(t.samples[:, k].sum()) for _, t in m.threads)
        assert exp.inclusive(f"{info.name} (samples)")[0] == recorded
    return exp


def test_profile_c_program(tmp_path: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    reason = perf_reason()
    if reason is not None:
        pytest.skip(f"perf_event sampling is not available here: {reason}")
    exe = tmp_path / "hotloop"
    subprocess.run(["gcc", "-O2", "-g", "-o", str(exe), str(PROGS / "hotloop.c")], check=True)
    meas, db = tmp_path / "m", tmp_path / "d"
    r = run_cli("profile", "-m", str(meas), "-o", str(db), "-d", "20", "--", str(exe), "20000",
                check=True)
    assert "» kernel" in r.stdout and "loop at hotloop.c:13" in r.stdout
    assert f"callpath view {db}" in r.stdout
    exp = _check(meas, db)
    assert find(exp, NodeKind.LOOP, line=12)


def test_profile_python_program(tmp_path: Path) -> None:
    meas, db = tmp_path / "m", tmp_path / "d"
    r = run_cli("profile", "-m", str(meas), "-o", str(db), "--", str(PROGS / "pyloops.py"),
                "1500", check=True)
    assert "» work" in r.stdout and "loop at pyloops.py:12" in r.stdout
    exp = _check(meas, db)
    assert find(exp, NodeKind.FUNCTION, name="helper")
    # the time from the program's end to the report's covers every phase after the program
    import re
    line = re.search(r"^Time:\s+(.*) \(([\d.]+) s after the program\)$", r.stdout, re.M)
    assert line is not None, r.stdout
    later = sum(float(v) for k, v in re.findall(r"(\w+) ([\d.]+) s", line.group(1))
                if k != "measure")
    assert float(line.group(2)) >= later - 0.02, line.group(0)


def test_profile_needs_a_command() -> None:
    r = run_cli("profile")
    assert r.returncode == 2 and r.stderr.count("\n") == 1


@pytest.mark.parametrize("args, needle", [
    (["--python", "--", "{tmp}/missing.py"], "missing.py: no such Python script"),
    (["-F", "-1", "--python", "--", "{tmp}/x.py"], "sampling frequency -1 Hz is out of range"),
    (["-F", "0", "--python", "--", "{tmp}/x.py"], "sampling frequency 0 Hz is out of range"),
])
def test_profile_python_refusal_is_one_line(args: list[str], needle: str,
                                            tmp_path: Path) -> None:
    """The Python sampler's own one-line refusal is the whole message: profile added a
    second line ('the measurement was not written') that said less."""
    (tmp_path / "x.py").write_text("print(1)\n")
    r = run_cli("profile", "-m", str(tmp_path / "m"), "-o", str(tmp_path / "d"),
                *[a.format(tmp=tmp_path) for a in args])
    assert r.returncode == 2, r.stdout
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, r.stderr
    assert not (tmp_path / "d").exists()  # the database directory made for it is gone


def test_profile_leaves_no_empty_database_when_nothing_was_measured(tmp_path: Path) -> None:
    """A program that fails before its first sample: the error, and no empty database
    directory left behind (profile makes it before the run, to refuse a bad -o early)."""
    r = run_cli("profile", "-m", str(tmp_path / "m"), "-o", str(tmp_path / "d"), "--",
                sys.executable, str(tmp_path / "missing.py"))
    assert r.returncode != 0 and "no execution contexts" in r.stderr, r.stderr
    assert not (tmp_path / "d").exists() and (tmp_path / "m" / "measurement.json").exists()


@pytest.mark.parametrize("native", [False, True])
def test_ctrl_c_ends_the_program_and_profile_writes_its_database(tmp_path: Path,
                                                                 native: bool) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) ends the program; profile then writes
    the database and prints the report of what was measured, as ``perf record`` does, and
    exits with the program's status (130). Before, profile itself died of the interrupt and
    killed the launcher a quarter of a second later: no database, and a ``--native`` merge
    cut short."""
    import os
    import signal

    from conftest import interruptible, kill_group

    meas, db = tmp_path / "m", tmp_path / "d"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep +
               os.environ.get("PYTHONPATH", ""))
    prog = ROOT / "tests" / "python_programs" / "ending.py"
    p = subprocess.Popen([sys.executable, "-m", "callpath", "profile", "-m", str(meas),
                          "-o", str(db), *(["--native"] if native else []), "--", str(prog),
                          "wait"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, preexec_fn=interruptible)
    try:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        kill_group(p)
    assert p.returncode == 130, err
    assert "interrupted" not in err and f"callpath view {db}" in out, err
    assert "» work" in out  # the report of the measured program
    exp = _check(meas, db)
    assert find(exp, NodeKind.FUNCTION, name="work")
