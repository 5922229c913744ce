#!/usr/bin/env bash
# Print the path of a CPython interpreter of version X.Y (the first argument), or nothing and
# exit 1 when none is found. Looks where such interpreters live on the machines we run on:
# `pythonX.Y` on PATH (when it answers: a pyenv shim for a version that is installed but not
# selected fails), pyenv's versions, /usr/local/bin and /usr/bin. Free-threaded builds (3.13t)
# are not taken: callpath's C extensions and the sampler need the GIL.
set -uo pipefail
want=${1:?usage: find-python.sh X.Y}
check() {
  [ -x "$1" ] || return 1
  "$1" -c "import sys, sysconfig; sys.exit(not ('%d.%d' % sys.version_info[:2] == '$want'
    and not sysconfig.get_config_var('Py_GIL_DISABLED')))" 2>/dev/null || return 1
  echo "$1"
  exit 0
}
check "$(command -v "python$want" 2>/dev/null)"
root=${PYENV_ROOT:-$HOME/.pyenv}
for p in $(ls -d "$root"/versions/"$want".*/bin/python"$want" 2>/dev/null | sort -V -r); do
  check "$p"
done
check "/usr/local/bin/python$want"
check "/usr/bin/python$want"
exit 1
