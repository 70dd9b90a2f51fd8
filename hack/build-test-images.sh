#!/usr/bin/env bash
# Build the local test images driversdk-test/busybox:local and driversdk-test/pause:local from
# busybox-static; `build-test-images.sh busybox` (or `pause`) builds only that one. An image that
# exists already is left as it is. Nothing can be pulled from a registry here, so each image is a
# `docker import` of a rootfs tar.
set -euo pipefail
# Tags are not "latest": like Nomad, the docker driver always pulls a :latest image, and nothing
# can be pulled here.
image=driversdk-test/busybox:local
pause=driversdk-test/pause:local
want=("$@")
[ ${#want[@]} -gt 0 ] || want=(busybox pause)
todo=()
for name in "${want[@]}"; do
  case "$name" in
    busybox) ref=$image ;;
    pause) ref=$pause ;;
    *) echo "unknown image '$name': give busybox and/or pause" >&2; exit 2 ;;
  esac
  docker image inspect "$ref" >/dev/null 2>&1 || todo+=("$name")
done
if [ ${#todo[@]} -eq 0 ]; then
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
built=()
for name in "${todo[@]}"; do
  if [ "$name" = busybox ]; then
    docker import -c 'CMD ["/bin/sh"]' -c 'ENV PATH=/bin:/sbin:/usr/bin:/usr/sbin' "$root.tar" "$image" >/dev/null
    built+=("$image")
  else
    # The infra ("pause") container of group networking only has to hold a network namespace.
    docker import -c 'CMD ["/bin/sleep", "2147483647"]' "$root.tar" "$pause" >/dev/null
    built+=("$pause")
  fi
done
echo "==> built ${built[*]}" >&2
