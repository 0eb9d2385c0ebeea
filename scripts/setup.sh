#!/usr/bin/env bash
# Creates .venv with the verified stack and installs TensorPipe into it (editable). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.tensorpipe-reqs
want=$(cat requirements.txt requirements-nodeps.txt setup.py | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/pip install --quiet --upgrade "pip<25" wheel
  .venv/bin/pip install --quiet -r requirements.txt
  .venv/bin/pip install --quiet --no-deps -r requirements-nodeps.txt
  .venv/bin/pip install --quiet --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
