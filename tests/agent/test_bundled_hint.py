"""A checkout that was never installed has no entry points, so no bundled driver: the sentence
names the reinstall instead of telling the operator to configure a plugin for "exec"."""

from __future__ import annotations

import pytest

from driversdk import bundled


def test_a_bundled_name_missing_from_the_registry_names_the_reinstall(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundled, "bundled_drivers", dict)
    hint = bundled.reinstall_hint("exec")
    assert "no bundled drivers" in hint and "pip install -e '.[all]'" in hint


def test_an_installed_registry_or_a_third_party_name_adds_nothing() -> None:
    assert bundled.bundled_drivers(), "this test run expects driversdk installed with its entry points"
    assert bundled.reinstall_hint("exec") == ""
    assert bundled.reinstall_hint("podman") == ""
