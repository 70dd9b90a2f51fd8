"""validate and run agree: what `driversdk run` would crash or misbehave on, `driversdk validate`
refuses first with one sentence; and no command shows an operator a traceback unless --debug."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.runs import run_cli


def job(tmp_path: Path, task: str = "", group: str = "", extra: str = "", driver: str = "nosuch") -> Path:
    """One group, one task; the driver is not configured unless a test asks for a real one, so the
    rules under test are reached without launching a plugin."""
    path = tmp_path / "job.hcl"
    path.write_text(f"""job "shop" {{
  group "web" {{
    {group}
    task "web" {{
      driver = "{driver}"
      {task}
    }}
  }}
  {extra}
}}
""")
    return path


def client(tmp_path: Path, text: str = "") -> Path:
    path = tmp_path / "client.hcl"
    path.write_text(text or f'data_dir = "{tmp_path / "data"}"\n')
    return path


def validate(tmp_path: Path, job_file: Path, client_file: Path | None = None) -> subprocess.CompletedProcess[str]:
    client_file = client_file or client(tmp_path)
    done = run_cli("validate", str(job_file), "--client", str(client_file))
    assert "Traceback" not in done.stdout + done.stderr
    # Problems found in the job and client files name their line (job.hcl:3); these tests match the rest.
    for path in (job_file, client_file):
        done.stdout = re.sub(rf"{re.escape(str(path))}:\d+", str(path), done.stdout)
    assert not (tmp_path / "data").exists(), "validate created the data dir"
    return done


WHERE = 'error {job}, job "shop", group "web"'


@pytest.mark.parametrize(
    ("group", "sentence"),
    [
        ("count = -1", "count can't be negative, got -1"),
        ("count = 1001", "count 1001 is more than this runner starts on one machine (at most 1000)"),
        ("count = 1.5", "count must be a whole number, got 1.5"),
        ('count = "three"', 'count must be a number, got "three"'),
    ],
)
def test_count(tmp_path: Path, group: str, sentence: str) -> None:
    path = job(tmp_path, group=group)
    done = validate(tmp_path, path)
    assert done.returncode == 1
    assert f"{WHERE.format(job=path)}: {sentence}\n" in done.stdout, done.stdout


def test_count_zero_is_valid_and_says_what_run_does(tmp_path: Path) -> None:
    path = job(tmp_path, group="count = 0", driver="exec", task='config {\n  command = "/bin/true"\n}')
    done = validate(tmp_path, path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'ok    group "web": count = 0, `driversdk run` starts no allocation of it\n' in done.stdout


@pytest.mark.parametrize(
    ("resources", "sentence"),
    [
        ("memory = 5", "resources: minimum MemoryMB value is 10; got 5"),
        ("cpu = 0", "resources: minimum CPU value is 1; got 0"),
        ("cpu = -20", "resources: minimum CPU value is 1; got -20"),
        ("cpu = 300000", "resources: cpu 300000 is more than Linux allows as cpu shares (at most 262144)"),
        ("memory = 2000000000", "resources: memory 2000000000 MB is more than any host has (at most 1073741824 MB)"),
        (
            "memory = 300\nmemory_max = 100",
            "resources: MemoryMaxMB value (100) should be larger than MemoryMB value (300)",
        ),
        # -1 is Nomad's "no hard limit"; any other negative value is below memory.
        ("memory_max = -5", "resources: MemoryMaxMB value (-5) should be larger than MemoryMB value (300)"),
        ("memory = 1e999", "resources.memory must be a whole number, got a number too large to use"),
    ],
)
def test_resources(tmp_path: Path, resources: str, sentence: str) -> None:
    path = job(tmp_path, task=f"resources {{\n{resources}\n}}")
    done = validate(tmp_path, path)
    assert done.returncode == 1
    assert f'{WHERE.format(job=path)}, task "web": {sentence}\n' in done.stdout, done.stdout


def test_duplicate_groups(tmp_path: Path) -> None:
    path = job(tmp_path, extra='group "web" {\n  task "other" {\n    driver = "nosuch"\n  }\n}')
    done = validate(tmp_path, path)
    assert done.returncode == 1
    line = f'error {path}, job "shop": group 2 redefines "web" from group 1; give each group its own name\n'
    assert line in done.stdout, done.stdout


def test_duplicate_tasks_in_a_group(tmp_path: Path) -> None:
    path = job(tmp_path, group='task "web" {\n  driver = "nosuch"\n}')
    done = validate(tmp_path, path)
    assert done.returncode == 1
    sentence = 'task 2 redefines "web" from task 1; give each task in a group its own name'
    assert f"{WHERE.format(job=path)}: {sentence}\n" in done.stdout, done.stdout


def test_duplicate_volumes_in_a_group(tmp_path: Path) -> None:
    volume = 'volume "v" {\n  type = "host"\n  source = "s"\n}\n'
    path = job(tmp_path, group=volume + volume)
    done = validate(tmp_path, path)
    assert done.returncode == 1
    sentence = 'volume "v": volume is declared twice in this group; give each its own name'
    assert f"{WHERE.format(job=path)}, {sentence}\n" in done.stdout, done.stdout


@pytest.mark.parametrize(
    ("task", "sentence"),
    [
        ('kill_timeout = "5 minutes"', 'kill_timeout \'5 minutes\' is not a duration such as "30s" or "1m30s"'),
        ('kill_timeout = "."', 'kill_timeout \'.\' is not a duration such as "30s" or "1m30s"'),
        ("kill_timeout = true", 'kill_timeout must be a duration such as "30s", got true'),
        (
            'csi_plugin {\n  id = "p"\n  type = "node"\n  health_timeout = "soon"\n}',
            'csi_plugin.health_timeout \'soon\' is not a duration such as "30s" or "1m30s"',
        ),
        (
            'kill_signal = "SIGFOO"',
            "kill_signal: failed to parse signal: unknown signal 'SIGFOO'; use a name such as SIGTERM",
        ),
        ('kill_signal = "SIG_IGN"', "kill_signal: failed to parse signal: unknown signal 'SIG_IGN'"),
        ("logs {\n  max_files = 0\n}", "logs: minimum number of files is 1; got 0"),
        ('destination_is_checked = 1\nvolume_mount {\n  volume = "v"\n  destination = "/../etc"\n}', None),
    ],
)
def test_durations_signals_logs(tmp_path: Path, task: str, sentence: str | None) -> None:
    if sentence is None:  # a mount destination that climbs out of the task
        task = task.replace("destination_is_checked = 1\n", "")
        path = job(tmp_path, task=task, group='volume "v" {\n  type = "host"\n  source = "s"\n}')
        sentence = 'volume_mount[0]: destination "/../etc" must be a plain path inside the task'
        done = validate(tmp_path, path)
        assert f'{WHERE.format(job=path)}, task "web", {sentence}' in done.stdout, done.stdout
        return
    path = job(tmp_path, task=task)
    done = validate(tmp_path, path)
    assert done.returncode == 1
    assert f'{WHERE.format(job=path)}, task "web": {sentence}' in done.stdout, done.stdout


def test_a_signal_and_duration_are_refused_and_their_good_spellings_accepted(tmp_path: Path) -> None:
    path = job(tmp_path, task='kill_timeout = "90 s"\nkill_signal = "TERMINATE"')
    done = validate(tmp_path, path)
    assert len([line for line in done.stdout.splitlines() if line.startswith("error")]) == 3, done.stdout
    path = job(tmp_path, task='kill_timeout = "1m30s"\nkill_signal = "term"')
    done = validate(tmp_path, path)
    # Only the unconfigured driver is left.
    assert [line for line in done.stdout.splitlines() if line.startswith("error")] == [
        f'error {path}, job "shop", driver: no plugin is configured for driver "nosuch"; add plugin "nosuch" '
        "{ command = [...] } to the client config or use a bundled driver (docker, exec, raw_exec)"
    ]


# --- files that are not UTF-8 ------------------------------------------------------------------


def test_a_job_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "job.hcl"
    path.write_bytes(b'job "caf\xe9" {\n}\n')
    done = validate(tmp_path, path)
    assert done.returncode == 1
    assert done.stderr == f"error: {path}:1: the file is not UTF-8 text (byte 0xe9 at offset 8); save it as UTF-8\n"


def test_a_client_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = client(tmp_path)
    path.write_bytes(b'data_dir = "/tmp"\n# \xff\n')
    done = validate(tmp_path, job(tmp_path), path)
    assert done.returncode == 1
    assert done.stderr == f"error: {path}:2: the file is not UTF-8 text (byte 0xff at offset 20); save it as UTF-8\n"


def test_a_volume_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "vol.hcl"
    path.write_bytes(b'id = "\xfe"\n')
    done = run_cli("volume", "--data-dir", str(tmp_path / "data"), "register", str(path))
    assert done.returncode == 1
    assert done.stderr == f"error: {path}:1: the file is not UTF-8 text (byte 0xfe at offset 6); save it as UTF-8\n"


# --- client config values of the wrong type ----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        ("data_dir = 42", "data_dir must be an absolute path in quotes, not 42"),
        (
            'data_dir = "relative/dir"',
            'data_dir "relative/dir" must be an absolute path (it would depend on the directory driversdk runs in)',
        ),
        ("data_dir = true", "data_dir must be an absolute path in quotes, not True"),
        (
            'host_volume "s" {\n  path = "/srv"\n  read_only = "yes"\n}',
            'host_volume "s": read_only must be true or false, not "yes" (Nomad also reads "true", "false", 1 and 0)',
        ),
        ('plugin "x" {\n  command = "/bin/x"\n}', 'plugin "x": command must be a list of strings, not "/bin/x"'),
        (
            'plugin "x" {\n  command = ["/bin/x"]\n  args = [1]\n}',
            'plugin "x": args must be a list of strings, not [1]',
        ),
        ('plugin "x" {\n  config = 5\n}', 'plugin "x": config must be a block (config { … }), not 5'),
        (
            'plugin "docker" {\n  gc = false\n}',
            "plugin \"docker\": unsupported argument or block 'gc'; use command, args and config { … }",
        ),
        ('client = "x"', 'client must be a block (client { … }), not "x"'),
    ],
)
def test_client_config_types_are_refused_not_coerced(tmp_path: Path, text: str, sentence: str) -> None:
    path = client(tmp_path, text + "\n")
    done = validate(tmp_path, job(tmp_path), path)
    assert done.returncode == 1
    # A block's problem is located at the block (file, block: sentence), others at the file.
    located = f"{path}, {sentence}" if sentence.startswith(("host_volume", "plugin")) else f"{path}: {sentence}"
    assert f"error {located}\n" in done.stdout, done.stdout + done.stderr


def test_a_plugin_config_block_given_as_a_bool_is_refused(tmp_path: Path) -> None:
    """`gc = false` used to become the gc block's defaults: image garbage collection on."""
    path = client(
        tmp_path, f'data_dir = "{tmp_path / "data"}"\nplugin "docker" {{\n  config {{\n    gc = false\n  }}\n}}\n'
    )
    done = validate(tmp_path, job(tmp_path, driver="docker", task='config {\n  image = "busybox:1"\n}'), path)
    assert done.returncode == 1
    sentence = 'driver "docker" could not be loaded: plugin "docker" config.gc must be a block (gc { … }), not false'
    assert f'error {path}, job "shop", plugin "docker": {sentence}' in done.stdout, done.stdout + done.stderr


# --- other commands ----------------------------------------------------------------------------


def test_probe_with_bad_json_config(tmp_path: Path) -> None:
    done = run_cli("plugin", "probe", "--config", "{gc: false}", "--", sys.executable, "-m", "drivers.docker")
    assert done.returncode == 1
    assert done.stderr == (
        "error: --config is not valid JSON (Expecting property name enclosed in double quotes at line 1 column 2); "
        'give the plugin config as a JSON object, e.g. --config \'{"gc": {"image": false}}\'\n'
    )
    done = run_cli("plugin", "probe", "--config", "[1]", "--", sys.executable, "-m", "drivers.docker")
    assert done.stderr == "error: --config must be a JSON object ({...}), not list\n"


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["logs", "web"],
        ["volume", "status"],
        ["volume", "status", "v1"],
        ["volume", "deregister", "v1"],
        ["plugin", "status"],
    ],
    ids=lambda c: " ".join(c),
)
def test_read_only_commands_on_a_missing_data_dir_create_nothing(tmp_path: Path, command: list[str]) -> None:
    missing = tmp_path / "nope"
    if command[0] == "volume":
        args = ["volume", "--data-dir", str(missing), *command[1:]]
    else:
        args = [*command, "--data-dir", str(missing)]
    done = run_cli(*args)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == (
        f"error: data dir {missing} does not exist; nothing has been run with it "
        "(check --data-dir or the client config's data_dir)\n"
    )
    assert not missing.exists()


def test_the_data_dir_from_the_client_config_too(tmp_path: Path) -> None:
    path = client(tmp_path)
    done = run_cli("status", "--client", str(path))
    assert done.returncode == 1
    assert "does not exist; nothing has been run with it" in done.stderr
    assert not (tmp_path / "data").exists()


def test_an_unexpected_error_is_one_sentence_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    """A data_dir that is a file: registering a volume cannot create its state there."""
    data = tmp_path / "data"
    data.write_text("not a directory\n")
    volume = tmp_path / "vol.hcl"
    volume.write_text(
        'id = "v1"\nplugin_id = "p"\ncapability {\n  access_mode = "single-node-writer"\n'
        '  attachment_mode = "file-system"\n}\n'
    )
    done = run_cli("volume", "--data-dir", str(data), "register", str(volume))
    assert done.returncode == 1
    assert done.stderr == (
        f"error: `driversdk volume register` failed unexpectedly: FileExistsError: File exists ({data}); "
        "run again with --debug for the traceback\n"
    )
    debug = run_cli("--debug", "volume", "--data-dir", str(data), "register", str(volume))
    assert debug.returncode == 1
    assert debug.stderr.startswith("Traceback (most recent call last):\n")
    assert "FileExistsError" in debug.stderr
    assert debug.stderr.endswith(
        f"error: `driversdk volume register` failed unexpectedly: FileExistsError: File exists ({data})\n"
    )
