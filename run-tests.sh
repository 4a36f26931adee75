#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs runstate with its test dependencies in
# .venv and runs pytest. The Kafka tests start a real single-node broker themselves
# (runstate.compose.kafka_local: jars from Maven Central, cached in ~/.cache/runstate); without
# Java and Maven they are skipped, except under CI=true where that is a failure. The browser
# tests drive Debian's chromium, installed here when it is missing and apt-get can (as root);
# without it they are skipped, except under CI=true.
# Extra arguments go to pytest, e.g. ./run-tests.sh -k projector
set -euo pipefail
cd "$(dirname "$0")"
bin="$(scripts/venv.sh test)"
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing Debian's chromium for the browser tests ..." >&2
    { apt-get install -y chromium || { apt-get update && apt-get install -y chromium; }; } \
        > .venv/chromium-install.log 2>&1 || echo "chromium did not install (.venv/chromium-install.log)" >&2
fi
exec "$bin/python" -m pytest "$@"
