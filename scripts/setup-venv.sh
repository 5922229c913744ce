#!/usr/bin/env bash
# Create .venv with callpath installed in editable mode plus the development tools.
# Works on a machine with only python3 (3.11+), pip, gcc and make: when the standard `venv`
# module lacks ensurepip (Debian without python3-venv), it falls back to `virtualenv` from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "callpath needs Python 3.11 or newer; $PY is $("$PY" -V 2>&1)" >&2; exit 2; }
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv .venv 2>/dev/null; then
    rm -rf .venv
    "$PY" -m pip install --quiet --user virtualenv || "$PY" -m pip install --quiet virtualenv
    "$PY" -m virtualenv --quiet .venv
  fi
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
# the mpi extra (mpi4py and MPICH from PyPI) lets the `mpirun -n 2` tests run; where no wheel
# fits this machine they skip with the reason instead of failing the setup
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[mpi]' ||
  echo "setup: the mpi extra (mpi4py, mpich) could not be installed; the MPI tests will skip" >&2
touch .venv/.installed
