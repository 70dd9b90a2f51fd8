"""Fixtures for the attacker's tests: each test plays a hostile job, task, volume or user."""

from __future__ import annotations

from tests.agent.conftest import engine, short_dir

__all__ = ["engine", "short_dir"]
