"""N runs in a row of a small PyTorch CPU training loop under ``callpath run --native`` (1 kHz,
the merge included), counting the runs that did not end well: a non-zero exit status or the
program's last line missing (a crash of the measured program shows as both). The issue 26
check: 20 in a row on each interpreter the capture supports.

PYTHON is an interpreter with torch and callpath installed (``python3.12 -m venv E &&
E/bin/pip install torch && E/bin/pip install -e .``); callpath runs under it, so its capture
is the one built for that version.

    .venv/bin/python bench/torch_native_runs.py E/bin/python [--runs 20] [--seconds 1.5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_profile import TRAIN  # the same loop as the profile bench


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("python", help="an interpreter with torch and callpath installed")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=1.5, help="training time per run")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-torch-runs-"))
    try:
        script = tmp / "train.py"
        script.write_text(TRAIN)
        bad = 0
        for i in range(1, args.runs + 1):
            out = tmp / "m"
            shutil.rmtree(out, ignore_errors=True)
            r = subprocess.run([args.python, "-m", "callpath", "run", "--native", "-o", str(out),
                                "--", args.python, str(script), str(args.seconds)],
                               capture_output=True, text=True, check=False)
            ok = r.returncode == 0 and any(ln.startswith("steps ")
                                           for ln in r.stdout.splitlines())
            bad += not ok
            merged = next((ln.strip() for ln in (r.stdout + r.stderr).splitlines()
                           if "samples merged" in ln), "")
            print(f"run {i}: exit {r.returncode}, {'ok' if ok else 'FAILED'}; {merged}; "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)
            if not ok:
                sys.stdout.write(r.stderr[-2000:])
        print(f"{args.runs - bad} of {args.runs} runs ended well, {bad} failed")
        return 1 if bad else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
