#!/usr/bin/env bash
# The test command of the README: installs what is missing (tools/setup_env.sh), then
# runs the whole suite. Extra arguments go to pytest (e.g. tests/ops -k zero).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash tools/setup_env.sh || exit 1
.venv/bin/python -m pytest "${@:-tests}" -q -p no:cacheprovider --durations=15
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run_tests: pytest collected no tests: that is a failure, not a pass" >&2
  exit 1
fi
exit "$rc"
