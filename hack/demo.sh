#!/usr/bin/env bash
# The README's demo, on a fresh Debian machine as root. What it adds to the machine and keeps: the
# apt packages it needs when missing (docker.io, runc, busybox-static, file, python3-venv), a
# running dockerd, and the one image the demo uses (driversdk-test/busybox:local). driversdk goes
# into a venv of its own, built from a copy of this checkout (nothing is written into the
# checkout); the venv, the copy and everything the demo ran are removed when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v dockerd >/dev/null 2>&1 || need_apt+=(docker.io)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
command -v file >/dev/null 2>&1 || need_apt+=(file)
if ! { [ -x /bin/busybox ] && file -L /bin/busybox 2>/dev/null | grep -q static; }; then
  need_apt+=(busybox-static)
fi
python3 -c 'import ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "==> installing apt packages: ${need_apt[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
hack/docker-up.sh
hack/build-test-images.sh busybox

work="$(mktemp -d /var/tmp/driversdk-demo-install.XXXXXX)"
trap 'rm -rf "$work"' EXIT
echo "==> installing driversdk[all] into a venv of its own: $work/venv (removed at the end)" >&2
tar -C . --exclude=./.git --exclude=./tests --exclude=./build --exclude='*.egg-info' --exclude=__pycache__ \
  -cf - . | { mkdir "$work/src" && tar -C "$work/src" -xf -; }
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check --no-cache-dir "$work/src[all]"
rm -rf "$work/src"
"$work/venv/bin/python" examples/demo.py
