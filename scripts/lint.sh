#!/usr/bin/env bash
# Lint of the library (pylint with .pylintrc: Lingvo's style, 2-space indents, 100 columns) and type
# checking of every module of it (mypy with .mypy.ini). Exits non-zero on any finding.
#   bash scripts/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "pylint tensorpipe/"
.venv/bin/python -m pylint -j 2 tensorpipe
echo "mypy tensorpipe/"
.venv/bin/python -m mypy
