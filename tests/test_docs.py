"""The commands of README.md and docs/*.md run as written.

Every fenced ``sh``/``shell``/``bash``/``console`` block carries a marker in the HTML comments just
above it: ``<!-- run: in=tmp|repo [exit=0,1] -->`` runs the block here through the installed console
scripts (``in=tmp``: one fresh directory per file, shared by its blocks in order, so a block may use
the files an earlier one wrote; ``in=repo``: the checkout), or ``<!-- not-run: why -->`` says why
the test cannot run it. A block without either fails the test, so no command can drift unnoticed.
``background=TEXT`` runs a block that does not end by itself (``driversdk agent``) in the background
of the file's later blocks, which start once its output shows ``TEXT``; after the file's last block
it gets SIGTERM and must exit with a code in ``exit``. Every block sees a ``TMPDIR`` of the test's
own, so a ``-dev`` agent's data dir is the test's too.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHELL_LANGS = {"sh", "shell", "bash", "console"}
FIRST_JOB_HEADING = "## Your first job"
FIRST_JOB_BEFORE_LINE = 120


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    body: str
    markers: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def marker(self, kind: str) -> str | None:
        found = [m[len(kind) + 1 :].strip() for m in self.markers if m.startswith(kind + ":")]
        return found[0] if found else None


def doc_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        markers: list[str] = []
        j = i - 1
        while j >= 0 and (lines[j].startswith("<!--") or not lines[j].strip()):
            comment = re.match(r"^<!--\s*(.*?)\s*-->$", lines[j].strip())
            if comment:
                markers.append(comment.group(1))
            j -= 1
        found.append(Block(path, i + 1, fence.group(1), "\n".join(lines[i + 1 : end]) + "\n", markers))
        i = end + 1
    return found


def shell_blocks() -> list[Block]:
    return [b for p in doc_files() for b in blocks(p) if b.lang in SHELL_LANGS]


def test_every_command_block_is_run_or_says_why_not() -> None:
    unmarked = [
        b.where
        for b in shell_blocks()
        if (b.marker("run") is None) == (b.marker("not-run") is None) or b.marker("not-run") == ""
    ]
    assert not unmarked, f"command blocks without exactly one <!-- run: … --> / <!-- not-run: why -->: {unmarked}"
    assert any(b.marker("run") is not None for b in shell_blocks())


def run_options(spec: str) -> tuple[str, set[int], str | None]:
    opts = dict(part.split("=", 1) for part in spec.split())
    assert set(opts) <= {"in", "exit", "background"} and opts.get("in") in {"tmp", "repo"}, f"bad run marker: {spec!r}"
    return opts["in"], {int(code) for code in opts.get("exit", "0").split(",")}, opts.get("background")


@dataclass
class Background:
    block: Block
    proc: subprocess.Popen[bytes]
    output: Path
    codes: set[int]

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def wait_for(self, ready: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while ready not in self.text():
            assert self.proc.poll() is None, f"{self.block.where} exited {self.proc.returncode}:\n{self.text()}"
            assert time.monotonic() < deadline, f"{self.block.where} never printed {ready!r}:\n{self.text()}"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"{self.block.where} did not exit within 60 s of SIGTERM:\n{self.text()}") from None
        assert code in self.codes, f"{self.block.where} exited {code} after SIGTERM:\n{self.text()}"
        assert "Traceback" not in self.text(), f"{self.block.where}:\n{self.text()}"


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_commands_run(doc: Path, tmp_path: Path) -> None:
    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "HOME": str(tmp_path / "home"),
           "TMPDIR": str(tmp_path / "tmp")}  # fmt: skip
    env = {k: v for k, v in env.items() if not k.startswith("NOMAD_")}
    (tmp_path / "home").mkdir()
    (tmp_path / "tmp").mkdir()
    workdir = tmp_path / "work"
    workdir.mkdir()
    background: list[Background] = []
    try:
        for block in blocks(doc):
            spec = block.marker("run")
            if block.lang not in SHELL_LANGS or spec is None:
                continue
            where, codes, ready = run_options(spec)
            cwd = workdir if where == "tmp" else ROOT
            argv = ["bash", "-e", "-o", "pipefail", "-c", block.body]
            if ready is not None:
                output = tmp_path / f"background-{block.line}.out"
                with open(output, "wb") as out_file:
                    proc = subprocess.Popen(argv, stdout=out_file, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                            start_new_session=True)  # fmt: skip
                background.append(Background(block, proc, output, codes))
                background[-1].wait_for(ready)
                continue
            done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=60)
            out = done.stdout + done.stderr
            assert done.returncode in codes, f"{block.where} exited {done.returncode}:\n{block.body}\n{out}"
            assert "Traceback" not in out, f"{block.where}:\n{out}"
    finally:
        for started in reversed(background):
            started.stop()
    if doc == README:
        data = workdir / "data"
        leftovers = list((data / "allocs").iterdir()) if (data / "allocs").exists() else []
        assert leftovers == [], f"the first job's data dir keeps {leftovers} after `system gc`"


def test_first_job_comes_within_the_first_lines() -> None:
    lines = README.read_text().splitlines()
    assert FIRST_JOB_HEADING in lines, f"README.md has no {FIRST_JOB_HEADING!r} section"
    start = lines.index(FIRST_JOB_HEADING) + 1
    assert start < FIRST_JOB_BEFORE_LINE, f"{FIRST_JOB_HEADING!r} starts at line {start}"
    first_run = next(n for n, line in enumerate(lines, 1) if line.startswith("driversdk run "))
    assert first_run < FIRST_JOB_BEFORE_LINE, f"the first `driversdk run` is at line {first_run}"
    first_block = next(b for b in blocks(README) if b.line > start and b.lang in SHELL_LANGS)
    assert first_block.marker("run") is not None, "the first job's commands are run by this test"


def test_links_stay_inside_the_repository() -> None:
    bad = []
    for doc in doc_files():
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"^[a-z]+://", target):
                continue
            resolved = Path(os.path.normpath(doc.parent / target))
            if not resolved.is_relative_to(ROOT) or not resolved.exists():
                bad.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not bad, f"links that leave the repository or lead nowhere: {bad}"


def test_no_install_of_an_unpublished_package() -> None:
    # driversdk is not on PyPI: install from a checkout or a built wheel.
    for block in shell_blocks():
        offered = re.findall(r"pip install +['\"]?driversdk\b", block.body)
        assert not offered, f"{block.where} offers {offered}, but driversdk is not published"
