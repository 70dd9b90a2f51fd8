"""An agent config's parsed value is kept in the private cache dir: the next command that reads
the same text gets the same value without importing pyhcl, an edited text is parsed afresh, a
syntax error is never kept, and a kept file that is damaged, planted or foreign is not read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import hcl
import pytest

from driversdk.jobspec import parsecache
from driversdk.jobspec.clientconfig import load_client

ROOT = Path(__file__).resolve().parents[2]
# The parser builder itself: the ``parses`` fixture puts a counting one in its place.
BUILD_PARSER = parsecache._hcl1_parser
AGENT = """
data_dir = "/tmp/data"
client {
  enabled = true
  meta { rack = "r1" }
  host_volume "certs" {
    path = "/etc/ssl/certs"
    read_only = true
  }
}
plugin "docker" {
  config {
    gc { image = false }
    volumes { enabled = true }
    extra_labels = ["job_name", "task*"]
    pull_activity_timeout = "2m"
  }
}
plugin "raw_exec" {
  config { enabled = true }
}
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "cache"
    monkeypatch.setenv(parsecache.ENV_CACHE_DIR, str(directory))
    BUILD_PARSER.cache_clear()
    yield directory
    BUILD_PARSER.cache_clear()


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text pyhcl's parser really parses in this process."""
    seen: list[str] = []

    def counted() -> object:
        parser = BUILD_PARSER()

        class Counting:
            def parse(self, text: str) -> object:
                seen.append(text)
                return parser.parse(text)

        return Counting()

    monkeypatch.setattr(parsecache, "_hcl1_parser", counted)
    return seen


def kept_files(cache: Path) -> list[Path]:
    return sorted(cache.glob(f"{parsecache.HCL1_RESULT_PREFIX}*.json"))


def agent_texts() -> list[str]:
    files = [ROOT / "examples" / "jobs" / "client.hcl"]
    return [AGENT, 'data_dir = "/x"\n', '{"data_dir": "/from/json"}', *(f.read_text() for f in files)]


@pytest.mark.parametrize("index", range(len(agent_texts())))
def test_the_kept_value_is_what_pyhcl_parses(cache: Path, parses: list[str], index: int) -> None:
    text = agent_texts()[index]
    expected = hcl.loads(text)
    assert parsecache.hcl1_loads(text, keep=True) == expected
    assert len(kept_files(cache)) == 1
    parses.clear()
    assert parsecache.hcl1_loads(text, keep=True) == expected
    assert parses == []  # read back, not parsed


def test_a_later_command_reads_the_client_config_without_pyhcl(cache: Path, tmp_path: Path) -> None:
    config = tmp_path / "client.hcl"
    config.write_text(AGENT)
    probe = textwrap.dedent(
        f"""
        import json, sys
        from driversdk.jobspec.clientconfig import load_client
        client = load_client({str(config)!r})
        print(json.dumps({{"hcl": "hcl" in sys.modules, "plugins": sorted(client.plugins),
                          "data_dir": str(client.data_dir)}}))
        """
    )
    env = {**os.environ, parsecache.ENV_CACHE_DIR: str(cache)}
    first, second = (
        json.loads(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                                  check=True).stdout)
        for _ in range(2)
    )  # fmt: skip
    assert first["hcl"] is True  # parsed, and kept
    assert second["hcl"] is False  # read back: no parser imported
    assert {k: v for k, v in first.items() if k != "hcl"} == {k: v for k, v in second.items() if k != "hcl"}
    assert second["plugins"] == ["docker", "raw_exec"]


def test_an_edited_config_is_parsed_afresh(cache: Path, tmp_path: Path, parses: list[str]) -> None:
    config = tmp_path / "client.hcl"
    config.write_text(AGENT)
    assert load_client(config).plugin_config("docker")["gc"] == {"image": False}
    config.write_text(AGENT.replace("image = false", "image = true"))
    parses.clear()
    assert load_client(config).plugin_config("docker")["gc"] == {"image": True}
    assert len(parses) == 1
    assert len(kept_files(cache)) == 2


def test_a_syntax_error_is_never_kept(cache: Path) -> None:
    with pytest.raises(ValueError):
        parsecache.hcl1_loads("data_dir = \n", keep=True)
    assert kept_files(cache) == []


PLANTED = json.dumps({"data_dir": "/planted", "plugin_dir": "/planted/plugins"}).encode()
# Each damage: what the kept file becomes, from its key line and its payload.
DAMAGES: dict[str, Callable[[bytes, bytes], bytes]] = {
    "not-json": lambda key, payload: key + b"\n" + payload[: len(payload) // 2],
    "a-list": lambda key, payload: key + b"\n[1, 2]",
    "other-key": lambda key, payload: b"0" * len(key) + b"\n" + PLANTED,
    "world-writable": lambda key, payload: key + b"\n" + PLANTED,  # the right key, but anyone could write it
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_or_planted_result_is_not_read(cache: Path, parses: list[str], damage: str) -> None:
    parsecache.hcl1_loads(AGENT, keep=True)
    (path,) = kept_files(cache)
    key, _, payload = path.read_bytes().partition(b"\n")
    path.write_bytes(DAMAGES[damage](key, payload))
    if damage == "world-writable":
        path.chmod(0o666)
    parses.clear()
    assert parsecache.hcl1_loads(AGENT, keep=True) == hcl.loads(AGENT)
    assert parses == [AGENT]


def test_a_cache_dir_open_to_others_is_neither_read_nor_written(cache: Path, parses: list[str]) -> None:
    parsecache.hcl1_loads(AGENT, keep=True)
    (path,) = kept_files(cache)
    key, _, _ = path.read_bytes().partition(b"\n")
    path.write_bytes(key + b"\n" + json.dumps({"data_dir": "/planted"}).encode())
    cache.chmod(0o777)
    parses.clear()
    assert parsecache.hcl1_loads(AGENT, keep=True)["data_dir"] == "/tmp/data"
    assert parses == [AGENT]
    other = 'data_dir = "/other"\n'
    parsecache.hcl1_loads(other, keep=True)
    assert len(kept_files(cache)) == 1  # nothing written into a dir others can write


def test_a_value_json_would_change_is_not_kept(cache: Path) -> None:
    parsecache._keep(parsecache.HCL1_RESULT_PREFIX, "k" * 64, {1: "an int key becomes a string in JSON"})
    parsecache._keep(parsecache.HCL1_RESULT_PREFIX, "k" * 64, {"a": float("nan")})
    assert kept_files(cache) == []


def test_without_keep_nothing_is_kept(cache: Path) -> None:
    parsecache.hcl1_loads(AGENT)
    assert kept_files(cache) == []
