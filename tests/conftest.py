"""Shared fixtures: the real databases in ``../shared/data`` (skipped with a reason if absent)."""

from __future__ import annotations

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
