#!/usr/bin/env bash
# Installs Bazel 4 from Debian's packages for TensorPipe's BUILD: bazel-bootstrap (Bazel 4.2.3) and
# bazel-rules-java (WORKSPACE's @rules_java). Idempotent; installing needs root (or sudo) and
# Debian's package registry, building does not: the WORKSPACE fetches nothing, and targets run the
# checkout's .venv Python (bash scripts/setup.sh first).
#   bash scripts/bazel_setup.sh
#   bazel build //...
#   bazel test //:schedule_test //:micro_batching_test
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for package in bazel-bootstrap bazel-rules-java; do
  if ! dpkg-query -W -f='${Status}\n' "$package" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$package")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    echo "scripts/bazel_setup.sh: needs Debian's apt-get to install ${missing[*]}" >&2
    exit 1
  fi
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  if ! "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null; then
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
echo "Bazel: $(dpkg-query -W -f='${Package} ${Version}' bazel-bootstrap) ($(command -v bazel))"
