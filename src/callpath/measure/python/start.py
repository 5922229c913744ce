"""Start a Python program under the sampler: the library entry point behind ``callpath run``.

The program runs as a child process with ``shim/`` first on ``PYTHONPATH`` and the measurement
settings in ``CALLPATH_PY_*`` variables, so the interpreter's own ``site`` start-up loads the
sampler before the first line of user code, with no change to the program and with the
program's own ``sys.argv``, ``__main__`` and exit path. Every Python process it starts inherits
the environment and is measured too; forks without exec are followed by the sampler itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TextIO

from callpath.errors import CallpathError
from callpath.formats import measdir_header as header
from callpath.measure.python import measfile
from callpath.measure.python import sampler as S

SHIM_DIR = Path(__file__).resolve().parent / "shim"
MAX_FREQUENCY = 10_000.0
PR_SET_CHILD_SUBREAPER = 36
ENV_NATIVE = "CALLPATH_PY_NATIVE"  # native_capture.ENV_NATIVE (that module is loaded by path)
DEFAULT_NATIVE_STACK = 60000  # native_capture.DEFAULT_STACK
_INTERPRETER = re.compile(r"^python(\d+(\.\d+)*)?([dmu]*)?(\.exe)?$")
# Interpreter options that keep site from running our bootstrap: -S skips site, -I and -E
# ignore PYTHONPATH.
_BLOCKING_FLAGS = {"S": "-S skips the site module", "I": "-I ignores PYTHONPATH",
                   "E": "-E ignores PYTHONPATH"}


def _shebang(path: str) -> str:
    """The first line of a file if it is a ``#!`` line, else ''."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return ""
    if not head.startswith(b"#!"):
        return ""
    return head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").strip()


def _is_interpreter(word: str) -> bool:
    if _INTERPRETER.match(os.path.basename(word)):
        return True
    try:
        return os.path.realpath(word) == os.path.realpath(sys.executable) and os.path.isfile(word)
    except OSError:
        return False


def is_python_target(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs Python: an interpreter (``python``, ``python3.11``, a path to one),
    a ``*.py`` script, or a script whose ``#!`` line names a Python interpreter."""
    if not argv:
        return False
    first = argv[0]
    if _is_interpreter(first) or first.endswith(".py"):
        return True
    path = first if os.sep in first else (shutil.which(first) or "")
    line = _shebang(path) if path else ""
    if not line:
        return False
    words = line.split()
    if os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    return bool(words) and _is_interpreter(words[0])


def mpi_python_target(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is an MPI launcher starting a Python program (``mpirun -n 2 python
    app.py``): the launcher passes our environment to every rank, so each rank measures
    itself into the one directory."""
    if not argv or os.path.basename(argv[0]) not in header.MPI_LAUNCHERS:
        return False
    return any(not w.startswith("-") and is_python_target(argv[i:])
               for i, w in enumerate(argv[1:], 1))


def _interpreter_flags(argv: Sequence[str]) -> list[str]:
    """Single-letter options given to the interpreter before the script, ``-c`` or ``-m``."""
    flags: list[str] = []
    for word in argv[1:]:
        if not word.startswith("-") or word in ("-", "--"):
            break
        if word.startswith("--"):
            continue
        for ch in word[1:]:
            if ch in "cm":
                return flags
            if ch in "WX":  # these take an argument (joined or next word)
                break
            flags.append(ch)
    return flags


def command_line(argv: Sequence[str], *, module: bool) -> list[str]:
    """The command that runs the target: interpreters as given, scripts through an interpreter."""
    if not argv:
        raise CallpathError("no program to measure: give a Python script, -m MODULE, or a "
                            "python command line")
    if module:
        return [sys.executable, "-m", *argv]
    if mpi_python_target(argv):
        return list(argv)
    first = argv[0]
    if _is_interpreter(first):
        if os.sep not in first and shutil.which(first) is None:
            raise CallpathError(f"{first}: command not found (expected a Python interpreter "
                                "on PATH)")
        for flag in _interpreter_flags(argv):
            if flag in _BLOCKING_FLAGS:
                raise CallpathError(f"cannot measure '{' '.join(argv[:3])}': "
                                    f"{_BLOCKING_FLAGS[flag]}, which the sampler's bootstrap "
                                    "needs")
        return list(argv)
    path = first if (os.sep in first or os.path.exists(first)) else shutil.which(first)
    if path is None or not os.path.isfile(path):
        raise CallpathError(f"{first}: no such Python script (expected a file or a command on "
                            "PATH)")
    if _shebang(path) and os.access(path, os.X_OK) and is_python_target([path]):
        return [path, *argv[1:]]
    return [sys.executable, path, *argv[1:]]


def measurement_env(out_dir: Path, frequency: float, trace: bool,
                    base: dict[str, str] | None = None, native_stack: int = 0) -> dict[str, str]:
    """The environment that makes every Python process below the launcher measure itself
    (``native_stack``: bytes of native stack per sample under ``--native``, 0 without)."""
    env = dict(os.environ if base is None else base)
    if native_stack:
        env[ENV_NATIVE] = str(native_stack)
    else:
        env.pop(ENV_NATIVE, None)
    env[S.ENV_OUT] = str(Path(out_dir).resolve())
    env[S.ENV_FREQ] = repr(float(frequency))
    env[S.ENV_TRACE] = "1" if trace else "0"
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(SHIM_DIR) + (os.pathsep + old if old else "")
    return env


def _check(out_dir: Path, frequency: float) -> None:
    if not (0 < frequency <= MAX_FREQUENCY):
        raise CallpathError(f"sampling frequency {frequency:g} Hz is out of range (expected "
                            f"more than 0 and at most {MAX_FREQUENCY:g} Hz)")
    header.check_new_directory(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CallpathError(f"{out_dir}: cannot create the measurement directory: "
                            f"{e.strerror}") from None


def run_python(argv: Sequence[str], *, module: bool, out_dir: Path, frequency: float = 1000.0,
               trace: bool = False, summary: bool = True, env: dict[str, str] | None = None,
               summary_file: TextIO | None = None, linger: float = 5.0,
               native: bool = False, native_stack: int = DEFAULT_NATIVE_STACK,
               keep_interpreter: bool = False, structure_ahead: bool = False,
               native_top: int = 5) -> int:
    """Run a Python program measured into ``out_dir``; return the program's exit status.

    ``argv`` is a command line (``["python3", "app.py", "x"]``), a script and its arguments
    (``["app.py", "x"]``), or with ``module=True`` a module name and its arguments. A program
    killed by a signal returns ``128 + signal``, as a shell reports it. With ``summary`` the
    quick summary goes to ``summary_file`` (standard error by default). Descendants that
    outlive the program (a pool's workers being torn down, multiprocessing's resource tracker)
    are waited for up to ``linger`` seconds, so that their files are complete when read.
    With ``native``, every sample also carries the native stack of the same instant, and the
    paths are merged after the run (``callpath run --native``; ``merge.py``), the
    interpreter's own frames between two Python frames elided unless ``keep_interpreter``;
    with ``structure_ahead`` (``callpath profile``, which reads the structure next) the
    sampled Python sources' and native procedures' structure is built into the caches by
    child processes meanwhile (:mod:`~callpath.measure.python.structure_ahead`).
    """
    out_dir = Path(out_dir)
    cmd = command_line(argv, module=module)
    _check(out_dir, frequency)
    child_env = measurement_env(out_dir, frequency, trace, env,
                                native_stack if native else 0)
    metrics = [header.MetricInfo.from_json(d) for d in measfile.metric_descriptors(frequency)]
    fields = {"command": list(cmd), "producer": "python", "frequency": frequency,
              "trace": trace, "start_time": time.time()}
    if native:
        fields["native"] = True
    header.write_header(out_dir, metrics, status="running", **fields)
    _become_subreaper()
    started = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, env=child_env)
    except OSError as e:
        raise CallpathError(f"{cmd[0]}: cannot start the program: {e.strerror}") from None
    # the measurement's reader (numpy) while the program runs, not before it starts
    from callpath.formats import measdir  # noqa: F401
    rc = _wait(proc, linger)
    # when the program (and what it left running) ended: profile counts what follows from it
    fields["program_end_time"] = time.time()
    status = 128 - rc if rc < 0 else rc
    exit_status = rc  # the format's convention: negative for a fatal signal
    notes: list[str] = []
    if native:
        from callpath.measure.python.native_summary import finish_native
        merge_started = time.monotonic()
        ahead = None
        if structure_ahead:
            from callpath.measure.python.structure_ahead import Ahead, spare_core
            if spare_core():
                ahead = Ahead(out_dir)
                ahead.python_sources()
        try:
            notes = finish_native(out_dir, native_top, keep_interpreter=keep_interpreter,
                                  on_frames=ahead.native_frames if ahead else None)
        finally:
            # after the program, before the database: what ``callpath profile`` reports as
            # the merge phase, and the wait for the structure children beyond it as structure
            merged = time.monotonic()
            fields["native_merge_s"] = round(merged - merge_started, 3)
            if ahead is not None:
                ahead.stop()
                fields["structure_ahead_s"] = round(time.monotonic() - merged, 3)
    try:
        header.write_header(out_dir, metrics, status="complete", exit_status=exit_status,
                            end_time=time.time(), summary=_header_summary(out_dir), **fields)
        if summary:
            from callpath.measure.python.quick_summary import print_summary
            print_summary(out_dir, status, file=summary_file or sys.stderr,
                          wall_s=time.monotonic() - started)
        for line in notes:
            (summary_file or sys.stderr).write(line + "\n")
    except CallpathError as e:
        # the program ran: its exit status matters more than our summary of its data
        sys.stderr.write(f"callpath: warning: {e}\n")
    return status


def _header_summary(out_dir: Path) -> dict[str, object]:
    """Per-context sample counts for measurement.json (the format's ``summary`` key)."""
    from callpath.formats import measdir

    contexts = []
    samples = 0
    for proc in measdir.read(out_dir).processes:
        for t in proc.threads:
            n = int(t.stats.get("samples", 0))
            samples += n
            contexts.append({"pid": proc.pid, "thread": t.slot, "samples": n,
                             "idle_samples": int(t.stats.get("idle_samples", 0)),
                             "complete": proc.complete})
    return {"samples": samples, "processes": len({c["pid"] for c in contexts}),
            "contexts": contexts}


def _become_subreaper() -> None:
    """Make orphaned descendants our children (Linux prctl), so that we can wait for them."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _reap_descendants(linger: float) -> None:
    """Wait (at most ``linger`` s) for every remaining descendant, which as subreaper we
    inherit when their parents exit."""
    deadline = time.monotonic() + linger
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)


def _wait(proc: subprocess.Popen[bytes], linger: float) -> int:
    """Wait for the program, passing on termination signals; Ctrl-C reaches it through the
    terminal's process group, so the launcher only outlives it to collect the data. Returns
    its return code (negative: the signal that killed it)."""
    forwarded = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

    def forward(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            proc.send_signal(signum)

    old = {}
    try:
        old[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
        for s in forwarded:
            old[s] = signal.signal(s, forward)
    except ValueError:  # not the main thread: leave signals alone
        pass
    try:
        rc = proc.wait()
        _reap_descendants(linger)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    return rc
