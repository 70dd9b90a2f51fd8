"""HCL2 as Nomad's jobspec2 evaluates it: variables and their sources, locals, functions,
dynamic blocks, heredocs, templates, and runtime variables kept for the client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from driversdk.jobspec.hcl import FilePolicy, Inputs, evaluate


def job_body(text: str, inputs: Inputs | None = None, path: str = "/tmp/job.hcl") -> dict[str, Any]:
    doc = evaluate(path, text, inputs)
    assert doc.errors == [], [str(e) for e in doc.errors]
    assert doc.body is not None
    body: dict[str, Any] = doc.body["job"][0]["j"]
    return body


def value(expr: str, prelude: str = "", inputs: Inputs | None = None) -> Any:
    return job_body(f'{prelude}\njob "j" {{\n  x = {expr}\n}}\n', inputs)["x"]


def errors(text: str, inputs: Inputs | None = None) -> list[str]:
    return [str(e) for e in evaluate("/tmp/job.hcl", text, inputs).errors]


# --- variables -----------------------------------------------------------------------------------

VARS = """
variable "image" {
  type    = string
  default = "from-default"
}
variable "ports" {
  type    = list(number)
  default = [80]
}
"""


def test_a_default_is_used_when_nothing_else_is_set() -> None:
    assert value("var.image", VARS) == "from-default"


def test_env_then_var_file_then_var_the_last_wins(tmp_path: Path) -> None:
    hcl_file = tmp_path / "a.hcl"
    hcl_file.write_text('image = "from-file"\n')
    json_file = tmp_path / "b.json"
    json_file.write_text(json.dumps({"image": "from-json", "ports": [1, 2]}))
    env = {"NOMAD_VAR_image": "from-env", "UNRELATED": "x"}
    assert value("var.image", VARS, Inputs(env=env)) == "from-env"
    assert value("var.image", VARS, Inputs(env=env, var_files=[str(hcl_file)])) == "from-file"
    assert value("var.image", VARS, Inputs(env=env, var_files=[str(hcl_file), str(json_file)])) == "from-json"
    assert value("var.ports", VARS, Inputs(var_files=[str(json_file)])) == [1, 2]
    final = Inputs(env=env, var_files=[str(hcl_file)], vars=["image=from-cli"])
    assert value("var.image", VARS, final) == "from-cli"


def test_a_var_of_a_collection_type_is_an_hcl_expression_and_converted() -> None:
    assert value("var.ports", VARS, Inputs(vars=['ports=["8080", 9090]'])) == [8080, 9090]


def test_a_number_given_as_text_is_converted_to_the_declared_type() -> None:
    assert value("var.n + 1", 'variable "n" {\n  type = number\n}', Inputs(vars=["n=41"])) == 42


def test_a_value_of_the_wrong_type_is_refused() -> None:
    found = errors('variable "n" {\n  type = number\n}\njob "j" {}\n', Inputs(vars=["n=many"]))
    assert any("the value from -var is not a number: a number is required, not the string" in e for e in found), found


def test_an_unset_variable_names_its_line_and_how_to_set_it() -> None:
    found = errors('\n\nvariable "image" {\n  type = string\n}\njob "j" {}\n')
    assert found == [
        'line 3: variable "image" is not set and has no default; set it with -var image=…, a -var-file or the '
        "environment variable NOMAD_VAR_image (in var.image)"
    ]


def test_a_validation_rule_that_fails_is_its_error_message() -> None:
    text = 'variable "n" {\n  default = 3\n  validation {\n    condition = var.n > 5\n' \
           '    error_message = "Must be above five."\n  }\n}\njob "j" {}\n'  # fmt: skip
    assert any("Must be above five." in e for e in errors(text))
    assert errors(text, Inputs(vars=["n=7"])) == []


def test_a_var_for_an_undeclared_variable_is_a_warning() -> None:
    doc = evaluate("/tmp/job.hcl", 'job "j" {}\n', Inputs(vars=["nope=1"]))
    assert doc.errors == []
    assert doc.warnings == ['-var nope: no variable "nope" is declared in the job file; the value is not used']


def test_a_var_file_may_not_declare_variables(tmp_path: Path) -> None:
    var_file = tmp_path / "v.hcl"
    var_file.write_text('variable "x" {\n  default = 1\n}\n')
    found = errors(VARS + 'job "j" {}\n', Inputs(var_files=[str(var_file)]))
    assert any("a var file sets values (name = value)" in e for e in found), found


def test_an_undeclared_variable_is_an_error_naming_line_and_expression() -> None:
    found = errors('job "j" {\n  group "g" {\n    x = var.not_declared\n  }\n}\n')
    assert found == [
        'line 3: there is no variable named "not_declared"; declare it: variable "not_declared" { … } '
        "(in var.not_declared)"
    ]


def test_an_unknown_function_is_an_error_with_did_you_mean() -> None:
    found = errors('job "j" {\n  x = lenght([1])\n}\n')
    assert found == ['line 2: there is no function named "lenght"; did you mean "length"? (in lenght([1]))']


def test_an_expression_that_cannot_evaluate_is_an_error() -> None:
    assert errors('job "j" {\n  x = [1, 2][5]\n}\n') == [
        "line 2: index 5 is out of range for a list of 2 element(s) (in [1, 2][5])"
    ]
    assert "a number is required" in errors('job "j" {\n  x = "a" * 2\n}\n')[0]


# --- locals --------------------------------------------------------------------------------------


def test_locals_may_use_each_other_in_any_order() -> None:
    prelude = 'locals {\n  b = "${local.a}-b"\n  a = upper(var.v)\n}\nvariable "v" {\n  default = "x"\n}'
    assert value("local.b", prelude) == "X-b"


def test_a_local_cycle_is_an_error() -> None:
    assert errors('locals {\n  a = local.b\n  b = local.a\n}\njob "j" {}\n')


# --- runtime variables ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        '"${NOMAD_ALLOC_DIR}/data"',
        '"${attr.kernel.name}"',
        '"${node.unique.id}"',
        '"${meta.rack}"',
        '"${env["HOME"]}"',
        '"${NOMAD_META_owner}"',
        '"${CSI_ENDPOINT}"',
        '"${device.attr.memory}"',
    ],
)
def test_runtime_variables_are_left_for_the_client(expr: str) -> None:
    assert value(expr) == expr[1:-1]


def test_runtime_variables_inside_larger_strings_and_lists() -> None:
    assert value('["--endpoint=${CSI_ENDPOINT}", "x-${attr.unique.hostname}-y"]') == [
        "--endpoint=${CSI_ENDPOINT}",
        "x-${attr.unique.hostname}-y",
    ]


def test_an_escaped_interpolation_stays_literal() -> None:
    assert value('"$${HOME} and %%{ if }"') == "${HOME} and %{ if }"


# --- templates, heredocs -------------------------------------------------------------------------


def test_string_directives() -> None:
    assert value('"%{ if 1 > 0 }yes%{ else }no%{ endif }"') == "yes"
    assert value('"%{ for i, v in ["a", "b"] }${i}=${v};%{ endfor }"') == "0=a;1=b;"
    assert value('"[ %{~ for v in ["a", "b"] ~} ${v} %{~ endfor ~} ]"') == "[ab]"


def test_a_lone_interpolation_keeps_its_type() -> None:
    assert value('"${1 + 2}"') == 3
    assert value('"n=${1 + 2}"') == "n=3"


def test_heredocs() -> None:
    text = (
        'job "j" {\n  a = <<EOT\nline ${upper("x")}\n  "quoted" \\n $${raw}\nEOT\n'
        "  b = <<-EOT\n    one\n      two\n    EOT\n}\n"
    )
    body = job_body(text)
    assert body["a"] == 'line X\n  "quoted" \\n ${raw}\n'
    assert body["b"] == "one\n  two\n"


def test_a_heredoc_with_go_template_braces_and_runtime_variables() -> None:
    text = 'job "j" {\n  d = <<EOF\n{{ env "NOMAD_ALLOC_ID" }} ${NOMAD_TASK_DIR}\nEOF\n}\n'
    assert job_body(text)["d"] == '{{ env "NOMAD_ALLOC_ID" }} ${NOMAD_TASK_DIR}\n'


# --- expressions ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("[for x in [1, 2, 3] : x * 2 if x != 2]", [2, 6]),
        ("{for k, v in {a = 1, b = 2} : upper(k) => v}", {"A": 1, "B": 2}),
        ('{for s in ["a", "b", "a"] : s => s...}', {"a": ["a", "a"], "b": ["b"]}),
        ("[{a = 1}, {a = 2}][*].a", [1, 2]),
        ("[{a = 1}, {a = 2}].*.a", [1, 2]),
        ("{x = [10, 20]}.x[1]", 20),
        ('true && !false ? "t" : "f"', "t"),
        ("(1 + 2) * 3 - 4 / 2 % 3", 7),
        ('"3" + 1', 4),
        ("1 == 1.0", True),
        ('1 == "1"', False),
        ("-5", -5),
        ("1.5e3", 1500),
    ],
)
def test_expressions(expr: str, expected: Any) -> None:
    assert value(expr) == expected


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('upper("a")', "A"),
        ('lower("A")', "a"),
        ('title("hello world")', "Hello World"),
        ('format("%s:%d %5.2f %q %v", "a", 5, 3.14159, "x", true)', 'a:5  3.14 "x" true'),
        ('formatlist("%s=%s", ["a", "b"], "v")', ["a=v", "b=v"]),
        ('join("-", ["a", "b"], ["c"])', "a-b-c"),
        ('split(",", "a,b")', ["a", "b"]),
        ('replace("a-b-c", "-", "_")', "a_b_c"),
        ('replace("a1b22", "/[0-9]+/", "#")', "a#b#"),
        ('regex_replace("v1.2", "v([0-9])", "V$1")', "V1.2"),
        ('substr("hello", 1, 3)', "ell"),
        ('trimspace("  x ")', "x"),
        ('trimprefix("nomad-job", "nomad-")', "job"),
        ('trimsuffix("a.hcl", ".hcl")', "a"),
        ('trim("?!x!?", "?!")', "x"),
        ('chomp("x\\n\\n")', "x"),
        ('indent(2, "a\\nb")', "a\n  b"),
        ('strrev("abc")', "cba"),
        ('strlen("abc")', 3),
        ("length({a = 1})", 1),
        ("concat([1], [2, 3])", [1, 2, 3]),
        ('contains(["a"], "a")', True),
        ("distinct([1, 1, 2])", [1, 2]),
        ('element(["a", "b"], 3)', "b"),
        ("flatten([[1], [2, [3]]])", [1, 2, 3]),
        ('index(["a", "b"], "b")', 1),
        ("keys({b = 1, a = 2})", ["a", "b"]),
        ("values({b = 1, a = 2})", [2, 1]),
        ('lookup({a = 1}, "b", 9)', 9),
        ("merge({a = 1}, {b = 2})", {"a": 1, "b": 2}),
        ("range(3)", [0, 1, 2]),
        ("range(1, 7, 2)", [1, 3, 5]),
        ("reverse([1, 2])", [2, 1]),
        ("slice([1, 2, 3], 1, 3)", [2, 3]),
        ('sort(["b", "a"])', ["a", "b"]),
        ('setunion(["a"], ["b", "a"])', ["a", "b"]),
        ('setintersection(["a", "b"], ["b"])', ["b"]),
        ('setproduct(["a"], [1, 2])', [["a", 1], ["a", 2]]),
        ('zipmap(["a", "b"], [1, 2])', {"a": 1, "b": 2}),
        ("chunklist([1, 2, 3], 2)", [[1, 2], [3]]),
        ('coalesce("", "x")', "x"),
        ("coalescelist([], [1])", [1]),
        ('compact(["a", "", "b"])', ["a", "b"]),
        ("abs(-3)", 3),
        ("ceil(1.2)", 2),
        ("floor(1.8)", 1),
        ("max(1, 5, 3)", 5),
        ("min(4, 2)", 2),
        ("pow(2, 10)", 1024),
        ("signum(-7)", -1),
        ('parseint("ff", 16)', 255),
        ("log(8, 2)", 3),
        ('jsonencode({a = [1, "b"]})', '{"a":[1,"b"]}'),
        ('jsondecode("{\\"a\\": 1.0}")', {"a": 1}),
        ('yamldecode("a: [1, 2]")', {"a": [1, 2]}),
        ('csvdecode("a,b\\n1,2")', [{"a": "1", "b": "2"}]),
        ('base64encode("hi")', "aGk="),
        ('base64decode("aGk=")', "hi"),
        ('urlencode("a b&c")', "a+b%26c"),
        ('md5("x")', "9dd4e461268c8034f5c8564e155c67a6"),
        ('sha256("x")', "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881"),
        ('cidrhost("10.0.0.0/24", 5)', "10.0.0.5"),
        ('cidrnetmask("10.0.0.0/12")', "255.240.0.0"),
        ('cidrsubnet("10.0.0.0/16", 8, 2)', "10.0.2.0/24"),
        ('cidrsubnets("10.0.0.0/16", 8, 4)', ["10.0.0.0/24", "10.0.16.0/20"]),
        ('formatdate("YYYY-MM-DD hh:mm", "2024-03-05T07:08:09Z")', "2024-03-05 07:08"),
        ('timeadd("2024-01-01T00:00:00Z", "90m")', "2024-01-01T01:30:00Z"),
        ('try(tonumber_missing, "fallback")', "${tonumber_missing}"),
        ('try({}.a, "fallback")', "fallback"),
        ("can([1][3])", False),
        ('convert("5", number)', 5),
        ('uuidv5("dns", "example.com")', "cfbff0d1-9375-5685-968c-48ce8b15ae17"),
        ("length(uuidv4())", 36),
        ('basename("/a/b.txt")', "b.txt"),
        ('dirname("/a/b.txt")', "/a"),
    ],
)
def test_functions(expr: str, expected: Any) -> None:
    assert value(expr) == expected


def test_file_functions_read_next_to_the_job_file(tmp_path: Path) -> None:
    (tmp_path / "motd.txt").write_text("hello\n")
    job = tmp_path / "job.hcl"
    text = 'job "j" {\n  a = file("motd.txt")\n  b = fileexists("nope")\n  c = fileset(".", "*.txt")\n}\n'
    body = job_body(text, Inputs(files=FilePolicy.beside(str(job))), path=str(job))
    assert (body["a"], body["b"], body["c"]) == ("hello\n", False, ["motd.txt"])


# --- dynamic blocks ------------------------------------------------------------------------------


def test_dynamic_blocks_with_iterator_labels_and_nesting() -> None:
    text = """
locals {
  groups = { web = ["a", "b"], db = ["c"] }
}
job "j" {
  dynamic "group" {
    for_each = local.groups
    iterator = g
    labels   = [g.key]
    content {
      dynamic "task" {
        for_each = g.value
        labels   = [task.value]
        content {
          driver = "exec"
          index  = task.key
        }
      }
    }
  }
}
"""
    body = job_body(text)
    groups = {name: g for item in body["group"] for name, g in item.items()}
    assert list(groups) == ["db", "web"]
    tasks = [name for item in groups["web"]["task"] for name in item]
    assert tasks == ["a", "b"]
    assert groups["web"]["task"][1]["b"]["index"] == 1


def test_a_dynamic_block_needs_for_each_and_content() -> None:
    found = errors('job "j" {\n  dynamic "group" {\n    labels = ["x"]\n  }\n}\n')
    assert any("needs for_each" in e for e in found), found


def test_a_variables_block_declares_variables_by_their_defaults() -> None:
    prelude = 'variables {\n  region = "eu"\n  replicas = 2\n}'
    assert value("var.region", prelude) == "eu"
    assert value("var.replicas + 1", prelude, Inputs(vars=["replicas=4"])) == 5


def test_defaults_must_be_literal_values() -> None:
    found = errors('variable "a" {\n  default = upper("x")\n}\njob "j" {}\n')
    assert found == ['line 2: functions may not be called here; give a literal value (in upper("x"))']
