"""The attacker writes the job file: its file functions must read nothing of the host.

`driversdk validate` / `run` of a local job let file(), filebase64(), fileexists() and fileset()
read regular files below the job file's directory only: never through a symlink, never ~ or a
path outside, never a device, fifo or /proc file, never more than 1 MiB a file. Each attempt is
refused with one sentence naming the file and line of the call, through the real CLI, with the
CLI's memory bounded. A job evaluated without a policy (what an API would do) reads nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from driversdk.jobspec.hcl import FilePolicy, Inputs, evaluate
from driversdk.jobspec.hcllimits import MAX_READ_FILE_BYTES
from tests.security.jobfile_cli import assert_refused, assert_run_refused, cli, client_file, job_text

SECRET = "root:$6$attacker-wants-this:19000:0:99999:7:::"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A secret file outside the job's directory (as /etc/shadow is)."""
    path = tmp_path / "secret" / "shadow"
    path.parent.mkdir()
    path.write_text(SECRET)
    return path


@pytest.fixture
def jobdir(tmp_path: Path) -> Path:
    path = tmp_path / "jobs"
    path.mkdir()
    return path


def write_job(jobdir: Path, env: str) -> Path:
    job = jobdir / "job.hcl"
    job.write_text(job_text(env))
    return job


REFUSED = [
    pytest.param('file("/etc/shadow")', "outside the job file's directory", id="etc-shadow"),
    pytest.param('file("/proc/self/environ")', "outside the job file's directory", id="proc-environ"),
    pytest.param('file("~/.bashrc")', "starts with ~", id="home"),
    pytest.param('file("../secret/shadow")', "outside the job file's directory", id="dotdot-escape"),
    pytest.param('file("sub/../../secret/shadow")', "outside the job file's directory", id="dotdot-inside"),
    pytest.param('file("/dev/zero")', "outside the job file's directory", id="dev-zero"),
    pytest.param('filebase64("/etc/shadow")', "outside the job file's directory", id="filebase64"),
    pytest.param('fileexists("/etc/shadow") ? "yes" : "no"', "outside the job file's directory", id="fileexists"),
    pytest.param('fileexists("/etc/nonexistent-xyz") ? "yes" : "no"', "outside", id="fileexists-absent"),
    pytest.param('jsonencode(fileset("/", "**"))', "outside the job file's directory", id="fileset-root"),
    pytest.param('jsonencode(fileset(".", "../**"))', "must be relative", id="fileset-pattern-escape"),
    pytest.param('pathexpand("~")', None, id="pathexpand-is-string-only"),
]


@pytest.mark.parametrize(("expr", "words"), REFUSED)
def test_a_job_reads_nothing_outside_its_directory(jobdir: Path, outside: Path, expr: str, words: str | None) -> None:
    job = write_job(jobdir, f"LEAK = {expr}")
    out = cli("validate", str(job))
    if words is None:  # pathexpand only rewrites a string; reading what it names is refused
        assert out.code == 0, out.stdout
        job = write_job(jobdir, 'LEAK = file(pathexpand("~/.bashrc"))')
        out = cli("validate", str(job))
        words = "outside the job file's directory"
    sentence = assert_refused(out, job, 9, words)
    # fileexists must not say whether the outside file exists: both answers are the same refusal.
    assert "yes" not in sentence and "no file" not in sentence
    assert SECRET not in out.stdout + out.stderr


def test_run_refuses_before_anything_starts(jobdir: Path, tmp_path: Path) -> None:
    job = write_job(jobdir, 'SHADOW = file("/etc/shadow")\n        ROOTENV = file("/proc/self/environ")')
    out = cli("run", str(job), "--client", str(client_file(tmp_path)))
    assert_run_refused(out, job, 9)
    assert not (tmp_path / "data" / "allocs").exists() or not any((tmp_path / "data" / "allocs").iterdir())


def test_a_symlink_below_the_job_dir_is_not_followed(jobdir: Path, outside: Path) -> None:
    (jobdir / "shadow").symlink_to(outside)
    (jobdir / "conf").symlink_to(outside.parent, target_is_directory=True)
    (jobdir / "inside.txt").write_text("fine")
    (jobdir / "alias.txt").symlink_to("inside.txt")  # pointing inside: not followed either
    for expr in ('file("shadow")', 'file("conf/shadow")', 'fileexists("shadow")', 'file("alias.txt")'):
        job = write_job(jobdir, f"LEAK = {expr}")
        out = cli("validate", str(job))
        assert_refused(out, job, 9, "symbolic link")
        assert SECRET not in out.stdout
    job = write_job(jobdir, 'LIST = jsonencode(fileset(".", "**"))')
    assert cli("validate", str(job)).code == 0  # fileset lists no link (checked in-process below)
    listed = evaluated(job)["LIST"]
    assert listed == '["inside.txt","job.hcl"]'


def test_a_fifo_below_the_job_dir_is_refused_without_blocking(jobdir: Path) -> None:
    os.mkfifo(jobdir / "pipe")  # no writer: an open for reading would wait for ever
    job = write_job(jobdir, 'LEAK = file("pipe")')
    assert_refused(cli("validate", str(job)), job, 9, "not a regular file", "a fifo")


def test_a_file_over_the_cap_is_refused(jobdir: Path) -> None:
    (jobdir / "big.txt").write_bytes(b"x" * (MAX_READ_FILE_BYTES + 1))
    job = write_job(jobdir, 'BIG = file("big.txt")')
    assert_refused(cli("validate", str(job)), job, 9, "big.txt", f"more than the {MAX_READ_FILE_BYTES}")


def test_reads_add_up_to_a_cap(jobdir: Path) -> None:
    (jobdir / "one.txt").write_bytes(b"y" * (MAX_READ_FILE_BYTES - 1))
    reads = " ".join(f'A{i} = file("one.txt")' for i in range(9))
    job = write_job(jobdir, reads)
    assert_refused(cli("validate", str(job)), job, 9, "read more than")


def evaluated(job: Path) -> dict[str, str]:
    doc = evaluate(str(job), job.read_text(), Inputs(files=FilePolicy.beside(str(job))))
    assert doc.errors == [], [str(e) for e in doc.errors]
    assert doc.body is not None
    env: dict[str, str] = doc.body["job"][0]["hostile"]["group"][0]["g"]["task"][0]["t"]["env"][0]
    return env


def test_legitimate_files_next_to_the_job_still_work(jobdir: Path) -> None:
    (jobdir / "config.json").write_text('{"port": 8080}\n')
    (jobdir / "templates").mkdir()
    (jobdir / "templates" / "a.tpl").write_text("A ${x}\n")
    (jobdir / "b.tpl").write_text("B\n")
    env = (
        'CONFIG = file("./config.json")\n'
        f'        ABS = file("{jobdir}/config.json")\n'
        '        B64 = filebase64("config.json")\n'
        '        HAS = fileexists("config.json") ? "yes" : "no"\n'
        '        NOT = fileexists("missing.json") ? "yes" : "no"\n'
        '        TPLS = jsonencode(fileset(".", "*.tpl"))\n'
        '        ALL = jsonencode(fileset("templates", "**/*.tpl"))\n'
        '        PORT = jsondecode(file("config.json")).port'
    )
    job = write_job(jobdir, env)
    out = cli("validate", str(job))
    assert out.code == 0, out.stdout + out.stderr
    got = evaluated(job)
    assert got["CONFIG"] == got["ABS"] == '{"port": 8080}\n'
    assert got["B64"] == "eyJwb3J0IjogODA4MH0K"
    assert (got["HAS"], got["NOT"]) == ("yes", "no")
    assert got["TPLS"] == '["b.tpl"]' and got["ALL"] == '["a.tpl"]'
    assert got["PORT"] == 8080


def test_without_a_policy_no_file_function_touches_the_host(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    for expr in ('file("config.json")', 'fileexists("config.json")', 'fileset(".", "*")', 'abspath(".")'):
        text = job_text(f"X = {expr}")
        doc = evaluate(str(tmp_path / "job.hcl"), text)  # what an API would evaluate: no policy
        assert [e.line for e in doc.errors] == [9]
        assert "turned off for this job" in doc.errors[0].reason
    assert FilePolicy.beside("-").root is None and FilePolicy.beside("/job.hcl").root is None
