#!/usr/bin/env bash
# Create the virtual environment ($VENV, default .venv) with callpath installed in editable mode
# plus the development tools, for the interpreter $PYTHON (default python3). Works on a machine
# with only python3 (3.11+), pip, gcc and make: when the standard `venv` module lacks ensurepip
# (Debian without python3-venv), it falls back to `virtualenv` from PyPI.
# PYTHON may name a version's command (python3.13) that is not on PATH as such (pyenv installs it
# without selecting it): scripts/find-python.sh finds it. An existing environment made with
# another interpreter version is replaced, so `PYTHON=python3.13 make test` after `make test`
# tests 3.13. CONSTRAINTS=FILE installs under pip constraints (CI's run with the oldest
# versions the package declares: ci/oldest-deps.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
if ! "$PY" -c 'import sys' 2>/dev/null; then
  case "$PY" in
    python3.[0-9]*) found=$(bash scripts/find-python.sh "${PY#python}") && PY=$found ;;
  esac
fi
"$PY" -c 'import sys' 2>/dev/null || { echo "setup: no interpreter '$PY' found" >&2; exit 2; }
"$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "callpath needs Python 3.11 or newer; $PY is $("$PY" -V 2>&1)" >&2; exit 2; }
"$PY" -c 'import sys, sysconfig; sys.exit(bool(sysconfig.get_config_var("Py_GIL_DISABLED")))' || {
  echo "callpath does not support free-threaded Python builds yet; $PY is one (use a build with the GIL)" >&2
  exit 2; }
want=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ -x "$VENV/bin/python" ]; then
  have=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
  if [ "$have" != "$want" ]; then
    echo "setup: $VENV holds Python ${have:-?}, replacing it with Python $want ($PY)" >&2
    rm -rf "$VENV"
  fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PY" -m venv "$VENV" 2>/dev/null; then
    rm -rf "$VENV"
    "$PY" -m pip install --quiet --user virtualenv || "$PY" -m pip install --quiet virtualenv
    "$PY" -m virtualenv --quiet "$VENV"
  fi
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check ${CONSTRAINTS:+-c "$CONSTRAINTS"} -e '.[dev]'
# the mpi extra (mpi4py and MPICH from PyPI) lets the `mpirun -n 2` tests run; where no wheel
# fits this machine they skip with the reason instead of failing the setup
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check ${CONSTRAINTS:+-c "$CONSTRAINTS"} -e '.[mpi]' ||
  echo "setup: the mpi extra (mpi4py, mpich) could not be installed; the MPI tests will skip" >&2
# the notebook extra (IPython, a kernel, nbclient) lets the %%callpath test run; without it
# that test skips with the reason
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check ${CONSTRAINTS:+-c "$CONSTRAINTS"} -e '.[notebook]' ||
  echo "setup: the notebook extra (ipython, ipykernel, nbclient) could not be installed; the notebook test will skip" >&2
rm -f "$VENV"/.installed*
touch "$VENV/.installed-${STAMP_TAG:-python3}"
echo "setup: $VENV: $("$VENV/bin/python" -V) ($PY)"
