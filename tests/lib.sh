# Sourced by the shell tests (tests/*.sh): strict mode, a scratch folder $d that is removed on
# exit, and `fail MESSAGE`, which prints FAILED: MESSAGE to stderr and exits 1.
# shellcheck shell=bash
set -euo pipefail

d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail() {
  echo "FAILED: $*" >&2
  exit 1
}
