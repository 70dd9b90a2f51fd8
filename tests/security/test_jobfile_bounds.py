"""The attacker writes the job file: its evaluation must stay bounded.

Functions that multiply (setproduct, join, format, indent, replace), templates that loop, values
shared by locals and copied by functions, nesting thousands deep and job files of many MB are each
refused with one sentence naming the file and line, through the real CLI, under a 1 GiB address
space (a blow-up fails the test, not the machine), with no traceback. Real job files still
validate, and nothing huge is left in the parse cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from driversdk.jobspec import parsecache
from driversdk.jobspec.hcllimits import MAX_CACHED_TEXT_BYTES, MAX_JOB_FILE_BYTES
from tests.security.jobfile_cli import ROOT, assert_refused, assert_run_refused, cli, client_file, job_text

BLOWUPS = [
    pytest.param("X = jsonencode(setproduct(range(1000), range(1000), range(1000)))", 9, "setproduct", id="setproduct"),
    pytest.param(
        'X = join(",", [for i in range(1000) : join(",", [for j in range(1000) : "${i}-${j}-padding"])])',
        9,
        "expression evaluations",
        id="nested-join",
    ),
    pytest.param('X = join(",", [for i in range(1000) : local.s10k])', 9, "join's result", id="join"),
    pytest.param('X = format("%999999999d", 1)', 9, "format width", id="format-width"),
    pytest.param('X = indent(999999999, "a\\nb")', 9, "indent", id="indent"),
    pytest.param(
        'X = replace(join("", [for i in range(1000) : "aaaaa"]), "a", join("", [for i in range(1000) : "b"]))',
        9,
        "replace",
        id="replace",
    ),
    pytest.param(
        'X = "%{for i in range(1000)}%{for j in range(1000)}${i}${j}xxxxxxxx%{endfor}%{endfor}"',
        9,
        "expression evaluations",
        id="template-loops",
    ),
    pytest.param("X = jsonencode(local.l20)", 9, "elements", id="shared-locals"),
    pytest.param("X = local.l20", 9, "elements", id="shared-locals-as-argument"),
    pytest.param("X = yamlencode(yamldecode(local.laughs))", 9, "elements", id="yaml-aliases"),
    pytest.param("X = local.big * local.big * local.big * local.big * local.big * local.big", 9, "bits", id="bigint"),
]

# l0 is a list of 2; each next local holds the previous twice: l20 is 2^21 elements written out.
# laughs is YAML whose aliases copy 10^6 elements; s10k is 10,000 characters.
PRELUDE = (
    "locals {\n"
    + "".join(f"  l{i} = [local.l{i - 1}, local.l{i - 1}]\n" if i else '  l0 = ["a", "b"]\n' for i in range(21))
    + '  laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\\n'
    + "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\\n"
    + 'e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\\n"\n'
    + '  s10k = join("", [for i in range(1000) : "xxxxxxxxxx"])\n'
    + "  big = 1000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000\n"
    + "}\n"
)
PRELUDE_LINES = PRELUDE.count("\n")


@pytest.mark.parametrize(("env", "line", "word"), BLOWUPS)
def test_a_blow_up_is_refused_with_its_line(tmp_path: Path, env: str, line: int, word: str) -> None:
    job = tmp_path / "job.hcl"
    job.write_text(job_text(env, PRELUDE))
    out = cli("validate", str(job))
    assert_refused(out, job, PRELUDE_LINES + line, word)


def test_run_refuses_a_blow_up_before_anything_starts(tmp_path: Path) -> None:
    job = tmp_path / "job.hcl"
    job.write_text(job_text("X = jsonencode(setproduct(range(1000), range(1000), range(1000)))"))
    assert_run_refused(cli("run", str(job), "--client", str(client_file(tmp_path))), job, 9)


@pytest.mark.parametrize("depth", [300, 5000])
def test_deep_nesting_is_refused_with_a_sentence(tmp_path: Path, depth: int) -> None:
    job = tmp_path / "job.hcl"
    job.write_text(job_text("X = jsonencode(" + "[" * depth + "1" + "]" * depth + ")"))
    assert_refused(cli("validate", str(job)), job, 9, "nest", "flatten")


def test_deep_values_from_jsondecode_are_refused(tmp_path: Path) -> None:
    job = tmp_path / "job.hcl"
    job.write_text(job_text('X = jsonencode(jsondecode("' + "[" * 5000 + "]" * 5000 + '"))'))
    assert_refused(cli("validate", str(job)), job, 9, "nest")


def test_a_job_file_over_the_cap_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    job = tmp_path / "job.hcl"
    filler = "# " + "x" * 1000 + "\n"
    job.write_text(filler * (MAX_JOB_FILE_BYTES // len(filler) + 1) + job_text('X = "y"'))
    out = cli("validate", str(job))
    assert out.code == 1 and "Traceback" not in out.stderr, out.stderr
    said = out.stdout + out.stderr
    assert f"{job}: the file is over {MAX_JOB_FILE_BYTES} bytes" in said, said
    out = cli("run", str(job), "--client", str(client_file(tmp_path)))
    # run refuses it before anything starts, with the same sentence (exit 1: the exit of any job
    # file run cannot read, not validation's 2)
    assert out.code != 0 and "Traceback" not in out.stderr, out.stderr
    assert f"{job}: the file is over {MAX_JOB_FILE_BYTES} bytes" in out.stdout + out.stderr


def test_dev_zero_as_the_job_file_is_refused(tmp_path: Path) -> None:
    out = cli("validate", "/dev/zero")
    assert out.code == 1 and "over" in out.stdout + out.stderr and "Traceback" not in out.stderr


def test_real_job_files_still_validate_their_values() -> None:
    from driversdk.jobspec.hcl import evaluate

    files = sorted((ROOT / "tests" / "jobspec" / "fixtures").glob("*.hcl")) + sorted(
        (ROOT / "tests" / "runner" / "fixtures").glob("**/*.hcl")
    )
    for path in files:
        doc = evaluate(str(path), path.read_text())
        limits = [e for e in doc.errors if "more than" in e.reason or "nest" in e.reason]
        assert not limits, (path, [str(e) for e in limits])


def test_a_large_job_file_leaves_no_tree_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv(parsecache.ENV_CACHE_DIR, str(cache))
    job = tmp_path / "job.hcl"
    attrs = "".join(f"        A{i} = [{i}, {{k = {i}}}]\n" for i in range(MAX_CACHED_TEXT_BYTES // 20))
    job.write_text(job_text(attrs.strip()))
    assert MAX_CACHED_TEXT_BYTES < job.stat().st_size <= MAX_JOB_FILE_BYTES
    out = cli("validate", str(job))
    assert "Traceback" not in out.stderr, out.stderr
    kept = list(cache.glob(f"{parsecache.TREE_PREFIX}*")) if cache.exists() else []
    assert kept == []
    small = tmp_path / "small.hcl"
    small.write_text(job_text('X = "y"'))
    cli("validate", str(small))
    assert len(list(cache.glob(f"{parsecache.TREE_PREFIX}*"))) == 1  # a real job's tree is still kept
