"""Find a plugin in a ``plugin_dir`` the way a Nomad client's plugin loader does, and render its
schemas as readable hclspec.

Nomad's loader lists the entries directly inside ``plugin_dir``, follows symlinks (stat), skips
directories and files with no execute bit, strips a trailing ``.exe`` and matches what is left
against the ``plugin "NAME"`` blocks of the agent config. It runs the file by its path (argv[0]),
with the block's ``args`` after it, the agent's environment plus go-plugin's handshake variables,
and the agent's working directory.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from driversdk.errors import PluginError
from driversdk.hclspec.spec import (
    Array,
    Attr,
    Block,
    BlockAttrs,
    BlockList,
    BlockMap,
    BlockSet,
    Default,
    Literal,
    Object,
    Spec,
)

# The plugin API version a Nomad client speaks to a task driver (equality, with or without "v").
NOMAD_DRIVER_API = "0.1.0"
# What hashicorp/go-version accepts as a version, in our words: digits, dot-separated, an
# optional pre-release and build metadata.
_GO_VERSION = re.compile(r"^v?\d+(\.\d+)*(-?[0-9A-Za-z~-]+(\.[0-9A-Za-z~-]+)*)?(\+[0-9A-Za-z~-]+(\.[0-9A-Za-z~-]+)*)?$")


@dataclass(frozen=True)
class Found:
    path: str
    name: str


def clean_name(filename: str) -> str:
    return filename.removesuffix(".exe")


def find_plugin(plugin_dir: str, name: str) -> Found:
    """The file Nomad would launch for ``plugin "name"``, or a PluginError saying why there is none."""
    try:
        entries = sorted(os.listdir(plugin_dir))
    except FileNotFoundError:
        raise PluginError(f"plugin_dir {plugin_dir} does not exist; give the client's plugin_dir") from None
    except NotADirectoryError:
        raise PluginError(f"plugin_dir {plugin_dir} is not a directory; give the client's plugin_dir") from None
    loadable: list[str] = []
    why: str | None = None
    for entry in entries:
        path = os.path.join(plugin_dir, entry)
        try:
            info = os.stat(path)
        except OSError as err:
            # Nomad's whole scan fails on an entry it cannot stat (a dangling symlink).
            raise PluginError(
                f"{path} cannot be read ({err.strerror}); Nomad's client refuses to start with it in plugin_dir: "
                "remove or fix it"
            ) from None
        if stat.S_ISDIR(info.st_mode):
            if clean_name(entry) == name:
                why = f"{path} is a directory, which Nomad skips; put the plugin file itself in plugin_dir"
            continue
        if not info.st_mode & 0o111:
            if clean_name(entry) == name:
                why = f"{path} is not executable (mode {stat.S_IMODE(info.st_mode):o}), so Nomad skips it; chmod +x it"
            continue
        if clean_name(entry) == name:
            return Found(path, name)
        loadable.append(clean_name(entry))
    if why:
        raise PluginError(why)
    seen = f" (it holds {', '.join(loadable)})" if loadable else " (it holds no executable file)"
    raise PluginError(
        f'plugin_dir {plugin_dir} has no executable file named "{name}"{seen}; copy the plugin there under that name'
    )


def api_problem(versions: tuple[str, ...], plugin_version: str) -> str | None:
    """Why Nomad's loader would fail on or skip a driver reporting these versions, or None."""
    if not _GO_VERSION.match(plugin_version):
        return f"its plugin_version {plugin_version!r} is not a version Nomad can parse, and the client fails to start"
    if not any(v.removeprefix("v") == NOMAD_DRIVER_API for v in versions):
        return (
            f"it speaks plugin API {', '.join(versions) or 'none'} and Nomad's driver API is v{NOMAD_DRIVER_API}, "
            "so Nomad skips it"
        )
    return None


def render(spec: Spec | None, indent: str = "") -> str:
    """``spec`` as readable hclspec, one attribute or block per line."""
    if spec is None:
        return f"{indent}(none: the plugin takes no config block)"
    return "\n".join(_lines(spec, indent))


def _opts(*parts: str) -> str:
    return ", ".join(p for p in parts if p)


def _lines(spec: Spec, indent: str) -> Iterator[str]:
    inner = indent + "  "
    if isinstance(spec, Object):
        yield f"{indent}object {{"
        for key, child in spec.attributes.items():
            body = [line.replace(f"attr({key!r}, ", "attr(", 1) for line in _lines(child, inner)]
            yield f"{inner}{key} = {body[0].strip()}"
            yield from body[1:]
        yield f"{indent}}}"
    elif isinstance(spec, Default):
        primary = list(_lines(spec.primary, indent))
        default = " ".join(line.strip() for line in _lines(spec.default, ""))
        primary[-1] += f" default {default}"
        yield from primary
    elif isinstance(spec, Attr):
        req = "required" if spec.required else ""
        yield f"{indent}attr({_opts(repr(spec.name) if spec.name else '', spec.type, req)})"
    elif isinstance(spec, BlockAttrs):
        req = "required" if spec.required else ""
        yield f"{indent}block_attrs({_opts(repr(spec.name) if spec.name else '', spec.type, req)})"
    elif isinstance(spec, Literal):
        yield f"{indent}{spec.value}"
    elif isinstance(spec, Array):
        yield f"{indent}array ["
        for value in spec.values:
            yield from _lines(value, inner)
        yield f"{indent}]"
    elif isinstance(spec, Block | BlockList | BlockSet | BlockMap):
        yield from _block(spec, indent)
    else:
        yield f"{indent}{type(spec).__name__}"


def _block(spec: Block | BlockList | BlockSet | BlockMap, indent: str) -> Iterator[str]:
    name = repr(spec.name) if spec.name else ""
    if isinstance(spec, Block):
        head = f"block({_opts(name, 'required' if spec.required else '')})"
    elif isinstance(spec, BlockMap):
        head = f"block_map({_opts(name, 'labels=' + ','.join(spec.labels))})"
    else:
        kind = "block_list" if isinstance(spec, BlockList) else "block_set"
        least = f"min={spec.min_items}" if spec.min_items else ""
        counts = _opts(least, f"max={spec.max_items}" if spec.max_items else "")
        head = f"{kind}({_opts(name, counts)})"
    nested = list(_lines(spec.nested, indent))
    yield f"{indent}{head} {nested[0].strip()}"
    yield from nested[1:]
