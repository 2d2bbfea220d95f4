#!/usr/bin/env bash
# Set up erdmampi (including the mpi4py+MPICH reference the tests compare
# against) and run the test suite:
#
#   bash scripts/test.sh [pytest arguments...]
#
# Every test gets a time limit of $ERDMA_TEST_TIMEOUT seconds (default 300,
# pytest-timeout), so a hung test fails instead of hanging the run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

# shellcheck disable=SC1091
source .venv/bin/activate
echo "[test] python -m pytest tests -q --timeout=${ERDMA_TEST_TIMEOUT:-300} $*"
rc=0
python -m pytest tests -q --timeout="${ERDMA_TEST_TIMEOUT:-300}" "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "[test] ERROR: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
