"""A hostile job file: every name that becomes a path carries traversal, slashes, NUL, control
characters or 5000 bytes.  `driversdk validate` and `driversdk run` (the real CLI) refuse it with a
sentence naming the field, without a traceback, and nothing is created under the data dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from driversdk.paths import NAME_MAX, UnsafePathError, check_name, resolve_under
from tests.agent.runs import run_cli

# HCL escapes: the job file says "\u0000" and "\n"; the parsed name holds NUL and a newline.
HOSTILE = {
    "traversal": "/../../x/victim",
    "slash": "a/b",
    "dotdot": "..",
    "dot": ".",
    "empty": "",
    "long": "n" * 5000,
    "nul": "a\\u0000b",
    "newline": "a\\nb",
}

# Where the name goes in the job, and the words the refusal names it by.
FIELDS = {
    "job": "the job name",
    "group": "the group name",
    "task": "the task name",
    "volume": "the volume name",
    "source": "source",
    "csi_plugin": "csi_plugin.id",
    "driver": "driver",
    "namespace": "namespace",
}


# An empty value of these is refused by the rule for a missing value, in Nomad's words.
EMPTY = {
    "driver": "missing driver;",
    "csi_plugin": "CSIPluginConfig must have a non-empty PluginID;",
    "source": "volume has an empty source;",
}


def job_text(field: str, value: str) -> str:
    names = {f: "ok" for f in FIELDS}
    names["namespace"] = "default"
    names["driver"] = "exec"
    names[field] = value
    return f"""job "{names["job"]}" {{
  namespace = "{names["namespace"]}"
  group "{names["group"]}" {{
    volume "{names["volume"]}" {{
      type            = "csi"
      source          = "{names["source"]}"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }}
    task "{names["task"]}" {{
      driver = "{names["driver"]}"
      config {{
        command = "/bin/true"
      }}
      csi_plugin {{
        id   = "{names["csi_plugin"]}"
        type = "node"
      }}
      volume_mount {{
        volume      = "{names["volume"]}"
        destination = "/data"
      }}
    }}
  }}
}}
"""


def files(tmp_path: Path, field: str, value: str) -> tuple[Path, Path, Path]:
    data = tmp_path / "data"
    client = tmp_path / "client.hcl"
    client.write_text(f'data_dir = "{data}"\n')
    job = tmp_path / "job.hcl"
    job.write_text(job_text(field, value))
    return job, client, data


def refusal_lines(out: str, words: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("error ") and f": {words} " in line + " "]


@pytest.mark.parametrize("value", list(HOSTILE.values()), ids=list(HOSTILE))
@pytest.mark.parametrize("field", list(FIELDS))
def test_validate_refuses_a_hostile_name_naming_the_field(tmp_path: Path, field: str, value: str) -> None:
    if field == "namespace" and value == "":
        pytest.skip('an empty namespace is "default", as in Nomad')
    job, client, data = files(tmp_path, field, value)
    done = run_cli("validate", str(job), "--client", str(client))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    words = EMPTY.get(field, FIELDS[field]) if value == "" else FIELDS[field]
    lines = refusal_lines(done.stdout, words)
    assert lines, f"no sentence naming {words!r}:\n{done.stdout}{done.stderr}"
    # One line each, never the 5000 characters, never a raw NUL or newline from the name.
    assert all(len(line) < 600 for line in done.stdout.splitlines())
    assert "\x00" not in done.stdout
    assert not data.exists(), f"validate created {sorted(os.listdir(data))}"


@pytest.mark.parametrize(
    ("field", "value", "sentence"),
    [
        (
            "task",
            "/../../x/victim",
            'the task name "/../../x/victim" contains "/"; it must be a single name, not a path',
        ),
        ("group", "..", 'the group name ".." is not a usable name: it would point at a directory, not name a new one'),
        ("job", "n" * 5000, "the job name is 5000 bytes long; names become directory names and may be at most 255"),
        ("csi_plugin", "a\\u0000b", 'csi_plugin.id "a\\x00b" contains a NUL character'),
        ("source", "a/b", 'source "a/b" contains "/"; it must be a single name, not a path'),
        ("volume", "", "the volume name is empty; give it a name (it becomes a directory name)"),
    ],
)
def test_the_sentences(tmp_path: Path, field: str, value: str, sentence: str) -> None:
    job, client, _ = files(tmp_path, field, value)
    done = run_cli("validate", str(job), "--client", str(client))
    assert sentence in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("field", list(FIELDS))
def test_run_refuses_before_anything_is_created(tmp_path: Path, field: str) -> None:
    job, client, data = files(tmp_path, field, "/../../x/victim")
    done = run_cli("run", str(job), "--client", str(client))
    assert done.returncode == 2, done.stdout + done.stderr  # refused before anything started
    assert "Traceback" not in done.stdout + done.stderr
    assert refusal_lines(done.stdout, FIELDS[field]), done.stdout + done.stderr
    assert not data.exists() or not (data / "allocs").exists()
    assert not (tmp_path.parent / "x").exists()


def test_a_hostile_volume_file_is_refused_naming_the_field(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for field, value, words in (
        ("id", "../../victim", 'id "../../victim" contains "/"'),
        ("plugin_id", "..", 'plugin_id ".." is not a usable name'),
        ("namespace", "a/b", 'namespace "a/b" contains "/"'),
    ):
        spec = {"id": "vol", "plugin_id": "plug", "namespace": "default", field: value}
        volume = tmp_path / f"{field}.hcl"
        body = "".join(f'{k} = "{v}"\n' for k, v in spec.items())
        volume.write_text(
            body + 'capability {\n  access_mode = "single-node-writer"\n  attachment_mode = "file-system"\n}\n'
        )
        done = run_cli("volume", "--data-dir", str(data), "register", str(volume))
        assert done.returncode == 1, done.stdout + done.stderr
        assert words in done.stderr
        assert "Traceback" not in done.stderr
    assert not (data / "state.db").exists() or "victim" not in (data / "state.db").read_bytes().decode("latin-1")


# --- the one name check, and resolve_under ------------------------------------------------------


def test_check_name_takes_a_single_component() -> None:
    assert check_name("web-1.v2_ok", "x") is None
    assert check_name("ünïcode", "x") is None
    assert check_name("n" * NAME_MAX, "x") is None
    # NAME_MAX counts bytes: 128 two-byte characters are 256 bytes.
    assert check_name("é" * 128, "the task name") == (
        "the task name is 256 bytes long; names become directory names and may be at most 255 bytes"
    )
    for bad in ("", ".", "..", "a/b", "/", "a\x00", "a\tb", "\x7f", "a\udc80"):
        assert check_name(bad, "the task name") is not None, bad
    assert check_name(5, "the task name") == "the task name must be a string, not int"


def test_resolve_under_keeps_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    assert resolve_under(str(root), "a", "b", what="x") == str(root / "a" / "b")
    assert resolve_under(str(root), what="x") == str(root)


def test_resolve_under_refuses_dotdot(tmp_path: Path) -> None:
    with pytest.raises(UnsafePathError, match=r"the task dir resolves to .*, outside .*; refusing to use it"):
        resolve_under(str(tmp_path), "a", "..", "..", "victim", what="the task dir")


def test_resolve_under_refuses_an_absolute_part(tmp_path: Path) -> None:
    with pytest.raises(UnsafePathError, match='the task dir: "/etc" is an absolute path where a name under'):
        resolve_under(str(tmp_path), "/etc", what="the task dir")


def test_resolve_under_refuses_a_symlink_out_of_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "link").symlink_to(outside)
    with pytest.raises(UnsafePathError, match=f"resolves to {outside}/f, outside {root}"):
        resolve_under(str(root), "link", "f", what="the log file")
    # A symlink that stays inside is followed, and the resolved path returned.
    (root / "inner").mkdir()
    (root / "in").symlink_to(root / "inner")
    assert resolve_under(str(root), "in", "f", what="x") == str(root / "inner" / "f")


def test_resolve_under_refuses_nul(tmp_path: Path) -> None:
    with pytest.raises(UnsafePathError, match="contains a NUL character"):
        resolve_under(str(tmp_path), "a\x00b", what="x")


def test_resolve_under_a_root_that_is_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "root").symlink_to(real)
    assert resolve_under(str(tmp_path / "root"), "a", what="x") == str(real / "a")
