#!/usr/bin/env bash
# Creates .venv with the verified stack and installs TensorPipe into it (editable, from
# pyproject.toml through PEP 660). Idempotent: installs again only when the pins or pyproject.toml
# change.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.tensorpipe-reqs
want=$(cat requirements.txt requirements-nodeps.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/pip install --quiet --upgrade "pip<25" wheel
  # setuptools >= 64 builds the editable install through PEP 660 (pyproject.toml's build-system);
  # < 82 keeps pkg_resources, which lingvo, tensorflow_hub and tensorboard import. Python 3.11's
  # venv already has one in range (65.5), which stays.
  .venv/bin/pip install --quiet "setuptools>=64,<82"
  .venv/bin/pip install --quiet -r requirements.txt
  .venv/bin/pip install --quiet --no-deps -r requirements-nodeps.txt
  # The pins above are the dependencies: --no-deps installs only TensorPipe, and
  # --no-build-isolation builds it with the venv's setuptools (no download).
  .venv/bin/pip install --quiet --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
