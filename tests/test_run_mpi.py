"""``mpirun -n 2`` under ``callpath run``: two MPI ranks in one measurement directory.

Needs an MPI launcher (MPICH's from the ``mpi`` extra, which ``make test`` installs, or any on
PATH); skipped with the reason when there is none or perf_event sampling is unavailable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mpi_launch
from callpath.formats import measdir
from callpath.measure import perf_events as events
from callpath.measure import perf_launch as launch
from callpath.model.contexts import IdKind

ROOT = Path(__file__).resolve().parents[1]


def test_mpirun_two_ranks(tmp_path: Path) -> None:
    mpirun = mpi_launch.mpirun()
    if mpirun is None:
        pytest.skip("no mpirun (pip install 'callpath[mpi]' brings MPICH's)")
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    (_, reason), = launch.probe_events([events.parse_event("cpu-clock")])
    if reason is not None:
        pytest.skip(f"perf_event sampling is not available here: {reason}")
    exe = tmp_path / "misbehave"
    subprocess.run(["gcc", "-O2", "-g", "-pthread", "-o", str(exe),
                    str(ROOT / "tests" / "programs" / "misbehave.c")], check=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    # OpenMPI refuses root unless told; harmless for other MPIs and users
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1",
               PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe")
    out = tmp_path / "m"
    cmd = [mpirun, "-n", "2"]
    if os.geteuid() == 0 and mpi_launch.is_open_mpi(mpirun):
        cmd.append("--allow-run-as-root")
    proc = subprocess.run([sys.executable, "-m", "callpath", "run", "-o", str(out), "--", *cmd,
                           str(exe), "ok", "200"], capture_output=True, text=True, env=env,
                          timeout=180, check=False)
    if proc.returncode != 0 and "not enough slots" in proc.stdout + proc.stderr:
        pytest.skip("mpirun refuses 2 processes on this machine")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = measdir.read(out)
    ranks: dict[int, int] = {}
    for p, t in m.threads:
        rank_ids = [i.logical_id for i in t.ids if i.kind == IdKind.RANK]
        if p.info.get("exe") == str(exe) and rank_ids:
            assert rank_ids == [p.info["rank"]]
            ranks[rank_ids[0]] = ranks.get(rank_ids[0], 0) + int(t.samples.sum())
    assert sorted(ranks) == [0, 1], [(p.pid, p.info) for p in m.processes]
    assert all(n >= 100 for n in ranks.values()), ranks  # 200 ms of CPU each at 1 kHz
