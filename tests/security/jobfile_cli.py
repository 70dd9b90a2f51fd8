"""Running a hostile job file through the real CLI, with memory bounded so a blow-up fails the
test instead of the machine: shared by the job-file tests of tests/security."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The tree whose CLI is run: this one, or (to watch the tests fail on older code) a checkout of it.
CLI_ROOT = Path(os.environ.get("DRIVERSDK_TEST_CLI_ROOT") or ROOT)
ADDRESS_SPACE = 1024**3  # the CLI's whole address space: far more than a real job file needs
GUARD_SECONDS = 120  # only against a hang of the suite: the tests assert exit codes and output


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str

    @property
    def errors(self) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.startswith("error")]


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def job_text(env: str, prelude: str = "") -> str:
    """A raw_exec job whose task env holds ``env`` (``NAME = expr`` lines), at line 9 onwards."""
    return (
        f"{prelude}"
        'job "hostile" {\n'
        '  group "g" {\n'
        '    task "t" {\n'
        '      driver = "raw_exec"\n'
        "      config {\n"
        '        command = "/bin/true"\n'
        "      }\n"
        "      env {\n"
        f"        {env}\n"
        "      }\n"
        "    }\n"
        "  }\n"
        "}\n"
    )


def cli(*args: str, cwd: Path | None = None) -> Outcome:
    env = {**os.environ, "PYTHONPATH": str(CLI_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "driversdk.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd or CLI_ROOT,
        env=env,
        preexec_fn=_bounded,
        timeout=GUARD_SECONDS,
        stdin=subprocess.DEVNULL,
    )
    return Outcome(done.returncode, done.stdout, done.stderr)


def client_file(work: Path) -> Path:
    client = work / "client.hcl"
    client.write_text(f'data_dir = "{work / "data"}"\n')
    return client


def assert_refused(out: Outcome, job: Path, line: int | None, *words: str) -> str:
    """`validate` said one sentence naming the job file and ``line`` (and ``words``), exit 1,
    no traceback."""
    assert out.code == 1, (out.code, out.stdout, out.stderr)
    assert "Traceback" not in out.stdout + out.stderr and "unexpectedly" not in out.stderr, out.stderr
    assert len(out.errors) == 1, out.stdout
    sentence = out.errors[0]
    where = f"{job}:{line}" if line is not None else str(job)
    assert where in sentence, sentence
    for word in words:
        assert word in sentence, sentence
    return sentence


def assert_run_refused(out: Outcome, job: Path, line: int | None) -> None:
    """`run` refused before anything started: exit 2, the sentence on its output, no traceback."""
    assert out.code == 2, (out.code, out.stdout, out.stderr)
    assert "Traceback" not in out.stdout + out.stderr and "unexpectedly" not in out.stderr, out.stderr
    where = f"{job}:{line}" if line is not None else str(job)
    assert where in out.stdout + out.stderr, (out.stdout, out.stderr)
