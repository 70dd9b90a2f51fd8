"""The ``__main__`` of a packaged plugin (``driversdk plugin package``): standard library only.

It runs from inside the archive, under ``python -I -S`` (the archive's shell preamble asks for
that; run any other way it re-executes itself so). It checks that this interpreter is the one the
archive was built for, extracts the archive's ``lib/`` tree once into a private cache dir keyed by
the archive's content hash (grpcio's and protobuf's compiled extensions cannot be imported from a
zip), puts only that tree and the standard library on ``sys.path`` and starts the driver.

Every way this can fail before the driver runs is one sentence on stderr and exit status 1
(:func:`refuse`), which Nomad's client logs as the plugin's error.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
import sysconfig
import tempfile
import zipfile
from typing import IO, Any, NoReturn

META_NAME = "driversdk-plugin.json"
LIB_PREFIX = "lib/"
ENV_CACHE = "DRIVERSDK_PLUGIN_CACHE"


def refuse(message: str) -> NoReturn:
    """One sentence for the operator on stderr, exit status 1. (No exception class of driversdk's
    own: this module runs before driversdk is importable.)"""
    raise SystemExit(f"{os.path.basename(sys.argv[0])}: {message}")


def interpreter() -> dict[str, str]:
    """What a compiled extension needs of the interpreter that loads it."""
    return {
        "implementation": sys.implementation.name,
        "version": "{}.{}".format(*sys.version_info[:2]),
        "ext_suffix": str(sysconfig.get_config_var("EXT_SUFFIX") or ""),
        "platform": sysconfig.get_platform(),
    }


def check_interpreter(built: dict[str, str]) -> None:
    here = interpreter()
    if all(here.get(key) == built.get(key) for key in ("implementation", "version", "ext_suffix")):
        return
    refuse(
        f"this plugin was built for {built.get('implementation')} {built.get('version')} "
        f"({built.get('platform')}, extensions {built.get('ext_suffix')}) but {sys.executable} is "
        f"{here['implementation']} {here['version']} ({here['platform']}, extensions {here['ext_suffix']}); "
        f"install python{built.get('version')} or build the plugin again with "
        "`driversdk plugin package --python PATH` naming an interpreter like the one it runs under"
    )


def cache_root() -> str:
    """Where extracted plugins live: ``$DRIVERSDK_PLUGIN_CACHE``, else the user's cache dir
    (``$XDG_CACHE_HOME`` or ``~/.cache``; root's home for a Nomad client started by systemd
    without ``HOME``), else a per-uid dir in the temp dir."""
    chosen = os.environ.get(ENV_CACHE, "")
    if chosen:
        if not os.path.isabs(chosen):
            refuse(f"{ENV_CACHE}={chosen!r} must be an absolute path")
        return chosen
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):
        return os.path.join(xdg, "driversdk-plugins")
    home = os.path.expanduser("~")
    try:
        info = os.stat(home)
        usable = os.path.isabs(home) and home != "/" and info.st_uid == os.geteuid()
    except OSError:
        usable = False
    if usable:
        cache = os.path.join(home, ".cache")
        try:
            os.mkdir(cache, 0o700)
        except FileExistsError:
            pass
        except OSError:
            usable = False
        if usable:
            return os.path.join(cache, "driversdk-plugins")
    return os.path.join(tempfile.gettempdir(), f"driversdk-plugins-{os.geteuid()}")


def check_private(path: str, what: str) -> None:
    """``path`` must be a real directory (not a symlink) owned by us that nobody else can write."""
    info = os.lstat(path)
    fix = f"remove it, or set {ENV_CACHE} to a directory of your own"
    if stat.S_ISLNK(info.st_mode):
        refuse(f"the plugin {what} {path} is a symlink, which could point anywhere; {fix}")
    if not stat.S_ISDIR(info.st_mode):
        refuse(f"the plugin {what} {path} is not a directory; {fix}")
    if info.st_uid != os.geteuid():
        refuse(
            f"the plugin {what} {path} is owned by uid {info.st_uid}, not by uid {os.geteuid()} "
            f"that runs the plugin, so its contents cannot be trusted; {fix}"
        )
    if info.st_mode & 0o022:
        refuse(
            f"the plugin {what} {path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}), "
            f"so its contents cannot be trusted; {fix}"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700, follow_symlinks=False)


def private_dir(path: str) -> str:
    """Create ``path`` 0700 (its missing parents too), or check an existing one with lstat."""
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        os.makedirs(parent, 0o700, exist_ok=True)
    try:
        os.mkdir(path, 0o700)  # mkdir never follows a symlink planted at path
    except FileExistsError:
        pass
    check_private(path, "cache dir")
    return path


def content_key(fp: IO[bytes]) -> str:
    digest = hashlib.sha256()
    fp.seek(0)
    for block in iter(lambda: fp.read(1 << 20), b""):
        digest.update(block)
    fp.seek(0)
    return digest.hexdigest()[:32]


def extract(archive: zipfile.ZipFile, root: str, key: str) -> str:
    """The extracted tree for ``key`` under ``root``: extracted into a temp dir, then renamed into
    place in one step, so a half-extracted tree is never used and two first runs at once each
    extract and one rename wins."""
    final = os.path.join(root, key)
    if not os.path.lexists(final):
        work = tempfile.mkdtemp(prefix=f".{key}-", dir=root)
        try:
            for member in archive.infolist():
                if member.filename.startswith(LIB_PREFIX) and member.filename != LIB_PREFIX:
                    archive.extract(member, work)  # names with .. or a leading / are sanitised
            os.rename(work, final)
        except OSError:
            if not os.path.lexists(final):
                raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    check_private(final, "cache dir")
    return os.path.join(final, LIB_PREFIX.rstrip("/"))


def isolate(tree: str) -> None:
    """Only the extracted tree and the standard library on sys.path (under ``-I -S`` the rest of
    it is the standard library; the archive itself goes); the tree's .pth files (its own
    packages') are processed as a site dir's would be."""
    import site

    sys.path[:] = [tree, *(p for p in sys.path[1:] if os.path.abspath(p) != os.path.abspath(sys.argv[0]))]
    site.addsitedir(tree)


def run_entry(archive: str, meta: dict[str, Any]) -> None:
    import importlib
    import runpy

    module, attr = meta["entry"]["module"], meta["entry"].get("attr")
    sys.argv[0] = archive
    if not attr:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    try:
        target: Any = importlib.import_module(module)
    except ImportError as err:
        refuse(
            f"the driver module {module!r} does not load under {sys.executable} ({type(err).__name__}: {err}); "
            "build the plugin again on a host like this one"
        )
    for part in attr.split("."):
        target = getattr(target, part)
    from driversdk import serve
    from driversdk.driver import DriverPlugin

    if isinstance(target, type) and issubclass(target, DriverPlugin):
        serve(target())
    elif isinstance(target, DriverPlugin):
        serve(target)
    else:
        target()


def main() -> None:
    archive = os.path.abspath(sys.argv[0])
    if not (sys.flags.isolated and sys.flags.no_site):
        # Started some other way than the preamble (`python3 mydriver`): run again isolated,
        # before anything from the environment is imported.
        os.execv(sys.executable, [sys.executable, "-I", "-S", archive, *sys.argv[1:]])
    try:
        with open(archive, "rb") as fp:
            key = content_key(fp)
            with zipfile.ZipFile(fp) as zf:
                meta = json.loads(zf.read(META_NAME))
                check_interpreter(meta["python"])
                tree = extract(zf, private_dir(cache_root()), key)
    except OSError as err:
        where = f" ({err.filename})" if err.filename else ""
        refuse(f"cannot prepare the plugin's files: {err.strerror or err}{where}")
    isolate(tree)
    run_entry(archive, meta)


if __name__ == "__main__":
    main()
