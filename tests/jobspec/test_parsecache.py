"""The HCL parsers are built once per process and their tables kept in a private cache dir: a
second parse builds nothing, a later process reads the tables instead of computing them, and a
cache that is damaged, tampered with, foreign or unwritable only means building afresh."""

from __future__ import annotations

import os
import pickle
import stat
from collections.abc import Iterator
from pathlib import Path

import hcl
import pytest
from hcl.ply import yacc
from hcl2.parser import parser as hcl2_reference

from driversdk.jobspec import parsecache

ROOT = Path(__file__).resolve().parents[2]
AGENT = """
data_dir = "/tmp/data"
"docker.privileged.enabled" = "true"
client {
  enabled = true
  meta { rack = "r1" }
}
plugin "docker" {
  config {
    gc { image = false }
    volumes { enabled = true }
  }
}
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh cache dir, and parsers not built yet in this process."""
    directory = tmp_path / "cache"
    monkeypatch.setenv(parsecache.ENV_CACHE_DIR, str(directory))
    parsecache._hcl1_parser.cache_clear()
    parsecache.hcl2_parser.cache_clear()
    yield directory
    parsecache._hcl1_parser.cache_clear()
    parsecache.hcl2_parser.cache_clear()


@pytest.fixture
def table_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts PLY computing the HCL1 tables (what the cache saves)."""
    builds: list[int] = []
    real = yacc.yacc

    def counted(*args: object, **kwargs: object) -> object:
        builds.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(yacc, "yacc", counted)
    return builds


def new_process() -> None:
    """What a later process starts with: the cache dir as left, nothing built in memory."""
    parsecache._hcl1_parser.cache_clear()
    parsecache.hcl2_parser.cache_clear()


def hcl2_texts() -> list[str]:
    files = sorted(ROOT.glob("tests/**/*.hcl")) + sorted(ROOT.glob("examples/**/*.hcl"))
    assert files
    return [f.read_text() + "\n" for f in files]


def test_hcl1_is_built_once_per_process_then_read_from_the_cache(cache: Path, table_builds: list[int]) -> None:
    expected = hcl.loads(AGENT)
    table_builds.clear()
    assert parsecache.hcl1_loads(AGENT) == expected
    assert parsecache.hcl1_loads('a = "b"\n') == {"a": "b"}
    assert parsecache.hcl1_loads('{"a": 1}') == {"a": 1}  # JSON, as hcl.loads reads it
    assert table_builds == [1]  # the second parse reused the parser
    new_process()
    assert parsecache.hcl1_loads(AGENT) == expected
    assert table_builds == [1]  # the tables came from the cache file
    with pytest.raises(ValueError):
        parsecache.hcl1_loads("a = \n")  # syntax errors as pyhcl raises them


def test_the_cache_dir_and_files_are_private(cache: Path) -> None:
    parsecache.hcl1_loads(AGENT)
    parsecache.hcl2_parser()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    for name in (parsecache.HCL1_FILE, parsecache.HCL2_FILE):
        assert stat.S_IMODE((cache / name).stat().st_mode) == 0o600
    assert sorted(p.name for p in cache.iterdir()) == sorted([parsecache.HCL1_FILE, parsecache.HCL2_FILE])


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other-version", "bad-action"])
def test_a_damaged_hcl1_cache_falls_back_to_a_fresh_build(cache: Path, table_builds: list[int], damage: str) -> None:
    expected = hcl.loads(AGENT)
    parsecache.hcl1_loads(AGENT)
    path = cache / parsecache.HCL1_FILE
    key, _, payload = path.read_bytes().partition(b"\n")
    if damage == "truncated":
        path.write_bytes(key + b"\n" + payload[: len(payload) // 2])
    elif damage == "garbage":
        path.write_bytes(key + b'\n{"action": 5}')
    elif damage == "other-version":
        path.write_bytes(b"0" * len(key) + b"\n" + payload)
    else:  # a production naming something that is not a grammar action
        path.write_bytes(key + b"\n" + payload.replace(b'"p_', b'"__init__', 1))
    new_process()
    table_builds.clear()
    assert parsecache.hcl1_loads(AGENT) == expected
    assert table_builds == [1]
    # ... and the file is whole again for the next process.
    new_process()
    assert parsecache.hcl1_loads(AGENT) == expected
    assert table_builds == [1]


def test_a_cache_dir_open_to_others_is_not_read(cache: Path, table_builds: list[int]) -> None:
    parsecache.hcl1_loads(AGENT)
    os.chmod(cache, 0o777)
    new_process()
    table_builds.clear()
    parsecache.hcl1_loads(AGENT)
    assert table_builds == [1]


def test_a_file_writable_by_others_is_not_read(cache: Path, table_builds: list[int]) -> None:
    parsecache.hcl1_loads(AGENT)
    os.chmod(cache / parsecache.HCL1_FILE, 0o666)
    new_process()
    table_builds.clear()
    parsecache.hcl1_loads(AGENT)
    assert table_builds == [1]


def test_a_symlinked_cache_dir_is_not_used(cache: Path, tmp_path: Path, table_builds: list[int]) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    cache.symlink_to(real)
    parsecache.hcl1_loads(AGENT)
    assert list(real.iterdir()) == []
    new_process()
    table_builds.clear()
    parsecache.hcl1_loads(AGENT)
    assert table_builds == [1]


def test_an_unwritable_cache_location_still_parses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, table_builds: list[int]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(parsecache.ENV_CACHE_DIR, str(blocker / "cache"))  # cannot be created
    new_process()
    try:
        assert parsecache.hcl1_loads(AGENT) == hcl.loads(AGENT)
        assert parsecache.hcl2_parser().parse("a = 1\n") == hcl2_reference().parse("a = 1\n")
    finally:
        new_process()


def test_hcl2_parser_from_the_cache_parses_as_python_hcl2s(cache: Path) -> None:
    hcl2_reference().parse("a = 1\n")  # a parser that has lexed holds compiled patterns: they pickle too
    first = parsecache.hcl2_parser()
    assert parsecache.hcl2_parser() is first  # once per process
    assert (cache / parsecache.HCL2_FILE).exists()
    new_process()
    cached = parsecache.hcl2_parser()
    assert cached is not first  # this one was unpickled
    reference = hcl2_reference()
    for text in hcl2_texts():
        assert cached.parse(text) == reference.parse(text)


class _Marker:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.mkdir, (MARKER[0],))


MARKER: list[str] = [""]


@pytest.mark.parametrize("damage", ["truncated", "code", "not-a-parser"])
def test_a_damaged_or_tampered_hcl2_cache_is_not_used(cache: Path, tmp_path: Path, damage: str) -> None:
    parsecache.hcl2_parser()
    path = cache / parsecache.HCL2_FILE
    key, _, payload = path.read_bytes().partition(b"\n")
    MARKER[0] = str(tmp_path / "ran")
    if damage == "truncated":
        path.write_bytes(key + b"\n" + payload[: len(payload) // 2])
    elif damage == "code":  # a pickle that would run a function when loaded
        path.write_bytes(key + b"\n" + pickle.dumps(_Marker()))
    else:
        path.write_bytes(key + b"\n" + pickle.dumps({"a": 1}))
    new_process()
    rebuilt = parsecache.hcl2_parser()
    assert not os.path.exists(MARKER[0])
    assert rebuilt.parse('job "x" {}\n') == hcl2_reference().parse('job "x" {}\n')
    # Written again, whole: the next process loads it.
    new_process()
    assert parsecache.read(parsecache.HCL2_FILE, key.decode()) is not None
    assert parsecache.hcl2_parser().parse("a = 1\n") == hcl2_reference().parse("a = 1\n")
