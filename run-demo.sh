#!/usr/bin/env bash
# The main job on a fresh machine: installs runstate in .venv, then runs `runstate demo`
# (embedded log, no Kafka, no network after the install). Extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")"
bin="$(scripts/venv.sh)"
exec "$bin/runstate" demo "$@"
