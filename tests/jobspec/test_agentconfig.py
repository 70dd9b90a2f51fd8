"""Agent configs as Nomad writes them: HCL1 with quoted and dotted keys, whole agent files, every
option of Nomad's docker and exec plugin config known; wrong types still refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from driversdk.jobspec.clientconfig import load_client
from driversdk.jobspec.problems import ValidationFailed

AGENT = """
# A whole agent file, as Nomad's docs write them
datacenter = "dc1"
data_dir   = "{data}"
bind_addr  = "0.0.0.0"
log_level  = "INFO"

server {
  enabled          = true
  bootstrap_expect = 1
}

client {
  enabled = true
  servers = ["127.0.0.1:4647"]
  options {
    "docker.privileged.enabled" = "true"
    "driver.raw_exec.enable"    = "1"
  }
  meta {
    "rack" = "r1"
  }
  host_volume "shared" {
    path      = "{shared}"
    read_only = false
  }
  host_volume "certs" {
    path      = "{shared}"
    read_only = true
  }
}

consul {
  address = "127.0.0.1:8500"
}

vault {
  enabled = false
}

telemetry {
  collection_interval        = "1s"
  publish_allocation_metrics = true
}

acl {
  enabled = false
}

ports {
  http = 4646
}

plugin "docker" {
  config {
    endpoint         = "unix:///var/run/docker.sock"
    allow_privileged = true
    allow_caps       = ["audit_write", "chown"]
    volumes {
      enabled      = true
      selinuxlabel = "z"
    }
    gc {
      image       = true
      image_delay = "3m"
      container   = true
      dangling_containers {
        enabled        = true
        dry_run        = false
        period         = "5m"
        creation_grace = "5m"
      }
    }
    infra_image    = "registry.k8s.io/pause-amd64:3.3"
    allow_runtimes = ["runc", "nvidia"]
    logging {
      type = "json-file"
    }
  }
}

plugin "exec" {
  config {
    default_pid_mode = "private"
    default_ipc_mode = "private"
    no_pivot_root    = false
  }
}
"""


def agent(tmp_path: Path, text: str = AGENT) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    path = tmp_path / "agent.hcl"
    path.write_text(text.replace("{data}", str(tmp_path / "data")).replace("{shared}", str(shared)))
    return path


def test_a_whole_agent_file_loads_with_one_note(tmp_path: Path) -> None:
    path = agent(tmp_path)
    cfg = load_client(path)
    assert cfg.data_dir == str(tmp_path / "data")
    assert sorted(cfg.host_volumes) == ["certs", "shared"]
    assert cfg.host_volumes["certs"].read_only
    assert cfg.plugins["docker"].config["gc"]["dangling_containers"]["dry_run"] is False
    assert cfg.plugins["exec"].config["no_pivot_root"] is False
    assert cfg.datacenter == "dc1" and cfg.meta
    assert len(cfg.notes) == 1
    assert cfg.notes[0] == (
        f"{path}: not used by driversdk: bind_addr, log_level, server, consul, vault, telemetry, acl, "
        "ports, client.enabled, client.servers, client.options"
    )


def test_unknown_plugin_options_are_separate_problems_with_did_you_mean(tmp_path: Path) -> None:
    text = AGENT.replace("allow_privileged = true", "allow_privilege = true\n    gcc = 1").replace(
        "dry_run        = false", "dryrun = false"
    )
    with pytest.raises(ValidationFailed) as caught:
        load_client(agent(tmp_path, text))
    found = [(p.field, p.message) for p in caught.value.problems]
    assert found == [
        (
            'plugin "docker" config.allow_privilege',
            'unknown option \'allow_privilege\' for driver "docker"; did you mean "allow_privileged"?',
        ),
        ('plugin "docker" config.gcc', 'unknown option \'gcc\' for driver "docker"; did you mean "gc"?'),
        (
            'plugin "docker" config.gc.dangling_containers.dryrun',
            'unknown option \'dryrun\' in gc.dangling_containers for driver "docker"; did you mean "dry_run"?',
        ),
    ]


def test_an_unknown_agent_option_is_a_problem(tmp_path: Path) -> None:
    with pytest.raises(ValidationFailed) as caught:
        load_client(agent(tmp_path, AGENT.replace('log_level  = "INFO"', 'log_levl = "INFO"')))
    assert [p.message for p in caught.value.problems] == [
        "unknown agent option 'log_levl'; did you mean \"log_level\"?"
    ]


@pytest.mark.parametrize(
    ("text", "sentence"),
    [
        ("data_dir = 42", "data_dir must be an absolute path in quotes, not 42"),
        (
            'host_volume "s" {\n  path = "/srv"\n  read_only = "yes"\n}',
            'read_only must be true or false, not "yes" (Nomad also reads "true", "false", 1 and 0)',
        ),
        ('plugin "x" {\n  command = "/bin/x"\n}', 'command must be a list of strings, not "/bin/x"'),
    ],
)
def test_values_of_the_wrong_type_are_refused_not_coerced(tmp_path: Path, text: str, sentence: str) -> None:
    path = tmp_path / "c.hcl"
    path.write_text(text + "\n")
    with pytest.raises(ValidationFailed) as caught:
        load_client(path)
    assert [p.message for p in caught.value.problems] == [sentence]


@pytest.mark.parametrize(("written", "read_only"), [('"true"', True), ('"FALSE"', False), ("1", True), ("0", False)])
def test_a_bool_written_as_nomads_agent_decoder_reads_one_is_accepted(
    tmp_path: Path, written: str, read_only: bool
) -> None:
    # HCL1, which decodes Nomad's agent config, reads "true"/"false" (any case) and 1/0 as bools:
    # real configs write read_only = "false" and Nomad runs them.
    path = tmp_path / "c.hcl"
    path.write_text(f'client {{\n  host_volume "s" {{\n    path = "/srv"\n    read_only = {written}\n  }}\n}}\n')
    assert load_client(path).host_volumes["s"].read_only is read_only


def test_keys_nomad_accepts_at_the_top_level_without_using_them_load(tmp_path: Path) -> None:
    # Nomad drops these names from its unknown-key check (HCL1 reports nested keys at the top
    # level too), so a file that writes one at the top level loads there, and here.
    path = tmp_path / "c.hcl"
    path.write_text('server_join {\n  retry_join = ["10.0.0.1"]\n}\nmeta {\n  rack = "r1"\n}\n')
    cfg = load_client(path)
    assert cfg.meta == {}  # ignored at the top level, as Nomad ignores it
