"""What the agent's verbs (`job status`, `node status`, ...) import: the standard library they need
and their own few modules, nothing more. Each of these is a round trip of a few milliseconds, and a
module imported on the way (typing, shutil and its compressors, urllib.parse, every other command's
module) costs more than the agent's answer; a later import must not bring that back unnoticed.

The CLI runs as its console script does (``entry()``), in a fresh interpreter without site (``-S``:
the dev install's .pth files load modules of their own) from the source tree, and reports the
modules it added to ``sys.modules`` from its exit handlers (entry() runs them before leaving)."""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.agentproc import ROOT, AgentProcess

WRAPPER = (
    "import atexit, sys\n"
    "before = set(sys.modules)\n"
    "atexit.register(lambda: sys.stderr.write('MODULES ' + repr(sorted(set(sys.modules) - before)) + '\\n'))\n"
    "from driversdk.cli import entry\n"
    "entry()\n"
)

# Neither the verbs nor their answers need any of these; each is a measurable part of a round trip.
UNWANTED = (
    "typing",
    "shutil",
    "zlib",
    "bz2",
    "lzma",
    "urllib",
    "threading",
    "dataclasses",
    "socket",  # the C module _socket is enough for a unix socket or plain HTTP
    "selectors",
    "ssl",
    "tempfile",
    "subprocess",
    "grpc",
    "google",
    "driversdk.jobspec",
    "driversdk.agent",
    "driversdk.client",
    "driversdk.cli.volume",
    "driversdk.cli.plugins",
    "driversdk.cli.runagent",
    "driversdk.cli.jobfile",
    "driversdk.cli.datadir",
    "driversdk.cli.common",
)


def _run(agent: AgentProcess | None, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    env = {k: v for k, v in os.environ.items() if k not in ("NOMAD_ADDR", "NOMAD_TOKEN", "PYTHONPATH")}
    if agent is not None:
        env["NOMAD_ADDR"] = agent.address
    done = subprocess.run([sys.executable, "-S", "-c", WRAPPER, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.startswith("MODULES ")]
    assert len(lines) == 1, done.stderr
    modules = set(ast.literal_eval(lines[0].removeprefix("MODULES ")))
    return done, modules


def _unwanted(modules: set[str]) -> set[str]:
    return {m for m in modules if any(m == u or m.startswith(u + ".") for u in UNWANTED)}


def test_the_wrapper_sees_a_bare_interpreter() -> None:
    """Without site the interpreter starts with none of the unwanted modules: their absence after a
    verb is the verb's doing, not an accident of what was loaded before it."""
    done = subprocess.run([sys.executable, "-S", "-c", "import sys; print(sorted(sys.modules))"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert _unwanted(set(ast.literal_eval(done.stdout))) == set()


@pytest.mark.parametrize(
    ("args", "code", "out"),
    [
        (("job", "status"), 0, "No running jobs\n"),
        (("job", "status", "-json"), 0, "[]\n"),
        (("job", "status", "nosuchjob"), 1, ""),
        (("node", "status"), 0, None),
        (("alloc", "status", "0000"), 1, ""),
    ],
)
def test_an_agent_verb_imports_only_what_it_needs(
    agent: AgentProcess, args: tuple[str, ...], code: int, out: str | None
) -> None:
    done, modules = _run(agent, *args)
    assert done.returncode == code, done.stderr
    if out is not None:
        assert done.stdout == out
    assert "driversdk.cli.apiclient" in modules  # it did talk to the agent
    assert _unwanted(modules) == set(), sorted(modules)


def test_the_check_sees_a_command_that_loads_them(tmp_path: Path) -> None:
    """`driversdk validate` needs the jobspec (HCL): the same check finds it, so it can fail."""
    job = tmp_path / "j.hcl"
    job.write_text('job "j" {\n  group "g" {\n    task "t" {\n      driver = "raw_exec"\n'
                   '      config {\n        command = "/bin/true"\n      }\n    }\n  }\n}\n')  # fmt: skip
    done, modules = _run(None, "validate", str(job))
    assert "driversdk.jobspec" in _unwanted(modules), done.stderr


def test_a_refused_verb_line_shows_the_whole_usage(agent: AgentProcess) -> None:
    """A verb's line refused at the top level shows every command in its usage, as before the verb's
    parser was built alone."""
    done, _ = _run(agent, "job", "status", "a", "b")
    assert done.returncode == 2
    usage, error = done.stderr.split("\nMODULES ")[0].rsplit("\n", 1)
    assert usage.startswith("usage: driversdk [-h] [--client FILE] [--data-dir DIR] [--version] [--debug]")
    assert "{plugin,validate,run,agent,job,alloc,node,acl,status,logs,system,volume}" in usage
    assert error == "driversdk: error: unrecognized arguments: b"


LINES = [
    ["job", "status"],
    ["--debug", "--data-dir", "/d", "job", "status", "web", "-verbose"],
    ["--client=/c.hcl", "job", "stop", "-purge", "web", "-address", "unix:///s"],
    ["alloc", "logs", "abcd", "t", "-n", "3", "-f"],
    ["node", "status", "-json"],
    ["acl", "bootstrap", "-token", "x"],
    ["volume", "status", "vol", "--json"],
    ["plugin", "status"],
    ["logs", "web", "-n", "2"],
    ["job", "status", "--help"],
    ["alloc", "logs", "--help"],
    ["job", "status", "a", "b"],
    ["job"],
    ["alloc", "logs", "x", "-n", "-1"],
]


@pytest.mark.parametrize("argv", LINES, ids=" ".join)
def test_one_commands_parser_reads_a_line_as_the_whole_one_does(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The parser of the command alone gives the same arguments, help and refusals as every command's."""
    from driversdk.cli import _command_word, build_parser

    assert _command_word(argv) == next(w for w in argv if not w.startswith("-") and w[0] != "/")

    def parse(parser: argparse.ArgumentParser) -> tuple[object, str, str]:
        try:
            # A parser kept in the arguments (to refuse a combination later) is a new one each time.
            parsed = vars(parser.parse_args(argv)).items()
            result: object = {k: v.prog if isinstance(v, argparse.ArgumentParser) else v for k, v in parsed}
        except SystemExit as exit:
            result = ("exit", exit.code)
        out = capsys.readouterr()
        return result, out.out, out.err

    assert parse(build_parser(_command_word(argv))) == parse(build_parser())
