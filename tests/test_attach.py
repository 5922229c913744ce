"""``callpath run --pid``: measuring a C program that was started before the profiler.

The program (``programs/attach_spin.c``) loops in ``hot_loop`` (4/5 of its work) until a stop
file exists, then prints "done" and exits 0: the tests check that attaching finds the same
share for ``hot_loop`` as ``callpath run`` of the same program, that the program keeps running
and exits normally afterwards, and that a thread started while attached is measured too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from callpath.formats import measdir
from test_run_native import build, callpath, perf_ok, symbolised_paths  # noqa: F401

#: 5 kHz: two seconds at a quarter of a CPU (a loaded machine) still give 2,500 samples
EVENT = "cpu-clock@200000"
#: Samples each side needs so that a 5-point difference of two shares near 0.8 is > 4 sigma
#: (sigma = sqrt(2 * 0.16 / n) = 0.0126 at n = 2000: a false failure well under 1 in 10^4)
MIN_SAMPLES = 2000


def _counts(out: Path, proc: str) -> tuple[int, int]:
    """(samples whose leaf is ``proc``, all samples) of the main thread of the measurement."""
    m = measdir.read(out)
    hit = total = 0
    for p in m.processes:
        for t in p.threads:
            if t.tid != p.pid:
                continue
            for path, n in symbolised_paths(m, p, t).items():
                total += n
                hit += n if path and path[-1][1] == proc else 0
    return hit, total


class Spinner:
    """The test program running in the background, stopped (normally) by its stop file."""

    def __init__(self, exe: Path, tmp: Path) -> None:
        self.stop_file = tmp / f"stop-{time.monotonic_ns()}"
        self.proc = subprocess.Popen([str(exe), str(self.stop_file)], stdout=subprocess.PIPE,
                                     text=True, start_new_session=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "ready\n"

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        self.stop_file.touch()
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def test_attach_share_matches_run_and_program_survives(perf_ok: None, build,  # type: ignore[no-untyped-def]  # noqa: F811
                                                        tmp_path: Path) -> None:
    exe = build("attach_spin.c", "attach_spin")
    # callpath run of the program, stopped after 2 s (again while too few samples)
    hit_r = tot_r = 0
    for k in range(4):
        stop = tmp_path / f"run-stop-{k}"
        timer = threading.Timer(2.0, stop.touch)
        timer.start()
        try:
            proc = callpath("run", "-e", EVENT, "-o", str(tmp_path / f"run-{k}"), "--",
                            str(exe), str(stop))
        finally:
            timer.cancel()
            stop.touch()
        assert proc.returncode == 0, proc.stderr
        h, t = _counts(tmp_path / f"run-{k}", "hot_loop")
        hit_r, tot_r = hit_r + h, tot_r + t
        if tot_r >= MIN_SAMPLES:
            break
    spin = Spinner(exe, tmp_path)
    try:
        hit_a = tot_a = 0
        for k in range(4):
            out = tmp_path / f"attach-{k}"
            proc = callpath("run", "--pid", str(spin.proc.pid), "--duration", "2", "-e", EVENT,
                            "-o", str(out))
            assert proc.returncode == 0, proc.stderr
            assert "kept running" in proc.stderr, proc.stderr
            assert spin.proc.poll() is None
            h, t = _counts(out, "hot_loop")
            hit_a, tot_a = hit_a + h, tot_a + t
            if tot_a >= MIN_SAMPLES:
                break
        m = measdir.read(tmp_path / "attach-0")
        assert m.header["status"] == "complete" and m.header["attached_pid"] == spin.proc.pid
        # the modules loaded before attaching are known: the program and libc
        (p,) = m.processes
        mods = {os.path.basename(mod.path) for mod in p.modules}
        assert exe.name in mods and any(x.startswith("libc") for x in mods), mods
        status, text = spin.finish()
    finally:
        spin.kill()
    assert status == 0 and text.strip() == "done"
    assert tot_r >= MIN_SAMPLES and tot_a >= MIN_SAMPLES, (tot_r, tot_a)
    share_r, share_a = hit_r / tot_r, hit_a / tot_a
    assert abs(share_r - share_a) <= 0.05, (share_r, share_a, tot_r, tot_a)
    assert 0.6 < share_a < 0.95, share_a


def test_attach_until_exit_and_new_thread(perf_ok: None, build,  # type: ignore[no-untyped-def]  # noqa: F811
                                          tmp_path: Path) -> None:
    """No --duration: measures until the program exits; a thread born while attached (after
    SIGUSR1) is its own context, sampled in thread_hot."""
    exe = build("attach_spin.c", "attach_spin")
    spin = Spinner(exe, tmp_path)
    out = tmp_path / "m"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
    try:
        prof = subprocess.Popen([sys.executable, "-m", "callpath",
                                 "run", "--pid", str(spin.proc.pid), "-o", str(out)],
                                env=env, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while not (out / "raw.perf").exists():  # written once the events are enabled
                assert prof.poll() is None, prof.communicate()[1]
                assert time.monotonic() < deadline
                time.sleep(0.05)
            spin.proc.send_signal(signal.SIGUSR1)
            time.sleep(1.5)
            status, text = spin.finish()
            _, err = prof.communicate(timeout=120)
        finally:
            if prof.poll() is None:
                prof.kill()
                prof.wait()
    finally:
        spin.kill()
    assert status == 0 and text.strip() == "done"
    assert prof.returncode == 0, err
    assert "the process exited" in err, err
    m = measdir.read(out)
    (p,) = m.processes
    others = [t for t in p.threads if t.tid != p.pid]
    assert others, "the thread started while attached was not measured"
    leaves = {path[-1][1] for t in others for path in symbolised_paths(m, p, t) if path}
    assert "thread_hot" in leaves, leaves


def test_attach_user_errors(tmp_path: Path) -> None:
    """No such process, a kernel thread, a command with --pid, --duration without --pid: one
    line each, exit status 2, no traceback; nothing is left behind."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    cases = [
        (["run", "--pid", str(pid_max + 1)], "no such process"),
        (["run", "--pid", "2"], "kernel thread"),
        (["run", "--pid", "0"], "expected a process id"),
        (["run", "--pid", str(os.getpid()), "--", "true"], "expected no command"),
        (["run", "--duration", "1", "--", "true"], "only with --pid"),
        (["run", "--pid", str(os.getpid()), "--duration", "-1"], "positive number of seconds"),
        (["profile", "--pid", str(pid_max + 1)], "no such process"),
        (["run", "--pid", str(os.getpid()), "-e", "gpu=nvidia"], "GPU events"),
        (["run", "--pid", str(os.getppid()), "-e", "cpu-clock", "--native"],
         "expected one of them"),
    ]
    for argv, words in cases:
        proc = callpath(*argv, "-o" if argv[0] == "run" else "-m", str(tmp_path / "m"))
        assert proc.returncode == 2, (argv, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and words in lines[0], (argv, proc.stderr)
        assert not (tmp_path / "m").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process as another user")
def test_attach_other_user_is_refused(tmp_path: Path) -> None:
    """A process of another user, measured by an unprivileged user: the cause and the fix."""
    victim = subprocess.Popen(["sleep", "60"], user=65534)
    try:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
        # everything imported before dropping privileges (the interpreter's files may be
        # unreadable to the unprivileged user)
        code = ("import sys, os, argparse; from callpath.cli.main import main, build_parser; "
                "build_parser(); "
                "import callpath.cli.run, callpath.cli.attach, callpath.measure.attach_pid, "
                "callpath.measure.perf_events, callpath.measure.postmortem, importlib.util; "
                "import contextlib; exec('with contextlib.suppress(ImportError): "
                "import callpath.measure.gpu.session'); "
                "os.setgid(65533); os.setgroups([]); os.setuid(65533); "
                "sys.exit(main(sys.argv[1:]))")
        proc = subprocess.run([sys.executable, "-c", code, "run", "--pid", str(victim.pid),
                               "--duration", "1", "-o", str(tmp_path / "m")],
                              capture_output=True, text=True, env=env, cwd="/", timeout=120,
                              check=False)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "another user" in lines[0] and "as root" in lines[0], \
            proc.stderr
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


PY_PROGRAM = Path(__file__).resolve().parent / "programs" / "attach_py.py"
PYTHONS = [f"python3.{m}" for m in (11, 12, 13)]


def _line_of(tag: str) -> int:
    lines = PY_PROGRAM.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(tag))


class PySpinner(Spinner):
    def __init__(self, python: str, tmp: Path) -> None:
        self.stop_file = tmp / f"stop-{time.monotonic_ns()}"
        self.proc = subprocess.Popen([python, str(PY_PROGRAM), str(self.stop_file)],
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "ready\n"


def _python(name: str) -> str:
    """The interpreter ``name`` from PATH, else from pyenv's versions (whose shims refuse a
    version that is not selected)."""
    import glob
    import shutil

    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = [shutil.which(name), *sorted(glob.glob(f"{root}/versions/{name[6:]}.*/bin/{name}"))]
    for path in found:
        if path and subprocess.run([path, "-c", "pass"], capture_output=True,
                                   check=False).returncode == 0:
            return path
    pytest.skip(f"{name} is not installed")


def _frames_of(block: str) -> list[str]:
    """A thread's frame lines, innermost first."""
    return [ln.strip() for ln in block.splitlines()[1:] if ln.startswith("    ")]


@pytest.mark.parametrize("python", PYTHONS)
def test_dump_python_threads(python: str, tmp_path: Path) -> None:
    """dump --pid: the main thread in time.sleep and a thread waiting on a lock, each with
    its Python call path and line and, above it, the native frames it waits in: libc's
    clock_nanosleep for the sleep, a futex or semaphore wait of libc for the lock (both
    stacks of the same instant, merged); the compressing thread has zlib below its line.
    The threads are held only for the copy: the program exits normally."""
    exe = _python(python)
    spin = PySpinner(exe, tmp_path)
    try:
        time.sleep(0.3)
        proc = callpath("dump", "--pid", str(spin.proc.pid))
        assert proc.returncode == 0, proc.stderr
        status, text = spin.finish()
    finally:
        spin.kill()
    assert status == 0 and text.strip() == "done"
    out = proc.stdout
    blocks = out.split("\n\n")
    main = next(b for b in blocks if "(main)" in b)
    frames = _frames_of(main)
    sleep_at = frames.index(f"main ({PY_PROGRAM}:{_line_of('SLEEP_LINE')})")
    assert frames[sleep_at + 1].startswith("<module>"), out
    # the native part: the libc wait innermost, then the interpreter's time.sleep
    assert frames[0] == "clock_nanosleep (libc.so.6)", out
    assert any(f.startswith("time_sleep ") for f in frames[:sleep_at]), out
    lock = next(b for b in blocks if f"waiter ({PY_PROGRAM}:{_line_of('LOCK_LINE')})" in b)
    frames = _frames_of(lock)
    wait_at = frames.index(f"waiter ({PY_PROGRAM}:{_line_of('LOCK_LINE')})")
    assert frames[wait_at + 1].startswith("Thread.run"), out
    assert frames[0].endswith("(libc.so.6)") and ("futex" in frames[0] or "sem" in frames[0]), \
        out
    assert any("acquire" in f for f in frames[:wait_at]), out
    assert "_PyEval_EvalFrameDefault" not in out
    assert "Python 3." in blocks[0]


def _traced(pid: int) -> bool:
    """Whether every thread of ``pid`` has a tracer."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        if "TracerPid:\t0\n" in status:
            return False
    return True


def test_dump_of_a_program_under_a_debugger(tmp_path: Path) -> None:
    """A program that strace traces cannot be held: each thread says why it has no native
    frames, its Python frames are still read, and the program is unharmed."""
    import shutil

    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    spin = PySpinner(_python("python3.11"), tmp_path)
    tracer = subprocess.Popen(["strace", "-f", "-qq", "-o", "/dev/null", "-p",
                               str(spin.proc.pid)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not _traced(spin.proc.pid):
            assert time.monotonic() < deadline and tracer.poll() is None
            time.sleep(0.05)
        proc = callpath("dump", "--pid", str(spin.proc.pid))
    finally:
        tracer.terminate()
        tracer.wait()
    try:
        status, text = spin.finish()
    finally:
        spin.kill()
    assert proc.returncode == 0, proc.stderr
    assert status == 0 and text.strip() == "done"
    blocks = proc.stdout.split("\n\n")[1:]
    assert len(blocks) == 3, proc.stdout
    for b in blocks:
        assert "(no native frames: it is being traced by another process (a debugger))" in b, b
    main = next(b for b in blocks if "(main)" in b)
    assert f"main ({PY_PROGRAM}:{_line_of('SLEEP_LINE')})" in main, proc.stdout


def test_dump_python_only_without_holding(tmp_path: Path) -> None:
    """dump --pid --no-native: the Python frames alone (read without holding the threads)."""
    spin = PySpinner(_python("python3.11"), tmp_path)
    try:
        time.sleep(0.3)
        proc = callpath("dump", "--pid", str(spin.proc.pid), "--no-native")
        status, _ = spin.finish()
    finally:
        spin.kill()
    assert proc.returncode == 0 and status == 0, proc.stderr
    main = next(b for b in proc.stdout.split("\n\n") if "(main)" in b)
    assert _frames_of(main)[0] == f"main ({PY_PROGRAM}:{_line_of('SLEEP_LINE')})", main
    assert "libc.so.6" not in proc.stdout


@pytest.mark.parametrize("python", PYTHONS)
def test_attach_python_lines(python: str, tmp_path: Path) -> None:
    """run --pid on a Python program: Python call paths with lines (the zlib loop is the hot
    line of the compressing thread); the program keeps running and exits normally."""
    exe = _python(python)
    spin = PySpinner(exe, tmp_path)
    out = tmp_path / "m"
    try:
        proc = callpath("run", "--pid", str(spin.proc.pid), "--duration", "2", "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        assert "kept running" in proc.stderr, proc.stderr
        assert spin.proc.poll() is None
        status, text = spin.finish()
    finally:
        spin.kill()
    assert status == 0 and text.strip() == "done"
    m = measdir.read(out)
    assert m.header["status"] == "complete"
    (p,) = m.processes
    assert len(p.threads) == 3
    codes = p.pycode
    hot = (str(PY_PROGRAM), "compressor", _line_of("COMPRESS_LINE"))
    per_line: dict[tuple[str, str, int], int] = {}
    for t in p.threads:
        for leaf in range(len(t.nodes)):
            n = int(t.samples[leaf].sum())
            nd = t.nodes[leaf]
            if n and nd["kind"] == measdir.NodeKind.PYTHON:
                c = codes[int(nd["module"])]
                key = (c.file, c.function, int(nd["address"]))
                per_line[key] = per_line.get(key, 0) + n
    assert per_line.get(hot, 0) > 0, per_line
    assert any(k[1] == "waiter" and k[2] == _line_of("LOCK_LINE") for k in per_line), per_line


def test_ctrl_c_detaches_and_keeps_the_measurement(perf_ok: None, build,  # type: ignore[no-untyped-def]  # noqa: F811
                                                   tmp_path: Path) -> None:
    """SIGINT to callpath (Ctrl-C) ends the measurement, not the program: the directory is
    complete and the program exits normally later."""
    exe = build("attach_spin.c", "attach_spin")
    spin = Spinner(exe, tmp_path)
    out = tmp_path / "m"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
    try:
        prof = subprocess.Popen([sys.executable, "-m", "callpath", "run", "--pid",
                                 str(spin.proc.pid), "-o", str(out)],
                                env=env, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while not (out / "raw.perf").exists():
                assert prof.poll() is None, prof.communicate()[1]
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.5)
            prof.send_signal(signal.SIGINT)
            _, err = prof.communicate(timeout=120)
        finally:
            if prof.poll() is None:
                prof.kill()
                prof.wait()
        assert prof.returncode == 0, err
        assert "kept running" in err, err
        assert spin.proc.poll() is None
        status, text = spin.finish()
    finally:
        spin.kill()
    assert status == 0 and text.strip() == "done"
    m = measdir.read(out)
    assert m.header["status"] == "complete"
    assert _counts(out, "hot_loop")[0] > 0


def test_dump_native_program(build, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """dump --pid of a C program: its threads and states, and why there is no Python stack."""
    exe = build("attach_spin.c", "attach_spin")
    spin = Spinner(exe, tmp_path)
    try:
        proc = callpath("dump", "--pid", str(spin.proc.pid))
        status, _ = spin.finish()
    finally:
        spin.kill()
    assert proc.returncode == 0 and status == 0, proc.stderr
    assert f"Thread {spin.proc.pid} (main)" in proc.stdout
    assert "not a CPython process" in proc.stdout.splitlines()[0]
    # its native frames: the loop it was in (or the access() between loops), below main
    frames = _frames_of(proc.stdout.split("\n\n")[1])
    assert "main (attach_spin)" in frames, proc.stdout
    assert frames[0].split()[0] in ("hot_loop", "cold_loop", "access", "__GI___access"), \
        proc.stdout


def test_attach_older_python_falls_back_to_native(perf_ok: None, tmp_path: Path) -> None:  # noqa: F811
    """CPython 3.10 (frames not readable by this version): one line says so, and its native
    call paths are measured instead; the program is unharmed."""
    exe = _python("python3.10")
    spin = PySpinner(exe, tmp_path)
    out = tmp_path / "m"
    try:
        proc = callpath("run", "--pid", str(spin.proc.pid), "--duration", "1", "-o", str(out))
        status, text = spin.finish()
    finally:
        spin.kill()
    assert proc.returncode == 0, proc.stderr
    assert "Python 3.10; expected CPython 3.11, 3.12 or 3.13" in proc.stderr
    assert "measuring its native call paths instead" in proc.stderr
    assert status == 0 and text.strip() == "done"
    m = measdir.read(out)
    assert m.header["status"] == "complete" and m.processes
