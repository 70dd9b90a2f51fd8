#!/usr/bin/env bash
# Everything the tests and the demo need on a fresh Debian machine (run as root):
# apt packages, the package itself with its dev extra, a running Docker engine, local images.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*" >&2; }

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
command -v file >/dev/null 2>&1 || need_apt+=(file)
if ! { [ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q static; }; then
  need_apt+=(busybox-static)
fi
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v findmnt >/dev/null 2>&1 || need_apt+=(util-linux)
command -v pgrep >/dev/null 2>&1 || need_apt+=(procps)
# The registry the docker pull tests run (tests/docker/registry), built into a local image.
[ -x /usr/bin/docker-registry ] || need_apt+=(docker-registry)
# The docker TLS test makes its CA and certificates with openssl.
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing apt packages: ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

log "installing driversdk with its dev extra"
python3 -m pip install -q --disable-pip-version-check -e '.[dev]'

log "starting the Docker engine if none answers"
hack/docker-up.sh
# pytest-docker starts tests/docker/registry/compose.yml: the engine's compose plugin if it has
# one, else Debian's docker-compose.
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then
  log "installing apt package: docker-compose"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
fi
log "building local test images"
hack/build-test-images.sh
hack/build-registry-image.sh
hack/build-csi-plugin-image.sh
