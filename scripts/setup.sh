#!/usr/bin/env bash
# Creates .venv with the verified stack and installs TensorPipe into it (editable, from
# pyproject.toml through PEP 660). Idempotent: installs again only when the pins or pyproject.toml
# change.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
say() { echo "setup: $*" >&2; }
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
stamp=.venv/.tensorpipe-reqs
want=$(cat requirements.txt requirements-nodeps.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  start=$SECONDS
  say "installing the verified stack into .venv: $(grep -cv '^ *\(#\|$\)' requirements.txt) pinned" \
    "packages (requirements.txt: TensorFlow 2.13.1 ...), lingvo 0.14.0 and its companions without" \
    "their metadata (requirements-nodeps.txt), then TensorPipe itself (editable): about 2.3 GB in" \
    ".venv, about 6 minutes on a fresh 2-core machine. Later runs skip this until a pin changes."
  say "step 1 of 4: pip, wheel, setuptools"
  .venv/bin/pip install --quiet --upgrade "pip<25" wheel
  # setuptools >= 64 builds the editable install through PEP 660 (pyproject.toml's build-system);
  # < 82 keeps pkg_resources, which lingvo, tensorflow_hub and tensorboard import. Python 3.11's
  # venv already has one in range (65.5), which stays.
  .venv/bin/pip install --quiet "setuptools>=64,<82"
  say "step 2 of 4: requirements.txt (TensorFlow and the packages lingvo imports)"
  .venv/bin/pip install --quiet -r requirements.txt
  say "step 3 of 4: requirements-nodeps.txt (lingvo and its companions, --no-deps)"
  .venv/bin/pip install --quiet --no-deps -r requirements-nodeps.txt
  say "step 4 of 4: TensorPipe (editable)"
  # A .venv made before the distribution was named tensorpipe-lingvo holds it as "tensorpipe".
  if [ -n "$(ls -d .venv/lib/python*/site-packages/tensorpipe-*.dist-info 2>/dev/null)" ]; then
    .venv/bin/pip uninstall --quiet --yes tensorpipe
  fi
  # The pins above are the dependencies: --no-deps installs only TensorPipe, and
  # --no-build-isolation builds it with the venv's setuptools (no download).
  .venv/bin/pip install --quiet --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
  say "done in $((SECONDS - start)) s"
fi
