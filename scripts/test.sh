#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and runs the test suite. Extra arguments go to pytest.
#   bash scripts/test.sh                  # everything (what .ci/run runs)
#   bash scripts/test.sh -m "not slow"    # the quick loop
#   bash scripts/test.sh -n 0 -k NAME     # one process (a later -n wins)
# Tests run in TENSORPIPE_TEST_PROCESSES processes (default 2; pytest-xdist), a test class's tests in
# one (they may share what the class builds).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}
.venv/bin/python -m pytest -n "${TENSORPIPE_TEST_PROCESSES:-2}" --dist loadscope "$@"
