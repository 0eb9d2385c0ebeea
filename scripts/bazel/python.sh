#!/bin/sh
# Bazel's Python interpreter (the py_runtime in scripts/bazel/BUILD): the .venv Python of the checkout
# this file belongs to (scripts/setup.sh creates it), so targets see the pinned stack. Bazel runs this
# file through a runfiles symlink; resolving it finds the checkout wherever it is cloned.
root=$(dirname "$(dirname "$(dirname "$(readlink -f "$0")")")")
if [ ! -x "$root/.venv/bin/python" ]; then
  echo "scripts/bazel/python.sh: no $root/.venv/bin/python; run: bash scripts/setup.sh" >&2
  exit 1
fi
exec "$root/.venv/bin/python" "$@"
