"""The ``reconcile`` block both process drivers' plugin configs share: whether, how often and
after which grace a plugin removes what killed plugins left half-made (:mod:`.owner`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from driversdk import hclspec as hs
from driversdk.durations import parse_duration
from driversdk.errors import ConfigError

# Nomad's docker dangling-container defaults: a pass every 5 minutes, 5 minutes' grace.
DEFAULT_PERIOD = "5m"
DEFAULT_GRACE = "5m"


def reconcile_spec() -> hs.Spec:
    """The block's schema; named after Nomad docker's gc.dangling_containers, which does the same."""
    return hs.default(
        hs.block(
            hs.obj(
                {
                    "enabled": hs.default(hs.attr("bool"), hs.literal("true")),
                    "period": hs.default(hs.attr("string"), hs.literal(f'"{DEFAULT_PERIOD}"')),
                    "creation_grace": hs.default(hs.attr("string"), hs.literal(f'"{DEFAULT_GRACE}"')),
                }
            )
        ),
        hs.literal(f'{{enabled = true, period = "{DEFAULT_PERIOD}", creation_grace = "{DEFAULT_GRACE}"}}'),
    )


@dataclass(frozen=True)
class ReconcileConfig:
    enabled: bool = True
    period: float = 300.0
    creation_grace: float = 300.0

    @classmethod
    def from_decoded(cls, cfg: dict[str, Any] | None) -> ReconcileConfig:
        block = cfg or {}
        period = parse_duration(block.get("period") or DEFAULT_PERIOD, "plugin config reconcile.period")
        if period <= 0:
            raise ConfigError(f"plugin config reconcile.period {block.get('period')!r} must be longer than 0s")
        grace = parse_duration(block.get("creation_grace") or DEFAULT_GRACE, "plugin config reconcile.creation_grace")
        return cls(enabled=block.get("enabled", True) is not False, period=period, creation_grace=grace)
