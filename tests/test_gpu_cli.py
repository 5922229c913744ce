"""``callpath run -e gpu=nvidia``: the one-line refusal where it cannot measure, the
``--list-events`` line; and, on a machine with an NVIDIA GPU, CUPTI and nvcc / PyTorch, the
live measurement of the CUDA C program and the training loop (skipped elsewhere, with the
reason)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from callpath.measure.gpu import library
from conftest import ROOT, run_cli

PROGRAMS = ROOT / "tests" / "gpu_programs"


def test_unknown_gpu_kind_is_one_line() -> None:
    res = run_cli("run", "-e", "gpu=amd", "--", "true")
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "callpath: error: event 'gpu=amd': unknown GPU kind 'amd' (expected gpu=nvidia)"]


def test_without_gpu_it_says_what_is_missing(tmp_path: Path) -> None:
    why = library.unavailable()
    if why is None:
        pytest.skip("this machine can measure NVIDIA GPUs")
    out = tmp_path / "m"
    for cmd in (["run", "-e", "gpu=nvidia", "-o", str(out), "--", "true"],
                ["profile", "-e", "gpu=nvidia", "--", sys.executable, "-c", "pass"]):
        res = run_cli(*cmd)
        assert res.returncode == 2
        assert res.stderr.strip().splitlines() == [f"callpath: error: -e gpu=nvidia: {why}"]
    assert not out.exists()  # nothing ran, nothing written
    listed = [line for line in run_cli("run", "--list-events").stdout.splitlines()
              if line.startswith("gpu=nvidia")]
    assert listed == [f"{'gpu=nvidia':26} {'gpu':9} unavailable: {why}"]


def _live() -> None:
    why = library.unavailable()
    if why:
        pytest.skip(f"-e gpu=nvidia cannot measure here: {why}")


def test_live_cuda_program(tmp_path: Path) -> None:
    _live()
    if shutil.which("nvcc") is None:
        pytest.skip("no nvcc to build the CUDA C program")
    exe = tmp_path / "streams"
    subprocess.run(["nvcc", "-O2", "-g", "-o", str(exe), str(PROGRAMS / "streams.cu")],
                   check=True)
    run_cli("run", "-e", "gpu=nvidia", "-t", "-o", str(tmp_path / "m"), "--", str(exe),
            check=True)
    run_cli("prof", str(tmp_path / "m"), "-o", str(tmp_path / "db"), check=True)
    res = subprocess.run([sys.executable, str(PROGRAMS / "check_gpu_db.py"), "cuda",
                          str(tmp_path / "db")], capture_output=True, text=True, check=False)
    assert json.loads(res.stdout)["ok"], res.stdout


def test_live_training_loop(tmp_path: Path) -> None:
    _live()
    pytest.importorskip("torch", reason="PyTorch is not installed")
    train = str(PROGRAMS / "train.py")
    subprocess.run([sys.executable, train, "--torch-profiler", str(tmp_path / "ref.json")],
                   check=True)
    run_cli("run", "-e", "gpu=nvidia", "-t", "-o", str(tmp_path / "m"), "--", sys.executable,
            train, check=True)
    run_cli("prof", str(tmp_path / "m"), "-o", str(tmp_path / "db"), check=True)
    res = subprocess.run([sys.executable, str(PROGRAMS / "check_gpu_db.py"), "torch",
                          str(tmp_path / "db"), str(tmp_path / "m"),
                          str(tmp_path / "ref.json")], capture_output=True, text=True,
                         check=False)
    assert json.loads(res.stdout)["ok"], res.stdout
