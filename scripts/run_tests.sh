#!/usr/bin/env bash
# The test suite: one shared Ray instance per session (tests/conftest.py), tiny models, real data
# from ../shared/data when present. Exit 5 (no tests collected) is a failure, not a pass.
# Extra arguments go to pytest; when they name test files or directories, only those run.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_UV_RUN_RUNTIME_ENV=0
targets=tests
for arg in "$@"; do
  case "$arg" in tests/*) targets= ;; esac
done
.venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 --durations=15 $targets "$@"
