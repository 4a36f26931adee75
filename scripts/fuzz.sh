#!/usr/bin/env bash
# A long fuzzing run of one target of tests/fuzz_targets.py (atheris): ./scripts/fuzz.sh
# TARGET [SECONDS]. New corpus entries go to .fuzz/TARGET (not checked in); a crash or hang
# is saved as .fuzz/crash-* / timeout-*: turn it into a regression test, then add the input
# to tests/data/fuzz/TARGET. Targets: record_decoder patch_parser checkpoint_reader http_body.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:?usage: scripts/fuzz.sh TARGET [SECONDS]}"
seconds="${2:-600}"
bin="$(scripts/venv.sh test)"
mkdir -p ".fuzz/$target"
exec "$bin/python" tests/fuzz_targets.py "$target" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 \
    -artifact_prefix=.fuzz/ ".fuzz/$target" "tests/data/fuzz/$target"
