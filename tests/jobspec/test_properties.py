"""Property: a job that uses an undeclared variable or a function that does not exist never
validates, wherever the use is and whatever else the job holds."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from driversdk.jobspec.hcl.functions import NAMES
from driversdk.jobspec.job import parse_job, static_problems

identifiers = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
PLACES = [
    'job "j" {{\n  group "g" {{\n    task "t" {{\n      driver = "exec"\n      config {{\n        command = {e}\n'
    "      }}\n    }}\n  }}\n}}\n",
    'job "j" {{\n  group "g" {{\n    count = {e}\n    task "t" {{\n      driver = "exec"\n    }}\n  }}\n}}\n',
    'job "j" {{\n  meta = {{ a = {e} }}\n  group "g" {{\n    task "t" {{\n      driver = "exec"\n    }}\n  }}\n}}\n',
    'locals {{\n  x = {e}\n}}\njob "j" {{\n  group "g" {{\n    task "t" {{\n      driver = "exec"\n    }}\n  }}\n}}\n',
    'job "j" {{\n  group "g" {{\n    task "t" {{\n      driver = "exec"\n      env {{\n        A = "pre-${{{e}}}"\n'
    "      }}\n    }}\n  }}\n}}\n",
]


def wraps(inner: str) -> st.SearchStrategy[str]:
    return st.sampled_from([inner, f"[{inner}]", f"upper({inner})", f'"x-${{{inner}}}"', f"true ? {inner} : 1"])


uses = st.one_of(
    identifiers.map(lambda n: f"var.{n}"),
    identifiers.filter(lambda n: n not in NAMES).map(lambda n: f'{n}("a")'),
).flatmap(wraps)


@settings(max_examples=150, deadline=None)
@given(place=st.sampled_from(PLACES), use=uses, declared=st.lists(identifiers, max_size=3))
def test_an_undeclared_variable_or_unknown_function_never_validates(place: str, use: str, declared: list[str]) -> None:
    # Variables that are declared (with defaults) but are never the one used.
    used = use.split("var.")[1].split(")")[0].split("]")[0].split("}")[0].split(" ")[0] if "var." in use else ""
    prelude = "".join(f'variable "{n}" {{\n  default = "v"\n}}\n' for n in set(declared) - {used})
    text = prelude + place.format(e=use)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "job.hcl"
        path.write_text(text)
        job, problems = parse_job(path)
        problems += static_problems(job)
    assert problems, text
