"""The user's private cache dir of driversdk, with nothing but ``os`` (the run client loads it before
anything else): ``$DRIVERSDK_CACHE_DIR``, else ``$XDG_CACHE_HOME/driversdk``, else
``~/.cache/driversdk``, used only when it is a real directory of the effective user's that no one
else may enter (0700): the parser caches read pickles from it and the run server listens in it."""

from __future__ import annotations

import os
import stat

ENV_CACHE_DIR = "DRIVERSDK_CACHE_DIR"


def cache_dir() -> str:
    """Where the cache dir is (it may not exist yet). Raises RuntimeError without a home dir."""
    configured = os.environ.get(ENV_CACHE_DIR)
    if configured:
        return configured
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return os.path.join(xdg, "driversdk")
    home = os.path.expanduser("~")
    if home == "~":
        raise RuntimeError("no home directory")
    return os.path.join(home, ".cache", "driversdk")


def private_dir(create: bool) -> str | None:
    """The cache dir when it is ours alone (created 0700 when ``create``), else None."""
    try:
        path = cache_dir()
    except RuntimeError:
        return None
    try:
        if create and not os.path.lexists(path):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass  # another process made it meanwhile: checked below like any other
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        return None  # a symlink, someone else's, or open to others: files in it could be planted
    return path
