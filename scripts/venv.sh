#!/usr/bin/env bash
# Make (once) the project's virtualenv and install runstate into it with the extras given
# as $1 (e.g. "test"); print the venv's bin directory. Used by run-demo.sh and run-tests.sh.
# pip's output goes to .venv/install.log and is shown only if the install fails.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${RUNSTATE_VENV:-.venv}"
extras="${1:-}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" >&2
fi
echo "installing runstate${extras:+[$extras]} into $VENV ..." >&2
if ! { "$VENV/bin/python" -m pip install --disable-pip-version-check --upgrade pip \
       && "$VENV/bin/python" -m pip install --disable-pip-version-check -e ".${extras:+[$extras]}"; } \
       > "$VENV/install.log" 2>&1; then
    cat "$VENV/install.log" >&2
    echo "install failed (log above, also in $VENV/install.log)" >&2
    exit 1
fi
echo "$(pwd)/$VENV/bin"
