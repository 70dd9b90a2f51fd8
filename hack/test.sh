#!/usr/bin/env bash
# The project's one test command (README: "Run the tests").
# On a fresh Debian machine it installs everything the suite needs, starts a Docker engine
# if none answers, builds the local test images, installs the package and runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*"; }

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx sh && file -L /bin/busybox 2>/dev/null | grep -q static \
  || need_apt+=(busybox-static)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v findmnt >/dev/null 2>&1 || need_apt+=(util-linux)
command -v file >/dev/null 2>&1 || need_apt+=(file)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing apt packages: ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

log "installing driversdk with its dev extra"
python3 -m pip install -q --disable-pip-version-check -e '.[dev]'

if [ -x hack/docker-up.sh ]; then
  log "starting the Docker engine if none answers"
  hack/docker-up.sh
fi
if [ -x hack/build-test-images.sh ]; then
  log "building local test images"
  hack/build-test-images.sh
fi

log "running pytest"
set +e
python3 -m pytest "$@"
rc=$?
set -e
# Exit code 5 means pytest collected no tests: that is a failure for this project.
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests; treating that as a failure" >&2
  exit 1
fi
exit "$rc"
