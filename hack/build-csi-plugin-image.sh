#!/usr/bin/env bash
# Build driversdk-test/csi-hostpath:local: the reference CSI plugin (driversdk-csi-hostpath) in an
# image, to run it as a docker task with csi_plugin as Nomad users run CSI plugins. Nothing can be
# pulled here, so, like build-test-images.sh, it is a `docker import` of a rootfs tar: busybox (sh,
# mount, umount), this host's Python (interpreter, standard library, the site packages the plugin
# imports, the shared libraries they link) and this tree's driversdk package. The image carries a
# hash of everything it is built from (this script, busybox, the interpreter, every copied site
# package file, the driversdk sources) and is rebuilt when any of it changes.
set -euo pipefail
cd "$(dirname "$0")/.."
image=${CSI_PLUGIN_IMAGE:-driversdk-test/csi-hostpath:local}
python=${PYTHON:-python3}
busybox=/bin/busybox
if ! file -L "$busybox" 2>/dev/null | grep -q static; then
  echo "busybox-static is needed (apt-get install busybox-static)" >&2
  exit 1
fi

# What goes in the image, as the plugin's Python sees it: the interpreter (the real file behind a
# venv's link), its standard library (without tests and GUI), and every top-level package outside
# the standard library that importing the plugin loads, wherever that Python finds it (a venv's
# site-packages, the base one, the user's). Those go to /opt/site, which the image's PYTHONPATH
# names, so the image's interpreter imports them without the venv it was built from.
# `plan` prints what decides the image's content (a line per file, with its hash); `copy ROOT`
# copies it under ROOT.
plan=$(cat <<'PY'
import hashlib, os, shutil, sys, sysconfig
import driversdk.csi.hostpath.main  # noqa: F401 - what the plugin loads
import grpc, google.protobuf  # noqa: F401,E401

tree = os.path.realpath(os.getcwd())
stdlib = os.path.realpath(sysconfig.get_path("stdlib"))
exe = os.path.realpath(sys.executable)
libdir = sysconfig.get_config_var("LIBDIR") or ""
libpython = [os.path.join(libdir, n) for n in sorted(os.listdir(libdir)) if n.startswith("libpython")] if libdir else []
skip = shutil.ignore_patterns("__pycache__", "test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip",
                              "site-packages")

def in_stdlib(path):
    return path.startswith(stdlib + "/") and "/site-packages/" not in path

# Where the other imports come from: the import path's directories, the longest first.
roots = sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)} - {tree, stdlib}, key=len,
               reverse=True)
tops = set()
for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None) or ""
    if not path or os.path.realpath(path).startswith(tree + "/") or in_stdlib(os.path.realpath(path)):
        continue
    path = os.path.realpath(path)
    if os.path.basename(path).startswith("__editable__"):
        continue  # a pip install -e finder: it points at the host's tree, which /opt/driversdk replaces
    for root in roots:
        if path.startswith(root + "/"):
            tops.add(os.path.join(root, os.path.relpath(path, root).split("/")[0]))
            break
    else:
        sys.exit(f"{path}: imported from outside the import path; cannot put it in the image")

def files(path):
    if os.path.isfile(path):
        yield path
        return
    for dirpath, dirnames, names in os.walk(path):
        ignored = skip(dirpath, dirnames + names)
        dirnames[:] = sorted(d for d in dirnames if d not in ignored)
        yield from (os.path.join(dirpath, n) for n in sorted(names) if n not in ignored)

def digest(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()

if sys.argv[1] == "plan":
    print("python", sys.version.replace("\n", " "), exe, digest(exe))
    for lib in libpython:
        print("libpython", lib, digest(lib))
    for top in sorted(tops):
        for path in files(top):
            print("site", os.path.relpath(path, os.path.dirname(top)), digest(path))
    sys.exit(0)

root = sys.argv[2]
def copy(path, dest):
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    if os.path.isdir(path):
        shutil.copytree(path, dest, symlinks=False, dirs_exist_ok=True, ignore=skip)
    else:
        shutil.copy2(path, dest)
copy(exe, root + exe)
os.makedirs(root + "/usr/bin", exist_ok=True)
if not os.path.lexists(root + "/usr/bin/python3"):
    os.symlink(exe, root + "/usr/bin/python3")
for lib in libpython:
    copy(lib, root + os.path.realpath(lib))
copy(stdlib, root + stdlib)
for top in sorted(tops):
    copy(top, os.path.join(root, "opt/site", os.path.basename(top)))
PY
)

content=$( { find driversdk -name '*.py' -not -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum;
  sha256sum "$0" "$busybox"; PYTHONPATH="$PWD" "$python" -c "$plan" plan; } )
source_hash=$(printf '%s\n' "$content" | sha256sum | cut -c1-16)
if [ "$(docker image inspect -f '{{index .Config.Labels "driversdk.source"}}' "$image" 2>/dev/null)" = "$source_hash" ]; then
  exit 0
fi
root="$(mktemp -d)"
trap 'rm -rf "$root" "$root.tar"' EXIT
mkdir -p "$root"/{bin,etc,tmp,proc,sys,dev,root,var/run,opt/driversdk,opt/site,csi,srv/csi}
chmod 1777 "$root/tmp"
cp "$busybox" "$root/bin/busybox"
for applet in $("$busybox" --list); do
  [ "$applet" = busybox ] || ln -sf busybox "$root/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\n' > "$root/etc/passwd"
printf 'root:x:0:\n' > "$root/etc/group"
PYTHONPATH="$PWD" "$python" -c "$plan" copy "$root"
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
  -c 'ENV PATH=/usr/bin:/bin' -c 'ENV PYTHONPATH=/opt/driversdk:/opt/site' -c 'ENV PYTHONDONTWRITEBYTECODE=1' \
  -c "LABEL driversdk.source=$source_hash" \
  -c 'CMD ["/usr/bin/python3", "-m", "driversdk.csi.hostpath"]' "$root.tar" "$image" >/dev/null
echo "==> built $image" >&2
