"""Which ``mpirun`` the MPI tests use.

The ``mpi`` extra (``pip install 'callpath[mpi]'``, done by ``make test``) brings mpi4py and
MPICH from PyPI, whose ``mpirun`` lands beside the interpreter; mpi4py then loads that MPICH.
A launcher of another MPI (Debian's Open MPI on PATH) would start ranks that cannot see each
other (each a world of one), so the one beside the interpreter comes first."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def mpirun() -> str | None:
    """The launcher to use: the environment's own (the ``mpi`` extra), else PATH's."""
    own = Path(sys.executable).parent / "mpirun"
    return str(own) if own.exists() else shutil.which("mpirun")


def is_open_mpi(launcher: str) -> bool:
    """Whether ``launcher`` is Open MPI's (which refuses root without a flag of its own)."""
    try:
        out = subprocess.run([launcher, "--version"], capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in out.stdout + out.stderr
