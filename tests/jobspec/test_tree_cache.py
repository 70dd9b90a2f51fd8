"""A parsed job file's tree is kept on disk: the next command that reads the same text evaluates
it exactly as a fresh parse would, without importing lark or python-hcl2; a different text, a
damaged or planted file, or a cache dir open to others means parsing afresh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from driversdk.jobspec import parsecache
from driversdk.jobspec.hcl import evaluator
from driversdk.jobspec.hcl.document import Document, evaluate
from driversdk.jobspec.hcl.evaluator import Body, HCLSyntaxError, parse
from driversdk.jobspec.hcl.tree import Tree, TreeFormatError, from_plain, to_plain

ROOT = Path(__file__).resolve().parents[2]
JOB = 'locals {\n  n = 2 * 3\n}\njob "tree-cache" {\n  group "g" {\n    count = local.n\n  }\n}\n'


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "cache"
    monkeypatch.setenv(parsecache.ENV_CACHE_DIR, str(directory))
    evaluator._parse_text.cache_clear()
    yield directory
    evaluator._parse_text.cache_clear()


def summary(doc: Document) -> tuple[object, ...]:
    """All a Document says, lines of blocks and attributes included, in comparable form."""

    def lines(value: object) -> object:
        if isinstance(value, Body):
            return (dict(value.lines), value.line, {k: lines(v) for k, v in value.items()})
        if isinstance(value, list):
            return [lines(v) for v in value]
        if isinstance(value, dict):
            return {k: lines(v) for k, v in value.items()}
        return value

    return (lines(doc.body), [str(e) for e in doc.errors], doc.warnings, doc.variables, doc.locals)


def tree_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"{parsecache.TREE_PREFIX}*.json"))


def job_files() -> list[Path]:
    files = sorted(ROOT.glob("tests/**/*.hcl")) + sorted(ROOT.glob("examples/**/*.hcl"))
    assert len(files) > 20
    return files


def test_every_job_file_evaluates_the_same_from_its_kept_tree(cache: Path) -> None:
    for path in job_files():
        text = path.read_text()
        try:
            fresh = evaluate(str(path), text)
        except HCLSyntaxError:
            continue  # a fixture that is not HCL on purpose
        evaluator._parse_text.cache_clear()  # the next command: only the disk has the tree
        again = evaluate(str(path), text)
        assert summary(again) == summary(fresh), path
    assert tree_files(cache)


def test_a_tree_round_trips_through_its_file_format(cache: Path) -> None:
    for path in job_files():
        try:
            tree = parse(path.read_text())
        except HCLSyntaxError:
            continue
        assert from_plain(json.loads(json.dumps(to_plain(tree)))) == tree, path


def test_a_kept_tree_spares_the_next_process_lark_and_python_hcl2(cache: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.hcl"
    job.write_text(JOB)
    probe = (
        "import sys\n"
        "from driversdk.jobspec.hcl.document import evaluate\n"
        f"doc = evaluate({str(job)!r}, open({str(job)!r}).read())\n"
        "count = doc.body['job'][0]['tree-cache']['group'][0]['g']['count']\n"
        "print(count, 'lark' in sys.modules, 'hcl2' in sys.modules)\n"
    )
    env = {**os.environ, parsecache.ENV_CACHE_DIR: str(cache), "PYTHONPATH": str(ROOT)}
    first = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    second = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert first.stdout.split() == ["6", "True", "True"]
    assert second.stdout.split() == ["6", "False", "False"]


def test_an_edited_file_is_parsed_afresh(cache: Path) -> None:
    assert evaluate("job.hcl", JOB).locals == {"n": 6}
    evaluator._parse_text.cache_clear()
    edited = JOB.replace("2 * 3", "2 * 4")
    assert evaluate("job.hcl", edited).locals == {"n": 8}
    assert len(tree_files(cache)) == 2


def _planted(header: bytes, payload: bytes) -> bytes:
    # A well-formed tree of another text under this text's name: the key in the file's first line
    # is the text's, so only someone who can write the private dir could plant it, and the file
    # must not be writable by others; the test makes it so, and it must be refused.
    return header + b"\n" + json.dumps(to_plain(parse('locals {\n  n = 1\n}\njob "x" {}\n'))).encode()


# Each damage: what the kept tree file becomes, from its key line and its payload.
TREE_DAMAGES: dict[str, Callable[[bytes, bytes], bytes]] = {
    "truncated": lambda header, payload: header + b"\n" + payload[: len(payload) // 2],
    "not-json": lambda header, payload: header + b"\n{not json",
    "wrong-shape": lambda header, payload: header + b'\n["body", "one", 0, 0]',
    "planted-tree": _planted,
    "other-key": lambda header, payload: b"0" * 64 + b"\n" + payload,
}


@pytest.mark.parametrize("damage", sorted(TREE_DAMAGES))
def test_a_damaged_or_planted_tree_is_not_used(cache: Path, damage: str) -> None:
    assert evaluate("job.hcl", JOB).locals == {"n": 6}
    (path,) = tree_files(cache)
    header, _, payload = path.read_bytes().partition(b"\n")
    path.write_bytes(TREE_DAMAGES[damage](header, payload))
    if damage == "planted-tree":
        path.chmod(0o666)
    evaluator._parse_text.cache_clear()
    doc = evaluate("job.hcl", JOB)
    assert doc.locals == {"n": 6} and not doc.errors


def test_a_cache_dir_open_to_others_is_neither_read_nor_written(cache: Path) -> None:
    cache.mkdir(mode=0o700)
    assert evaluate("job.hcl", JOB).locals == {"n": 6}
    (path,) = tree_files(cache)
    planted = path.read_bytes().partition(b"\n")[0] + b'\n["start_0", 0, -1, -1]'  # an empty body
    path.write_bytes(planted)
    cache.chmod(0o777)
    evaluator._parse_text.cache_clear()
    assert evaluate("job.hcl", JOB).locals == {"n": 6}
    assert parsecache.read_tree(JOB) is None
    assert path.read_bytes() == planted  # the fresh parse was not written there either


def test_only_the_newest_trees_are_kept(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parsecache, "KEPT_LIMIT", 3)
    texts = [f'job "j{i}" {{}}\n' for i in range(5)]
    for i, text in enumerate(texts):
        evaluate("job.hcl", text)
        (newest,) = [
            p for p in tree_files(cache) if p.stat().st_mtime_ns == max(q.stat().st_mtime_ns for q in tree_files(cache))
        ]
        os.utime(newest, ns=(i * 10**9, i * 10**9))  # written one after another, a second apart
    assert len(tree_files(cache)) == 3
    assert parsecache.read_tree(texts[0]) is None and parsecache.read_tree(texts[1]) is None
    assert all(isinstance(parsecache.read_tree(t), Tree) for t in texts[2:])


def test_syntax_errors_are_not_kept(cache: Path) -> None:
    with pytest.raises(HCLSyntaxError):
        parse('job "x" {\n  = broken\n', keep=True)
    assert not tree_files(cache)


def test_from_plain_refuses_what_to_plain_never_writes() -> None:
    for bad in ([], ["body"], ["body", "1", 0, 0], [1, 2, 3, 4], ["body", 1, 0, 0, ["T", "x", "1"]], "x"):
        with pytest.raises(TreeFormatError):
            from_plain(bad)
