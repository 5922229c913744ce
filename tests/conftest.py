"""Shared fixtures: the real databases in ``../shared/data`` (skipped with a reason if absent)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DATA = SHARED / "data"
DBASE = DATA / "hpctoolkit" / "dbase"
V4_DATABASES = ["small.d", "small.nostruct.d", "loops-cputime-t.d"]
CPI_DB = DATA / "hatchet" / "hpctoolkit-cpi-database"


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """callpath's caches (recovered and parsed structure) go to a directory of the test run,
    for the run and every program it starts, never to the user's ~/.cache."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))


def perf_reason() -> str | None:
    """Why perf_event sampling cannot run here (None when it can): the tests that measure
    real programs skip with it. Any failure of the probe (no perf_event at all, another
    architecture) is a missing capability."""
    try:
        from callpath.measure import perf_events as events
        from callpath.measure import perf_launch as launch
        (_, reason), = launch.probe_events([events.parse_event("cpu-clock")])
    except Exception as e:
        return str(e)
    return reason


def shared_path(*parts: str) -> Path:
    p = DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} is absent: the shared test data must sit beside the repository")
    return p


@pytest.fixture(params=V4_DATABASES)
def v4_db(request: pytest.FixtureRequest) -> Path:
    return shared_path("hpctoolkit", "dbase", request.param)


_CONFIG_HOME = tempfile.mkdtemp(prefix="callpath-test-config-")


def run_cli(*args: str, check: bool = False, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """Run the real ``callpath`` command in a subprocess, as a user would. The user's saved
    filters would change reports, so the configuration directory is a fresh one unless
    ``env`` names another."""
    extra = env or {}
    env = dict(os.environ)
    env["XDG_CONFIG_HOME"] = _CONFIG_HOME
    env.update(extra)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "callpath", *args], capture_output=True,
                          text=True, env=env, timeout=120, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"callpath {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def interruptible() -> None:
    """``preexec_fn`` for a measured command that a test interrupts: restore SIGINT and
    SIGQUIT to their defaults. A shell that starts a job in the background (``cmd &``, as some
    CI runners do) hands it SIGINT ignored, and an ignored signal stays ignored across exec,
    so Ctrl-C would never reach the program."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def kill_group(proc: subprocess.Popen[str]) -> None:
    """Make sure a test's command and everything it started are gone (a failed assertion must
    not leave a spinning program behind)."""
    import signal

    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)



# The tests CI runs on every interpreter of its matrix (`make core`, `pytest -m core`): measurement,
# structure, attribution and the database formats, by the file that holds them. The whole suite
# (viewer, browser, comparisons, exports ...) runs on the newest interpreter.
CORE_PREFIXES = ("test_run_", "test_struct_", "test_prof_", "test_v4_", "test_xml_experiment",
                 "test_python_", "test_measdir", "test_loadmap", "test_forked_chunks",
                 "test_hpcstruct_cache", "test_thread_names", "test_report_cli",
                 # GPU attribution, and the CUPTI library's reading of CPython's frame records
                 "test_gpu_")
# (the field matrix of C programs and Hatchet's reading of our databases, which do not depend on
# the interpreter that runs callpath, run once, in the whole suite)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name.startswith(CORE_PREFIXES):
            item.add_marker(pytest.mark.core)
