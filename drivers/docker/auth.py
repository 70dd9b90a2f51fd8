"""Registry credentials for a pull: the task's auth block, else the plugin's auth { config, helper }.

The order is Nomad's: task credentials first, then the dockercfg file named by auth.config (its
`auths` entry for the registry, then its per-registry `credHelpers`, then its `credsStore`), then
the credential helper named by auth.helper. The first that yields credentials wins; none means an
anonymous pull.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from typing import Any

from docker.auth import INDEX_NAME, resolve_repository_name
from docker.errors import InvalidRepository

from drivers.docker.config import PluginConfig
from driversdk.errors import DriverError

HELPER_PREFIX = "docker-credential-"
HELPER_TIMEOUT = 30.0


class AuthLookupError(DriverError):
    """The credentials for a registry could not be looked up (file, helper); not retryable as is."""


def registry_of(repository: str) -> str:
    """The registry host a repository lives on (docker.io for a bare name)."""
    try:
        registry, _ = resolve_repository_name(repository)
    except InvalidRepository as err:
        raise AuthLookupError(f"invalid repository name {repository!r}: {err}") from None
    return "docker.io" if registry == INDEX_NAME else registry


def resolve(repository: str, task_auth: dict[str, str] | None, plugin: PluginConfig) -> dict[str, str] | None:
    """docker-py's auth_config for a pull of `repository`, or None for an anonymous pull."""
    registry = registry_of(repository)
    if task_auth and (task_auth.get("username") or task_auth.get("password")):
        # email is parsed but dropped, as in Nomad.
        return {
            "username": task_auth.get("username", ""),
            "password": task_auth.get("password", ""),
            "serveraddress": task_auth.get("server_address") or registry,
        }
    if plugin.auth_config:
        found = _from_config_file(plugin.auth_config, registry)
        if found is not None:
            return found
    if plugin.auth_helper:
        return _from_helper(plugin.auth_helper, registry)
    return None


def _keys(registry: str) -> list[str]:
    keys = [registry, f"https://{registry}", f"http://{registry}", f"https://{registry}/v1/", f"https://{registry}/v2/"]
    if registry == "docker.io":
        keys += ["https://index.docker.io/v1/", "index.docker.io"]
    return keys


def _from_config_file(path: str, registry: str) -> dict[str, str] | None:
    try:
        with open(path, "rb") as fh:
            data: Any = json.load(fh)
    except OSError as err:
        raise AuthLookupError(
            f"cannot read the docker auth config file {path!r} (auth.config): {err.strerror}"
        ) from None
    except ValueError:
        raise AuthLookupError(f"the docker auth config file {path!r} (auth.config) is not valid JSON") from None
    if not isinstance(data, dict):
        raise AuthLookupError(f"the docker auth config file {path!r} (auth.config) is not a JSON object")
    auths = data.get("auths") or {}
    for key in _keys(registry):
        entry = auths.get(key)
        if not isinstance(entry, dict):
            continue
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise AuthLookupError(
                    f"the docker auth config file {path!r} has an auth entry for {registry} that is not "
                    "base64 of user:password"
                ) from None
            return {"username": user, "password": password, "serveraddress": registry}
        if entry.get("username"):
            return {
                "username": str(entry["username"]),
                "password": str(entry.get("password", "")),
                "serveraddress": registry,
            }
    helpers = data.get("credHelpers") or {}
    for key in _keys(registry):
        if helpers.get(key):
            return _from_helper(str(helpers[key]), registry)
    if data.get("credsStore"):
        return _from_helper(str(data["credsStore"]), registry)
    return None


def _from_helper(helper: str, registry: str) -> dict[str, str] | None:
    program = HELPER_PREFIX + helper
    try:
        proc = subprocess.run(
            [program, "get"],
            input=registry.encode(),
            capture_output=True,
            timeout=HELPER_TIMEOUT,
            env=os.environ.copy(),
            check=False,
        )
    except FileNotFoundError:
        raise AuthLookupError(
            f"the docker credential helper {program!r} (auth.helper) is not on the plugin's PATH"
        ) from None
    except subprocess.TimeoutExpired:
        raise AuthLookupError(
            f"the docker credential helper {program!r} did not answer within {HELPER_TIMEOUT:.0f}s"
        ) from None
    out = proc.stdout.decode(errors="replace").strip()
    if proc.returncode != 0:
        if "credentials not found" in out.lower():
            return None
        detail = out or proc.stderr.decode(errors="replace").strip()
        raise AuthLookupError(
            f"the docker credential helper {program!r} failed for {registry} (exit {proc.returncode}): {detail[:200]}"
        )
    try:
        creds = json.loads(out)
        username, secret = str(creds["Username"]), str(creds["Secret"])
    except (ValueError, KeyError, TypeError):
        raise AuthLookupError(
            f"the docker credential helper {program!r} did not answer with JSON {{Username, Secret}}"
        ) from None
    return {"username": username, "password": secret, "serveraddress": registry}
