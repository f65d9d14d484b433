# Sourced by the scripts in this folder: a Python 3.11+ virtualenv in .venv with
# the given requirements file installed. Works on a fresh machine with only Python.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pick_python() {
  for candidate in python3.11 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 &&
       "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      echo "$candidate"; return
    fi
  done
  echo "error: Python 3.11 or newer is needed" >&2; exit 1
}
if [ ! -x .venv/bin/python ]; then
  "$(pick_python)" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$1"
# The package itself, editable: `python -m caliber_core` then works from any folder.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
