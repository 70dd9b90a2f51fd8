"""The bundled drivers asked in this process, for checks only.

``driversdk validate`` asks each driver a job uses for its config schema, its verdict on the
plugin config, its capabilities, its task schema and one fingerprint, and never starts a task.
For a driver that ships with driversdk (docker, exec, raw_exec) at its bundled command, the same
code answers here, as a Nomad client runs its built-in drivers inside itself: no second
interpreter to boot, no gRPC, no plugin process to leave behind. What goes over the wire between
a host and a plugin is kept where it matters: the plugin config is msgpack-encoded with the
driver's own schema and decoded again, so the driver sees exactly what SetConfig would hand it,
and a failed call reads as the plugin's status would.

``driversdk run`` still launches every plugin, bundled or not: its tasks need the plugin process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from driversdk.bundled import bundled_driver
from driversdk.errors import ConfigError, DriverError, DriverSDKError, PluginCallError, PluginError
from driversdk.hclspec import Spec, decode, encode
from driversdk.jobspec.clientconfig import ClientConfig
from driversdk.model import AgentConfig, Attribute, Capabilities, Fingerprint

if TYPE_CHECKING:
    from driversdk.driver import DriverPlugin

T = TypeVar("T")


def answers_here(client: ClientConfig, driver: str) -> bool:
    """Whether a check of ``driver`` is answered in this process: a bundled driver that the
    client config leaves at its bundled command (a plugin_dir binary or a ``command`` of the
    operator's own is launched as the plugin it is)."""
    return client.runs_bundled(driver)


class InProcessDriver:
    """A bundled driver built in this process for checks; :meth:`kill` shuts it down."""

    def __init__(self, name: str) -> None:
        self.name = name
        bundled = bundled_driver(name)
        if bundled is None:
            raise PluginError(f"{name} is not a bundled driver of this driversdk installation")
        # The module of its plugin's entry point, imported from where driversdk is; its
        # build(for_checks=...) makes the driver.
        build: Callable[..., DriverPlugin] = bundled.load().build
        try:
            self._driver = build(for_checks=True)
        except DriverSDKError:
            raise  # e.g. a missing extra: its sentence says what to install
        except Exception as err:
            raise PluginCallError(
                f"the bundled {name} driver could not be built: {err}", code="INTERNAL", call="build"
            ) from None

    def _ask(self, call: str, fn: Callable[[], T]) -> T:
        """``fn``'s answer; a failure worded as the plugin's status would word it."""
        try:
            return fn()
        except DriverError as err:
            code = "INVALID_ARGUMENT" if isinstance(err, ConfigError) else "INTERNAL"
            raise PluginCallError(str(err), code=code, call=call) from None
        except ValueError as err:
            raise PluginCallError(str(err), code="INVALID_ARGUMENT", call=call) from None
        except Exception as err:
            raise PluginCallError(f"{call} failed: {err}", code="INTERNAL", call=call) from None

    def config_schema(self) -> Spec | None:
        return self._ask("ConfigSchema", self._driver.config_schema)

    def set_config(self, config: Mapping[str, Any] | None = None, agent: AgentConfig | None = None) -> None:
        spec = self.config_schema()
        what = f"{self.name} plugin config"
        decoded: dict[str, Any] = {}
        if spec is not None:
            # Encoded as the host encodes it for SetConfig, decoded as the plugin decodes it.
            data = encode(spec, dict(config or {}), what=what)
            decoded = self._ask("SetConfig", lambda: decode(spec, data, what=what))
        elif config:
            raise ConfigError(f"the {self.name} plugin takes no config block; remove its config {{}}")
        self._ask("SetConfig", lambda: self._driver.set_config(decoded, agent))

    def capabilities(self) -> Capabilities:
        return self._ask("Capabilities", self._driver.capabilities)

    def task_config_schema(self) -> Spec:
        return self._ask("TaskConfigSchema", self._driver.task_config_schema)

    def fingerprint(self) -> Iterator[Fingerprint]:
        fp = self._ask("Fingerprint", self._driver.fingerprint)
        # As the wire carries them: every attribute an Attribute, its value a bool, number or text.
        yield replace(fp, attributes={k: Attribute.of(v) for k, v in fp.attributes.items()})

    def kill(self) -> None:
        """The driver's shutdown hook (its reconciler stops); never raises, as killing a plugin does not."""
        try:
            self._driver.shutdown()
        except Exception:  # a failing hook must not hide the checks' verdict
            pass
