#!/usr/bin/env bash
# Build driversdk-test/csi-hostpath:local: the reference CSI plugin (driversdk-csi-hostpath) in an
# image, to run it as a docker task with csi_plugin as Nomad users run CSI plugins. Nothing can be
# pulled here, so, like build-test-images.sh, it is a `docker import` of a rootfs tar: busybox (sh,
# mount, umount), this host's Python (interpreter, standard library, the site packages the plugin
# imports, the shared libraries they link) and this tree's driversdk package. The image carries a
# hash of what it was built from and is rebuilt when that changes.
set -euo pipefail
cd "$(dirname "$0")/.."
image=driversdk-test/csi-hostpath:local
python=${PYTHON:-python3}

source_hash=$( (find driversdk -name '*.py' -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 cat;
  "$python" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
if [ "$(docker image inspect -f '{{index .Config.Labels "driversdk.source"}}' "$image" 2>/dev/null)" = "$source_hash" ]; then
  exit 0
fi
busybox=/bin/busybox
if ! file -L "$busybox" 2>/dev/null | grep -q static; then
  echo "busybox-static is needed (apt-get install busybox-static)" >&2
  exit 1
fi
root="$(mktemp -d)"
trap 'rm -rf "$root" "$root.tar"' EXIT
mkdir -p "$root"/{bin,etc,tmp,proc,sys,dev,root,var/run,opt/driversdk,csi,srv/csi}
chmod 1777 "$root/tmp"
cp "$busybox" "$root/bin/busybox"
for applet in $("$busybox" --list); do
  [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$root/etc/passwd"
printf 'root:x:0:\n' > "$root/etc/group"

# What to copy, as the plugin's Python sees it: the interpreter, its standard library (without
# tests and GUI), and the top-level site packages that importing the plugin loads.
PYTHONPATH="$PWD" "$python" - "$root" <<'EOF'
import os, shutil, sys, sysconfig
import driversdk.csi.hostpath.main  # noqa: F401 - what the plugin loads
import grpc, google.protobuf  # noqa: F401,E401

root = sys.argv[1]
def copy(path: str) -> None:
    dest = root + os.path.realpath(path)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    if os.path.isdir(path):
        shutil.copytree(path, dest, symlinks=False, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "test", "tests", "idlelib", "tkinter",
                                                      "turtledemo", "ensurepip", "site-packages"))
    else:
        shutil.copy2(path, dest)
exe = os.path.realpath(sys.executable)
copy(exe)
os.makedirs(os.path.dirname(root + sys.executable), exist_ok=True)
if not os.path.exists(root + "/usr/bin/python3"):
    os.makedirs(root + "/usr/bin", exist_ok=True)
    os.symlink(exe, root + "/usr/bin/python3")
libdir = sysconfig.get_config_var("LIBDIR") or ""
for name in os.listdir(libdir) if libdir else []:
    if name.startswith("libpython"):
        copy(os.path.join(libdir, name))
copy(sysconfig.get_path("stdlib"))
site = os.path.realpath(sysconfig.get_path("purelib"))
tops = set()
for module in list(sys.modules.values()):
    path = os.path.realpath(getattr(module, "__file__", None) or "")
    if path.startswith(site + "/"):
        tops.add(os.path.join(site, os.path.relpath(path, site).split("/")[0]))
for top in sorted(tops):
    copy(top)
EOF
# Every shared library the interpreter and the copied extension modules link.
find "$root" -type f \( -name '*.so' -o -name '*.so.*' -o -perm -u+x \) -not -path "$root/bin/*" \
  -not -name '_tkinter*' -print0 |
  { xargs -0 ldd 2>/dev/null || true; } | awk '/=> \// {print $3} /^\t\/lib/ {print $1}' | sort -u |
  while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
cp -rL driversdk "$root/opt/driversdk/"
find "$root/opt/driversdk" -name __pycache__ -prune -exec rm -rf {} +
tar -C "$root" -c . > "$root.tar"
docker import \
  -c 'ENV PATH=/usr/bin:/bin' -c 'ENV PYTHONPATH=/opt/driversdk' -c 'ENV PYTHONDONTWRITEBYTECODE=1' \
  -c "LABEL driversdk.source=$source_hash" \
  -c 'CMD ["/usr/bin/python3", "-m", "driversdk.csi.hostpath"]' "$root.tar" "$image" >/dev/null
echo "==> built $image" >&2
