#!/usr/bin/env bash
# Build the local image driversdk-test/registry:local that tests/docker/registry/compose.yml runs:
# Debian's docker-registry (the distribution registry) with the libraries it links, as a
# `docker import` of a rootfs, like the busybox test image. Nothing is pulled from a registry.
set -euo pipefail
image=driversdk-test/registry:local
if docker image inspect "$image" >/dev/null 2>&1; then
  exit 0
fi
registry=/usr/bin/docker-registry
if [ ! -x "$registry" ]; then
  echo "the docker-registry package is needed (apt-get install docker-registry)" >&2
  exit 1
fi
root="$(mktemp -d)"
trap 'rm -rf "$root" "$root.tar"' EXIT
mkdir -p "$root"/{usr/bin,etc/docker/registry,var/lib/registry,auth,tmp}
chmod 1777 "$root/tmp"
cp "$registry" "$root/usr/bin/docker-registry"
# The dynamic loader and every library the binary links, at the same paths.
for lib in $(ldd "$registry" | grep -o '/[^ ]*'); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# A minimal config; the compose file sets the rest through REGISTRY_* variables.
cat > "$root/etc/docker/registry/config.yml" <<'YML'
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: /var/lib/registry
  delete:
    enabled: true
http:
  addr: :5000
YML
printf 'root:x:0:0:root:/:/usr/bin/docker-registry\n' > "$root/etc/passwd"
tar -C "$root" -c . > "$root.tar"
docker import \
  -c 'ENTRYPOINT ["/usr/bin/docker-registry"]' \
  -c 'CMD ["serve", "/etc/docker/registry/config.yml"]' \
  -c 'EXPOSE 5000' \
  -c 'LABEL io.driversdk.test=registry' \
  "$root.tar" "$image" >/dev/null
echo "==> built $image" >&2
