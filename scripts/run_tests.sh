#!/usr/bin/env bash
# The test suite: one shared Ray instance per session (tests/conftest.py), tiny models, real data
# from ../shared/data when present. Exit 5 (no tests collected) is a failure, not a pass.
# Extra arguments go to pytest; when they name test files or directories, only those run.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_UV_RUN_RUNTIME_ENV=0
# The import layers first (pyproject.toml, [tool.importlinter]): a broken contract fails in a second,
# before any test; no cache folder is left behind.
if ! layers=$(.venv/bin/lint-imports --no-logo --no-cache 2>&1); then
  echo "$layers"
  exit 1
fi
echo "$layers" | grep "^Contracts:"
# The whole suite runs on every core (pytest-xdist; tests/conftest.py groups the tests so a file
# stays in one worker); named files run in one process. DPSYNTH_TEST_WORKERS overrides (0: serial).
targets=tests
workers=${DPSYNTH_TEST_WORKERS:-}
for arg in "$@"; do
  case "$arg" in tests/*) targets= ; workers=${workers:-0} ;; esac
done
if [ -z "$workers" ]; then
  workers=$(.venv/bin/python -c 'import os; print(min(4, len(os.sched_getaffinity(0))))')
fi
parallel=()
# --no-loadscope-reorder: keep tests/conftest.py's order (minutes-long files first); xdist's default
# sorts the groups by test count, which can leave a worker alone with the sweep at the end.
if [ "$workers" -gt 1 ]; then
  parallel=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
  # one core's share of threads per worker: torch's OpenMP pool defaults to every core, and two workers' pools
  # spinning on the same cores slow each other down (Ray already gives its tasks 1 thread)
  cores=$(.venv/bin/python -c 'import os; print(len(os.sched_getaffinity(0)))')
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( cores / workers > 0 ? cores / workers : 1 ))}
fi
.venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 --durations=15 "${parallel[@]}" $targets "$@"
