"""Attaching without the right to: one line naming the cause and the fix, exit status 2, no
traceback, nothing left behind, the process unharmed.

Exercised for real (as root, with setpriv): an unprivileged user attaching to a root process,
and root without CAP_SYS_PTRACE (a container's default) attaching to another user's process.
``kernel.yama.ptrace_scope`` cannot be set on a kernel without Yama (this one): its messages
are checked by giving ``access_error`` the scope (docs/run.md says which fix each gives)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from callpath.measure import attach_pid as attach
from test_attach import PY_PROGRAM

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534

def _why_not() -> str | None:
    """Why these tests cannot run here, or None: they need root and setpriv, and an
    interpreter that user nobody can run (a pyenv Python built with a shared libpython under
    /root, readable by root alone, cannot be)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return "needs root and setpriv to change user or capabilities"
    probe = subprocess.run([*_drop(NOBODY), sys.executable, "-c", "pass"], capture_output=True,
                           text=True, cwd="/", timeout=60, check=False)
    if probe.returncode != 0:
        err = (probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"])[-1]
        return f"user nobody cannot run {sys.executable} here ({err})"
    return None


def _drop(user: int) -> list[str]:
    return ["setpriv", "--reuid", str(user), "--regid", str(user), "--clear-groups"]


_WHY_NOT = _why_not()
needs_setpriv = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")


def _as(prefix: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    """callpath run through ``prefix`` (a setpriv command line)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src")
    return subprocess.run([*prefix, sys.executable, "-m", "callpath", *args], capture_output=True,
                          text=True, env=env, cwd="/", timeout=120, check=False)


def _start(user: int | None) -> tuple[subprocess.Popen[str], Path]:
    # pytest's directories are root's alone: the stop file goes where another user sees it
    seen = Path(tempfile.mkdtemp(prefix="callpath-access-"))
    seen.chmod(0o755)
    stop = seen / "stop"
    prefix = [] if user is None else _drop(user)
    proc = subprocess.Popen([*prefix, sys.executable, str(PY_PROGRAM), str(stop)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc, stop


def _finish(proc: subprocess.Popen[str], stop: Path) -> None:
    try:
        stop.touch()
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and out.strip() == "done", out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(stop.parent, ignore_errors=True)


def _one_line(proc: subprocess.CompletedProcess[str], *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("callpath: error: --pid "), proc.stderr
    for w in words:
        assert w in lines[0], proc.stderr


@needs_setpriv
def test_unprivileged_user_and_a_root_process(tmp_path: Path) -> None:
    """nobody attaching to a Python program of root: run --pid (Python and --native) and
    dump --pid (holding threads, or reading Python frames only) each say whose process it
    is and what to do."""
    proc, stop = _start(None)
    try:
        drop = _drop(NOBODY)
        out = tmp_path / "m"
        for argv in (["run", "--pid", str(proc.pid), "--duration", "1", "-o", str(out)],
                     ["run", "--pid", str(proc.pid), "--native", "--duration", "1", "-o",
                      str(out)],
                     ["dump", "--pid", str(proc.pid)],
                     ["dump", "--pid", str(proc.pid), "--no-native"]):
            _one_line(_as(drop, *argv), "another user (uid 0; you are uid 65534)",
                      "run callpath as that user", "CAP_SYS_PTRACE")
            assert not out.exists()
        assert proc.poll() is None
    finally:
        _finish(proc, stop)


@needs_setpriv
def test_root_without_cap_sys_ptrace(tmp_path: Path) -> None:
    """root without CAP_SYS_PTRACE (dropped from the bounding set, as a container does)
    attaching to another user's Python program: the kernel refuses, the line names the
    capability to add."""
    proc, stop = _start(NOBODY)
    try:
        drop = ["setpriv", "--bounding-set", "-sys_ptrace"]
        out = tmp_path / "m"
        for argv in (["run", "--pid", str(proc.pid), "--duration", "1", "-o", str(out)],
                     ["dump", "--pid", str(proc.pid)]):
            _one_line(_as(drop, *argv), "does not permit attaching", "--cap-add SYS_PTRACE")
            assert not out.exists()
        time.sleep(0.1)
        assert proc.poll() is None
    finally:
        _finish(proc, stop)


@pytest.mark.parametrize(("scope", "words"), [
    (1, ("ptrace_scope = 1", "ancestors", "sysctl kernel.yama.ptrace_scope=0")),
    (2, ("ptrace_scope = 2", "CAP_SYS_PTRACE", "sysctl kernel.yama.ptrace_scope=1")),
    (3, ("ptrace_scope = 3", "only a reboot")),
])
def test_yama_scope_messages(scope: int, words: tuple[str, ...],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """What each Yama ptrace scope gives for a refused read of a process of the same user
    (this kernel has no Yama, so the scope is handed to the function)."""
    monkeypatch.setattr(attach, "_ptrace_scope", lambda: scope)
    msg = str(attach.access_error(os.getpid(), 1, "read the memory of"))
    assert "\n" not in msg
    for w in words:
        assert w in msg, msg
