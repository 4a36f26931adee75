#!/usr/bin/env bash
# The whole test suite, from a fresh machine: makes a virtualenv, installs runstate with
# its test dependencies, and runs pytest. The Kafka tests start a real single-node broker
# themselves (compose/kafka_local.py: Maven Central jars, cached in ~/.cache/runstate).
# Extra arguments go to pytest, e.g. ./run-tests.sh -k projector
set -euo pipefail
cd "$(dirname "$0")"
VENV="${RUNSTATE_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[test]"
exec "$VENV/bin/python" -m pytest "$@"
