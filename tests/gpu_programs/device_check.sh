#!/usr/bin/env bash
# The GPU machine's check of `callpath run -e gpu=nvidia` (one device call; see docs/gpu.md):
# installs callpath from .gpu/ (source + wheels carried there), measures the CUDA C program and
# the PyTorch training loop with -e gpu=nvidia -t, attributes both, checks where the kernels sit
# and the GKER total against torch.profiler, runs the overhead bench, and leaves in $OUT a
# summary, the reports, the databases and the training loop's measurement (a test fixture).
set -x
export PYTHONUNBUFFERED=1
G=$PWD/.gpu
W=/tmp/w
mkdir -p "$W"
T0=$(date +%s)
t() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi -L
python3 -c "import sys, torch, numpy; print(sys.version, torch.__version__, numpy.__version__)"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$G"/whl/*.whl
export PYTHONPATH=/tmp/site:$G/src/src
(cd "$G/src" && python3 setup.py -q build_ext --inplace) > "$OUT/build.log" 2>&1 || t "C extensions not built"
python3 -c "import callpath.measure.gpu.library as l; print(l.find_cupti()); print('unavailable:', l.unavailable())"
python3 -m callpath run --list-events | tail -2
t "nvcc"
nvcc -O2 -g -lineinfo -o "$W/streams" "$G/src/tests/gpu_programs/streams.cu"
t "cuda run"
timeout 120 python3 -m callpath run -e gpu=nvidia -t -o "$W/m-cu" -- "$W/streams"
timeout 120 python3 -m callpath prof "$W/m-cu" -o "$W/db-cu"
python3 -m callpath report "$W/db-cu" -m 'GKER (sec)' -d 40 > "$OUT/cu-report.txt" 2>&1
python3 -m callpath report "$W/db-cu" --contexts >> "$OUT/cu-report.txt" 2>&1
python3 "$G/src/tests/gpu_programs/check_gpu_db.py" cuda "$W/db-cu" > "$W/cu-check.json"
t "torch.profiler reference"
timeout 120 python3 "$G/src/tests/gpu_programs/train.py" --torch-profiler "$W/ref.json"
t "torch run"
timeout 150 python3 -m callpath run -e gpu=nvidia -t -o "$W/m-py" -- python3 "$G/src/tests/gpu_programs/train.py"
ls -la "$W/m-py"
t "torch prof"
timeout 200 python3 -m callpath prof "$W/m-py" -o "$W/db-py"
python3 -m callpath report "$W/db-py" -m 'GKER (sec)' -d 60 -t 5 > "$OUT/py-report.txt" 2>&1
python3 -m callpath report "$W/db-py" --contexts >> "$OUT/py-report.txt" 2>&1
python3 "$G/src/tests/gpu_programs/check_gpu_db.py" torch "$W/db-py" "$W/m-py" "$W/ref.json" > "$W/py-check.json"
t "bench"
timeout 150 python3 "$G/src/bench/gpu_overhead.py" --repeat 2 --json "$W/bench.json"
t "pack"
python3 - "$W" "$OUT/summary.json" <<'PY'
import json, sys, pathlib
w = pathlib.Path(sys.argv[1]); out = {}
for k in ("cu-check", "py-check", "bench", "ref"):
    p = w / f"{k}.json"
    out[k] = json.loads(p.read_text()) if p.exists() else None
pathlib.Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
PY
(cd "$W" && tar czf "$OUT/fixture.tar.gz" --exclude='*.raw' m-py/measurement.json m-py/gpu-*.cpm m-cu)
(cd "$W" && tar czf "$OUT/dbs.tar.gz" db-cu db-py)
ls -la "$OUT"
t "done"
