#!/usr/bin/env bash
# Make (once) the project's virtualenv and install runstate into it with the extras given
# as $1 (e.g. "test"); print the venv's bin directory. Used by run-demo.sh and run-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${RUNSTATE_VENV:-.venv}"
extras="${1:-}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" >&2
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >&2
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".${extras:+[$extras]}" >&2
echo "$(pwd)/$VENV/bin"
