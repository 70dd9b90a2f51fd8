"""Which code, and which process context, a long-lived helper serves.

A plugin kept between runs and the run server (driversdk.runner.runserver) outlive the command
that started them. The next command may use one only if it would run the very same code the same
way: :func:`code_identity` covers the code, :func:`context_key` the rest of what a process inherits.
Only ``os``, ``sys`` and ``hashlib``: the run client computes the key before anything else loads.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from typing import Any

# /proc/self/status lines a forked process inherits and a command's behaviour may depend on.
_STATUS_FIELDS = ("Uid:", "Gid:", "Groups:", "CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:",
                  "NoNewPrivs:", "Seccomp:")  # fmt: skip
_NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts")


@functools.cache
def code_identity() -> str:
    """A digest of the code driversdk runs: every source file of driversdk and the bundled drivers
    (path, size, mtime), the interpreter, and the directories its packages are installed in (their
    mtimes change when a package is installed, upgraded or removed). ~2 ms of stat."""
    import drivers
    import driversdk

    digest = hashlib.sha256(f"{sys.executable}\0{sys.version}".encode())
    for package in (driversdk, drivers):
        root = os.path.dirname(os.path.abspath(package.__file__ or ""))
        for folder, subdirs, files in sorted(os.walk(root)):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    _add_stat(digest, os.path.join(folder, name))
    for entry in sys.path:
        if entry.endswith(("site-packages", "dist-packages")):
            _add_stat(digest, entry)
    return digest.hexdigest()


def context_key() -> str:
    """A digest of everything a forked copy of this process would inherit and could act on
    differently: the code; the interpreter's module path, flags, warning and -X options and stdio
    encodings; the namespaces, root, cgroups, credentials, capabilities, seccomp mode, LSM label
    and resource limits. Two processes with the same key run a command the same way (given the
    same argv, env, cwd, umask and stdio, which the run client hands over)."""
    digest = hashlib.sha256(code_identity().encode())
    interpreter: list[object] = [
        sys.path,
        repr(sys.flags),
        sys.warnoptions,
        sorted(sys._xoptions.items()),
        sys.getfilesystemencoding(),
        sys.getfilesystemencodeerrors(),
    ]
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        interpreter.append([getattr(stream, "encoding", None), getattr(stream, "errors", None)])
    digest.update(repr(interpreter).encode())
    for name in _NAMESPACES:
        digest.update(_readlink(f"/proc/self/ns/{name}").encode())
    try:
        root = os.stat("/proc/self/root")
        digest.update(f"root {root.st_dev} {root.st_ino}\n".encode())
    except OSError:
        digest.update(b"root ?\n")
    digest.update(_read("/proc/self/cgroup"))
    digest.update(_read("/proc/self/limits"))
    digest.update(_read("/proc/self/attr/current"))
    status = _read("/proc/self/status").decode(errors="replace").splitlines()
    digest.update("\n".join(line for line in status if line.startswith(_STATUS_FIELDS)).encode())
    return digest.hexdigest()


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return path.encode() + b"\0" + f.read()
    except OSError:
        return path.encode() + b"\0?"


def _add_stat(digest: Any, path: str) -> None:
    try:
        st = os.stat(path)
    except OSError:
        digest.update(f"{path}\0-\n".encode())
        return
    digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
