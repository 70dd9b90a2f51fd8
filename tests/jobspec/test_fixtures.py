"""Job files after Nomad's job specification pages and jobspec2's test fixtures, re-typed in our
words: each validates, or fails for the reason its first line states (``# expect: …``).

The check is what validate knows before launching a driver: HCL2 evaluation, Nomad's schema,
the submit-time rules, after a dry interpolation of runtime variables.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from driversdk.agent.validate import dry_interpolated
from driversdk.jobspec.hcl import Inputs
from driversdk.jobspec.job import parse_job, static_problems

FIXTURES = Path(__file__).parent / "fixtures"
FILES = sorted(FIXTURES.glob("*.hcl"))


def expectation(path: Path) -> tuple[str, str, list[str]]:
    lines = path.read_text().splitlines()
    head = lines[0].removeprefix("# expect: ")
    kind, _, reason = head.partition(": ")
    vars_ = next((line.removeprefix("# vars: ").split() for line in lines[1:3] if line.startswith("# vars: ")), [])
    return kind, reason, vars_


def problems_of(path: Path, vars_: list[str]) -> list[str]:
    job, problems = parse_job(path, Inputs(vars=vars_))
    problems = problems + static_problems(dry_interpolated(job))
    return [str(p) for p in problems]


def test_there_are_enough_fixtures() -> None:
    assert len(FILES) >= 40
    assert sum(expectation(f)[0] == "valid" for f in FILES) >= 35


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_fixture(path: Path) -> None:
    kind, reason, vars_ = expectation(path)
    found = problems_of(path, vars_)
    if kind == "valid":
        assert found == [], found
    else:
        assert kind == "error", f"{path.name}: first line must be '# expect: valid' or '# expect: error: …'"
        assert any(reason in p for p in found), (reason, found)
