#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs runstate with its test dependencies in
# .venv and runs pytest. The Kafka tests start a real single-node broker themselves
# (runstate.compose.kafka_local: jars from Maven Central, cached in ~/.cache/runstate); without
# Java and Maven they are skipped, except under CI=true where that is a failure.
# Extra arguments go to pytest, e.g. ./run-tests.sh -k projector
set -euo pipefail
cd "$(dirname "$0")"
bin="$(scripts/venv.sh test)"
exec "$bin/python" -m pytest "$@"
