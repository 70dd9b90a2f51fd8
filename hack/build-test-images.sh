#!/usr/bin/env bash
# Build the local test image driversdk-test/busybox:latest from busybox-static.
# Nothing can be pulled from a registry here, so the image is a `docker import` of a rootfs tar.
set -euo pipefail
# Tags are not "latest": like Nomad, the docker driver always pulls a :latest image, and nothing
# can be pulled here.
image=driversdk-test/busybox:local
pause=driversdk-test/pause:local
if docker image inspect "$image" >/dev/null 2>&1 && docker image inspect "$pause" >/dev/null 2>&1; then
  exit 0
fi
busybox=/bin/busybox
if ! file -L "$busybox" 2>/dev/null | grep -q static; then
  echo "busybox-static is needed (apt-get install busybox-static)" >&2
  exit 1
fi
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,proc,sys,dev,root,var/run}
chmod 1777 "$root/tmp"
cp "$busybox" "$root/bin/busybox"
for applet in $("$busybox" --list); do
  [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
tar -C "$root" -c . > "$root.tar"
trap 'rm -rf "$root" "$root.tar"' EXIT
docker import -c 'CMD ["/bin/sh"]' -c 'ENV PATH=/bin:/sbin:/usr/bin:/usr/sbin' "$root.tar" "$image" >/dev/null
# The infra ("pause") container of group networking only has to hold a network namespace.
docker import -c 'CMD ["/bin/sleep", "2147483647"]' "$root.tar" "$pause" >/dev/null
echo "==> built $image and $pause" >&2
