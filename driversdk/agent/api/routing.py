"""The agent's route table: the endpoint modules (``routes``, ``csiroutes``) register their
handlers with :func:`route`, and :func:`driversdk.agent.api.routes.handle` matches a request against
:data:`ROUTES` in registration order."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from driversdk.agent.api.httpserver import Request, Response

if TYPE_CHECKING:
    from driversdk.agent.agent import Agent

Route = Callable[["Agent", Request, re.Match[str]], Response]
ROUTES: list[tuple[re.Pattern[str], dict[str, Route]]] = []


def route(pattern: str, *methods: str) -> Callable[[Route], Route]:
    compiled = re.compile(pattern + r"/?\Z")

    def register(fn: Route) -> Route:
        for existing, table in ROUTES:
            if existing.pattern == compiled.pattern:
                table.update(dict.fromkeys(methods, fn))
                return fn
        ROUTES.append((compiled, dict.fromkeys(methods, fn)))
        return fn

    return register
