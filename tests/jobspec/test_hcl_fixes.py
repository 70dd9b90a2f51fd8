"""Three places the HCL2 evaluator used to part from Nomad's jobspec2 (HCL2 + cty):

- a ``dynamic`` block's labels are converted to strings as cty converts them, and a null label
  (or one no string can stand for) is refused with the file, line, block and label;
- ``convert(value, T)`` reads ``T`` as a type expression — ``list(number)``, ``set(…)``,
  ``map(…)``, ``object({…})``, ``tuple([…])`` — never as a call, and converts as cty does;
- ``yamldecode`` gives only HCL values: timestamps become RFC 3339 strings, ``!!binary`` its
  base64 text, and the tags cty cannot represent (``!!set``, ``!!omap``, ``!!pairs``) are refused.

Each is checked through the evaluator and through ``driversdk validate`` on a real file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from driversdk.jobspec.hcl import Inputs, evaluate

ROOT = Path(__file__).resolve().parents[2]


def validate(tmp_path: Path, text: str) -> tuple[Path, dict[str, Any], subprocess.CompletedProcess[str]]:
    """``driversdk validate --json`` of ``text`` written to a job file in ``tmp_path``."""
    job = tmp_path / "job.hcl"
    job.write_text(text)
    client = tmp_path / "client.hcl"
    client.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    done = subprocess.run(
        [sys.executable, "-m", "driversdk.cli", "validate", str(job), "--client", str(client), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return job, report, done


def job_with(body: str, prelude: str = "") -> str:
    return f'{prelude}\njob "j" {{\n  x = {body}\n}}\n'


def value(expr: str, prelude: str = "") -> Any:
    doc = evaluate("/tmp/job.hcl", job_with(expr, prelude), Inputs())
    assert doc.errors == [], [str(e) for e in doc.errors]
    assert doc.body is not None
    return doc.body["job"][0]["j"]["x"]


def errors(text: str) -> list[str]:
    return [str(e) for e in evaluate("/tmp/job.hcl", text, Inputs()).errors]


# --- 1. dynamic block labels ---------------------------------------------------------------------

DYNAMIC = """job "j" {{
  group "g" {{
    dynamic "task" {{
      for_each = {for_each}
      labels   = {labels}
      content {{
        driver = "raw_exec"
        config {{
          command = "/bin/true"
        }}
      }}
    }}
  }}
}}
"""


def dynamic_tasks(for_each: str, labels: str) -> tuple[dict[str, Any], list[str]]:
    doc = evaluate("/tmp/job.hcl", DYNAMIC.format(for_each=for_each, labels=labels), Inputs())
    tasks: dict[str, Any] = {}
    if doc.body is not None and not doc.errors:
        for task in doc.body["job"][0]["j"]["group"][0]["g"].get("task", []):
            tasks.update(task)
    return tasks, [str(e) for e in doc.errors]


def test_validate_refuses_a_null_dynamic_block_label_naming_file_line_block_and_label(tmp_path: Path) -> None:
    job, report, done = validate(tmp_path, DYNAMIC.format(for_each='["a"]', labels="[null]"))
    assert done.returncode == 1, done.stdout
    assert report["valid"] is False
    assert report["checked"] == [], "a task named after a null label was checked"
    (problem,) = report["problems"]
    assert problem["file"] == str(job) and problem["line"] == 5
    assert 'dynamic "task"' in problem["message"] and "label 1" in problem["message"]
    assert "null" in problem["message"] and "None" not in problem["text"]


def test_a_null_label_from_the_iterator_is_refused_with_the_label_expression() -> None:
    tasks, problems = dynamic_tasks("{ a = null }", "[task.value]")
    assert tasks == {}
    assert len(problems) == 1
    assert problems[0].startswith("line 5: ") and 'dynamic "task"' in problems[0]
    assert "(in task.value)" in problems[0] and "null" in problems[0]


@pytest.mark.parametrize(
    ("labels", "why"),
    [("[[task.value]]", "tuple"), ("[{ a = 1 }]", "object")],
)
def test_a_label_no_string_can_stand_for_is_refused(labels: str, why: str) -> None:
    tasks, problems = dynamic_tasks('["x"]', labels)
    assert tasks == {}
    assert len(problems) == 1 and 'dynamic "task"' in problems[0] and why in problems[0], problems


def test_labels_must_be_a_list_written_out_as_hcl_requires() -> None:
    tasks, problems = dynamic_tasks('["x"]', "task.value")
    assert tasks == {}
    assert len(problems) == 1 and "labels" in problems[0] and "[" in problems[0], problems


@pytest.mark.parametrize(
    ("for_each", "name"),
    [("[3]", "3"), ("[true]", "true"), ("[1.5]", "1.5"), ("[2.0]", "2"), ('["web"]', "web")],
)
def test_numbers_and_bools_become_labels_as_cty_writes_them(for_each: str, name: str) -> None:
    tasks, problems = dynamic_tasks(for_each, "[task.value]")
    assert problems == []
    assert list(tasks) == [name]
    assert all(isinstance(k, str) for k in tasks)


# --- 2. convert() with a collection or structural type -------------------------------------------


@pytest.mark.parametrize(
    ("expr", "want"),
    [
        ('convert(["1", 2], list(number))', [1, 2]),
        ('convert(["a", "b", "a"], set(string))', ["a", "b"]),
        ("convert({ a = 1, b = true }, map(string))", {"a": "1", "b": "true"}),
        ('convert({ a = "1", b = true, c = "x" }, object({ a = number, b = string }))', {"a": 1, "b": "true"}),
        ('convert([1, "2"], tuple([string, number]))', ["1", 2]),
        ('convert([["1"], ["2", 3]], list(list(number)))', [[1], [2, 3]]),
        ("convert(3, string)", "3"),
        # An element type of any is the one type cty unifies the elements to.
        ('convert([1, "a", true], list(any))', ["1", "a", "true"]),
        ('convert({ a = 1, b = "x" }, map(any))', {"a": "1", "b": "x"}),
        ("convert([1, 2], set(any))", [1, 2]),
        ("convert(null, list(number))", None),
    ],
)
def test_convert_reads_its_second_argument_as_a_type(expr: str, want: Any) -> None:
    assert value(expr) == want


@pytest.mark.parametrize(
    ("expr", "type_shown"),
    [
        ('convert(["x"], list(number))', "list(number)"),
        ('convert("x", list(string))', "list(string)"),
        ("convert({ b = 1 }, object({ a = number }))", "object({a = number})"),
        ("convert([1, 2], tuple([number]))", "tuple([number])"),
        ("convert([1, true], list(any))", "list(any)"),
    ],
)
def test_a_value_that_cannot_convert_names_the_function_and_the_type(expr: str, type_shown: str) -> None:
    (problem,) = errors(job_with(expr))
    assert problem.startswith("line 3: convert(): "), problem
    assert type_shown in problem, problem


def test_a_type_argument_that_is_not_a_type_is_refused() -> None:
    (problem,) = errors(job_with("convert(1, lizt(number))"))
    assert "type" in problem and "lizt" in problem, problem


def test_validate_accepts_convert_to_a_list_of_numbers(tmp_path: Path) -> None:
    text = """locals {
  ports = convert(["8080", 8081], list(number))
}
job "j" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/echo"
        args    = [jsonencode(local.ports)]
      }
    }
  }
}
"""
    _, report, done = validate(tmp_path, text)
    assert done.returncode == 0, report["problems"]
    assert report["valid"] is True


# --- 3. yamldecode gives only HCL values ---------------------------------------------------------


@pytest.mark.parametrize(
    ("yaml_text", "want"),
    [
        ("2001-12-14", "2001-12-14T00:00:00Z"),
        ("2001-12-14t21:59:43.10-05:00", "2001-12-14T21:59:43-05:00"),
        ("2001-12-14T21:59:43Z", "2001-12-14T21:59:43Z"),
        ("2001-12-14 21:59:43.10", "2001-12-14T21:59:43Z"),
        ("!!timestamp 2001-12-14", "2001-12-14T00:00:00Z"),
        # A form YAML calls a timestamp and cty cannot read as one stays the text as written.
        ("2001-12-14 21:59:43.10 -5", "2001-12-14 21:59:43.10 -5"),
        ("2001-2-3T1:2:3.5-07:30", "2001-02-03T01:02:03-07:30"),
        ("2001-12-14T21:59:43+00:00", "2001-12-14T21:59:43Z"),
        ("2001-12-14T21:59:43+25:00", "2001-12-14T21:59:43+25:00"),
        ("2001-02-30", "2001-02-30"),
        ("!!binary aGk=", "aGk="),
        ("!!binary |\n  aGVs\n  bG8=\n", "aGVs\nbG8=\n"),
        ('"2001-12-14"', "2001-12-14"),
    ],
)
def test_yamldecode_makes_timestamps_and_binary_strings(yaml_text: str, want: str) -> None:
    assert value(f"yamldecode({json.dumps(yaml_text)})") == want


def test_yamldecode_keys_are_written_as_cty_writes_them() -> None:
    decoded = value(json.dumps("{true: a, 1.0: b, 2001-12-14: c}").join(["yamldecode(", ")"]))
    assert decoded == {"true": "a", "1": "b", "2001-12-14T00:00:00Z": "c"}


@pytest.mark.parametrize(
    ("yaml_text", "said"),
    [
        ("!!set {a, b}", "!!set"),
        ("!!omap [a: 1, b: 2]", "!!omap"),
        ("!!pairs [a: 1, a: 2]", "!!pairs"),
        ("!!binary not*base64", "base64"),
        ("!!timestamp yesterday", "timestamp"),
        ("{~: a}", "null"),
    ],
)
def test_yamldecode_refuses_what_hcl_has_no_value_for(yaml_text: str, said: str) -> None:
    (problem,) = errors(job_with(f"yamldecode({json.dumps(yaml_text)})"))
    assert problem.startswith("line 3: yamldecode(): "), problem
    assert said in problem, problem


def test_validate_jsonencodes_what_yamldecode_made(tmp_path: Path) -> None:
    text = r"""locals {
  y = yamldecode("when: 2001-12-14\nraw: !!binary aGk=\nn: 1")
}
job "j" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/echo"
        args    = [jsonencode(local.y)]
      }
    }
  }
}
"""
    _, report, done = validate(tmp_path, text)
    assert done.returncode == 0, report["problems"]
    doc = evaluate(str(tmp_path / "job.hcl"), text, Inputs())
    assert doc.errors == []
    assert doc.locals["y"] == {"when": "2001-12-14T00:00:00Z", "raw": "aGk=", "n": 1}


def test_validate_refuses_a_yaml_set_in_one_sentence(tmp_path: Path) -> None:
    text = r"""locals {
  y = yamldecode("!!set {a}")
}
job "j" {
  group "g" {
    task "t" {
      driver = "raw_exec"
      config {
        command = "/bin/echo"
        args    = [jsonencode(local.y)]
      }
    }
  }
}
"""
    job, report, done = validate(tmp_path, text)
    assert done.returncode == 1
    (problem,) = report["problems"]
    assert problem["file"] == str(job) and problem["line"] == 2
    assert problem["message"].startswith("yamldecode(): ") and "!!set" in problem["message"]
    assert "argument(s)" not in problem["message"]
