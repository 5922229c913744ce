#!/usr/bin/env bash
# The GPU machine's check of `callpath run -e gpu=nvidia` (one device call; see docs/gpu.md):
# installs callpath from .gpu/ (source + wheels carried there), measures the CUDA C program and
# the PyTorch training loop with -e gpu=nvidia -t, attributes both, checks where the kernels sit
# and the GKER total against torch.profiler, runs the overhead bench, and leaves in $OUT a
# summary, the reports, the databases and the measurements (test fixtures). Every step gets
# what is left of a BUDGET (seconds) so that the packing at the end always runs.
export PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-330}
G=$PWD/.gpu
W=/tmp/w
SRC=$G/src
mkdir -p "$W"
T0=$(date +%s)
t() { echo "=== [t+$(( $(date +%s) - T0 ))s] $*"; }
left() { local l=$(( BUDGET - ($(date +%s) - T0) - ${2:-0} )); (( l > $1 )) && l=$1; (( l < 5 )) && l=5; echo $l; }
nvidia-smi -L
python3 -c "import sys, torch, numpy; print(sys.version, torch.__version__, numpy.__version__)"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$G"/whl/*.whl
export PYTHONPATH=/tmp/site:$SRC/src
(cd "$SRC" && python3 setup.py -q build_ext --inplace) > "$OUT/build.log" 2>&1 || t "C extensions not built"
python3 -c "import callpath.measure.gpu.library as l; print(l.find_cupti()); print('unavailable:', l.unavailable())"
python3 -m callpath run --list-events | tail -2
t "nvcc"
nvcc -O2 -g -lineinfo -o "$W/streams" "$SRC/tests/gpu_programs/streams.cu"
t "cuda run"
timeout "$(left 45 240)" python3 -m callpath run -e gpu=nvidia -t -o "$W/m-cu" -- "$W/streams"
ls -la "$W/m-cu"
t "gpu binaries saved (count, KiB) and their structure (nvcc -lineinfo: kernels' lines)"
ls "$W/m-cu/gpubins" | wc -l; du -sk "$W/m-cu/gpubins"
timeout "$(left 30 230)" python3 -m callpath struct "$W/m-cu" -v 2>&1 | tail -4
timeout "$(left 45 220)" python3 -m callpath prof "$W/m-cu" -o "$W/db-cu"
python3 -m callpath report "$W/db-cu" -m 'GKER (sec)' -d 40 > "$OUT/cu-report.txt" 2>&1
python3 -m callpath report "$W/db-cu" --contexts >> "$OUT/cu-report.txt" 2>&1
python3 "$SRC/tests/gpu_programs/check_gpu_db.py" cuda "$W/db-cu" > "$W/cu-check.json"
cat "$W/cu-check.json"
t "torch.profiler reference"
timeout "$(left 60 180)" python3 "$SRC/tests/gpu_programs/train.py" --torch-profiler "$W/ref.json"
t "torch run"
timeout "$(left 90 120)" python3 -m callpath run -e gpu=nvidia -t -o "$W/m-py" -- python3 "$SRC/tests/gpu_programs/train.py"
ls -la "$W/m-py"
ls "$W/m-py/gpubins" | wc -l; du -sk "$W/m-py/gpubins"
t "torch prof (no symbols: fast)"
timeout "$(left 60 90)" python3 -m callpath prof --ignore-structs "$W/m-py" -o "$W/db-py-fast"
python3 "$SRC/tests/gpu_programs/check_gpu_db.py" torch "$W/db-py-fast" "$W/m-py" "$W/ref.json" > "$W/py-check-fast.json"
cat "$W/py-check-fast.json"
t "bench"
timeout "$(left 170 75)" python3 "$SRC/bench/gpu_overhead.py" --repeat 3 --steps 200 --json "$W/bench.json"
t "torch.profiler inside a measured program (a second CUPTI subscriber)"
timeout "$(left 40 60)" python3 -m callpath run -e gpu=nvidia -o "$W/m-both" --top 0 -- python3 "$SRC/tests/gpu_programs/train.py" --steps 5 --torch-profiler "$W/both.json" 2>&1 | grep -iv "^\s*$" | tail -12
cat "$W/both.json"
t "torch prof (symbols)"
timeout "$(left 150 12)" python3 -m callpath prof "$W/m-py" -o "$W/db-py"
if [ -d "$W/db-py" ]; then
  python3 -m callpath report "$W/db-py" -m 'GKER (sec)' -d 70 -t 5 > "$OUT/py-report.txt" 2>&1
  python3 "$SRC/tests/gpu_programs/check_gpu_db.py" torch "$W/db-py" "$W/m-py" "$W/ref.json" > "$W/py-check.json"
  cat "$W/py-check.json"
else
  python3 -m callpath report "$W/db-py-fast" -m 'GKER (sec)' -d 40 -t 5 > "$OUT/py-report.txt" 2>&1
fi
python3 -m callpath report "$W/db-py-fast" --contexts >> "$OUT/py-report.txt" 2>&1
t "torch run --native (launch paths through Python and native code)"
timeout "$(left 60 90)" python3 -m callpath run --native -e gpu=nvidia -o "$W/m-nat" --top 0 -- python3 "$SRC/tests/gpu_programs/train.py" --steps 20 2>&1 | tail -6
timeout "$(left 45 60)" python3 -m callpath prof "$W/m-nat" -o "$W/db-nat" && \
  python3 -m callpath report "$W/db-nat" -m 'GKER (sec)' -d 90 -t 5 > "$OUT/native-report.txt" 2>&1
t "pack"
python3 - "$W" "$OUT/summary.json" <<'PY'
import json, sys, pathlib
w = pathlib.Path(sys.argv[1]); out = {}
for k in ("cu-check", "py-check", "py-check-fast", "bench", "ref"):
    p = w / f"{k}.json"
    try:
        out[k] = json.loads(p.read_text()) if p.exists() else None
    except ValueError as e:
        out[k] = f"unreadable: {e}: {p.read_text()[:500]}"
pathlib.Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
PY
(cd "$W" && tar czf "$OUT/fixture.tar.gz" m-py/measurement.json m-py/gpu-*.cpm m-py/process-*.cpm m-cu)
[ -d "$W/m-nat" ] && (cd "$W" && tar czf "$OUT/native-fixture.tar.gz" m-nat/measurement.json m-nat/gpu-*.cpm m-nat/process-*.cpm)
(cd "$W" && tar czf "$OUT/db-cu.tar.gz" db-cu)
ls -la "$OUT"
t "done"
