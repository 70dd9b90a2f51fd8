#!/usr/bin/env bash
# The project's one test command (README: "Run the tests"). On a fresh Debian machine it
# installs what the suite needs (hack/setup.sh), then runs pytest with any arguments given.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/setup.sh

echo "==> running pytest" >&2
set +e
python3 -m pytest "$@"
rc=$?
set -e
# Exit code 5 means pytest collected no tests: for this project that is a failure.
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests; treating that as a failure" >&2
  exit 1
fi
exit "$rc"
