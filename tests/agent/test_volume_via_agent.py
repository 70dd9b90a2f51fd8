"""The `volume` and `plugin status` commands through a running agent's HTTP API, against a real
agent that runs the reference hostpath CSI plugin as an exec task and a docker task that claims a
volume: register, status, create and delete through the plugin, the refusals of deregister,
delete and detach while the volume is claimed, snapshots, plugin status. The CLI is pointed at an
empty data dir: everything it shows comes from the agent, and it never opens a state.db itself.
A volume's secrets and mount flags reach the agent and never come back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from driversdk.agent.api.csivolumejson import VolumeJSONError, volume_from_api, volume_to_api
from driversdk.agent.csi.volumes import parse_volume_file
from driversdk.cli.apiclient import APIRequestError
from tests.agent.agentproc import ROOT, AgentProcess, free_port, http_call, write_config
from tests.agent.csienv import Env, app_group, plugin_group, purge_job, running_csi_agent

SECRET = "s3cr3t-token-value"
FLAG = "password=hunter2"

VOLUME_FILE = f"""
id = "vol"
name = "the volume"
plugin_id = "hostpath"
external_id = "vol"
capability {{
  access_mode = "single-node-writer"
  attachment_mode = "file-system"
}}
secrets {{
  token = "{SECRET}"
}}
mount_options {{
  fs_type = "ext4"
  mount_flags = ["{FLAG}"]
}}
parameters {{
  kind = "fast"
}}
"""

# What a volume file may say beyond VOLUME_FILE.
EVERY_FIELD = """
namespace = "prod"
capacity_min = "1GiB"
capacity_max = "2GiB"
snapshot_id = "snap-1"
context {
  a = "b"
}
topology_request {
  required {
    topology { segments { rack = "r1" } }
  }
  preferred {
    topology { segments { zone = "z" } }
  }
}
"""

CREATE_FILE = """
id = "made"
plugin_id = "hostpath"
capacity_min = "1MiB"
capacity_max = "2MiB"
capability {
  access_mode = "single-node-writer"
  attachment_mode = "file-system"
}
"""


def test_csivolume_json_round_trip_keeps_every_field(tmp_path: Path) -> None:
    spec = tmp_path / "v.hcl"
    spec.write_text(VOLUME_FILE.replace('external_id = "vol"', 'external_id = "vol"\n' + EVERY_FIELD))
    volume = parse_volume_file(spec)
    assert volume.requested_topologies.required and volume.requested_topologies.preferred
    sent = json.loads(json.dumps(volume_to_api(volume)))  # what goes over the wire
    assert sent["Secrets"] == {"token": SECRET} and sent["MountOptions"]["MountFlags"] == [FLAG]
    assert volume_from_api(sent) == volume


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"ID": ""}, "missing ID"),
        ({"ID": "../etc"}, "ID"),
        ({"PluginID": 7}, "PluginID must be a string"),
        ({"RequestedCapabilities": []}, "at least one RequestedCapabilities"),
        ({"RequestedCapabilities": [{"AccessMode": "bogus", "AttachmentMode": "file-system"}]}, "bogus"),
        ({"Secrets": {"a": 1}}, "Secrets must be an object of strings"),
        ({"RequestedCapacityMin": -1}, "RequestedCapacityMin must be a number"),
        ({"SnapshotID": "s", "CloneID": "c"}, "only one of SnapshotID and CloneID"),
    ],
)
def test_csivolume_json_refuses_what_a_volume_file_may_not_say(
    tmp_path: Path, change: dict[str, object], needle: str
) -> None:
    spec = tmp_path / "v.hcl"
    spec.write_text(VOLUME_FILE)
    with pytest.raises(VolumeJSONError) as err:
        volume_from_api({**volume_to_api(parse_volume_file(spec)), **change})
    assert needle in str(err.value) and SECRET not in str(err.value)


pytestmark_root = pytest.mark.skipif(os.geteuid() != 0, reason="CSI runs mount and run runc: root only")


@pytest.fixture
def csi_agent(agent_dir: Path) -> Iterator[tuple[Env, AgentProcess]]:
    with running_csi_agent(agent_dir) as both:
        yield both


class CLI:
    """The CLI as an operator runs it against the agent: NOMAD_ADDR set, the data dir an empty one."""

    def __init__(self, process: AgentProcess, empty: Path) -> None:
        self.process = process
        self.empty = empty

    def __call__(self, *args: str, importtime: bool = False, flag: bool = False) -> subprocess.CompletedProcess[str]:
        """``flag``: the agent named with -address instead of NOMAD_ADDR."""
        python = [sys.executable, "-X", "importtime"] if importtime else [sys.executable]
        env = {k: v for k, v in os.environ.items() if k != "NOMAD_ADDR"}
        where = ["-address", self.process.address] if flag else []
        return subprocess.run(
            [*python, "-m", "driversdk.cli", *args, *where, "--data-dir", str(self.empty)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=240,
            env=env if flag else {**env, "NOMAD_ADDR": self.process.address},
        )


def _imported(stderr: str) -> set[str]:
    """Module names of ``-X importtime`` lines."""
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytestmark_root
def test_volume_and_plugin_commands_go_through_the_agent(csi_agent: tuple[Env, AgentProcess]) -> None:
    env, process = csi_agent
    client = process.client()
    empty = env.work / "cli-data"
    empty.mkdir()
    cli = CLI(process, empty)
    (env.work / "backing" / "volumes" / "vol").mkdir(parents=True)
    spec = env.work / "vol.hcl"
    spec.write_text(VOLUME_FILE)

    done = cli("volume", "register", str(spec))
    assert (done.returncode, done.stdout.strip()) == (0, 'registered CSI volume "vol" (plugin "hostpath")'), done
    # The agent has it with its secrets and flags (they reach the plugin); no answer shows them.
    stored = client.get("/v1/volume/csi/vol")
    assert stored["Parameters"] == {"kind": "fast"} and stored["Secrets"] is None
    done = cli("volume", "register", str(spec))
    assert (done.returncode, done.stdout.strip()) == (0, 'updated CSI volume "vol" (plugin "hostpath")'), done

    done = cli("volume", "status", importtime=True)
    assert done.returncode == 0, done.stderr
    out = [line for line in done.stdout.splitlines() if line]
    assert out == [
        "default/vol  plugin=hostpath  external_id=vol  capabilities=single-node-writer/file-system  capacity=0  "
        "schedulable=false  node plugin: not registered"
    ]
    # Through the API only: no state store, no volume model, no grpc in the CLI process.
    modules = _imported(done.stderr)
    assert "driversdk.cli.volume" in modules
    assert not modules & {
        "driversdk.agent.csi.volumes",
        "driversdk.agent.state.db",
        "driversdk.agent.csi.state",
        "grpc",
    }, modules
    done = cli("volume", "status", "vol", flag=True)
    assert done.returncode == 0 and json.loads(done.stdout)["ID"] == "vol"
    done = cli("volume", "status", "--json")
    [stub] = json.loads(done.stdout)
    assert stub["ID"] == "vol" and stub["PluginID"] == "hostpath" and "CurrentWriters" in stub
    assert SECRET not in done.stdout and "hunter2" not in done.stdout
    done = cli("plugin", "status")
    assert (done.returncode, done.stdout.strip()) == (
        0,
        "no CSI plugins are registered on this client; run a job with a csi_plugin task",
    ), done

    # The plugin, run by the agent.
    process.submit('job "storage" {\n  type = "service"\n' + plugin_group() + "\n}\n")
    [plugin_alloc] = process.wait_allocs("storage", "running")
    deadline = time.monotonic() + 60
    while [p["NodesHealthy"] for p in client.get("/v1/plugins", type="csi")] != [1]:
        assert time.monotonic() < deadline, process.log()
        time.sleep(0.1)
    done = cli("plugin", "status")
    assert done.returncode == 0, done
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["csi-controller", "csi-node"], lines
    for line in lines:
        assert f"hostpath  alloc {plugin_alloc['ID'][:8]}  healthy  provider=" in line and "volumes=1" in line
    done = cli("plugin", "status", "--json")
    assert [p["ID"] for p in json.loads(done.stdout)] == ["hostpath"]

    # Create and (later) delete through the plugin's controller.
    made = env.work / "made.hcl"
    made.write_text(CREATE_FILE)
    done = cli("volume", "create", str(made))
    assert done.returncode == 0, done
    assert (
        done.stdout.startswith('created CSI volume "made" (external ID "') and "capacity 1048576 bytes" in done.stdout
    )
    assert client.get("/v1/volume/csi/made")["ExternalID"]
    made.write_text(CREATE_FILE.replace('capacity_min = "1MiB"', 'capacity_min = "2MiB"'))
    done = cli("volume", "create", str(made))
    assert (done.returncode, done.stdout.strip()) == (
        0,
        'updated CSI volume "made" (it exists already; plugin "hostpath"); expanded from 1048576 to 2097152 bytes',
    ), done

    # A docker job claims "vol": deregister, delete and detach are refused with the sentence.
    process.submit('job "app" {\n  type = "service"\n' + app_group("echo hi > /data/hello; exec sleep 300") + "\n}\n")
    [app_alloc] = process.wait_allocs("app", "running")
    short = app_alloc["ID"][:8]
    for args, doing in [(("deregister", "vol"), "deregistering"), (("delete", "vol"), "deleting")]:
        done = cli("volume", *args)
        assert done.returncode == 1, done
        assert f'volume "vol" is claimed by alloc {short} of job app (in use); stop those jobs before {doing} it' in (
            done.stderr
        ), done.stderr
        assert "Traceback" not in done.stderr
    done = cli("volume", "detach", "vol")
    assert done.returncode == 1, done
    assert f'error: alloc {short} of job app still uses volume "vol" (it is not over); stop the job first' in (
        done.stderr
    ), done.stderr
    assert client.get("/v1/volume/csi/vol")["WriteAllocs"] == {app_alloc["ID"]: None}  # nothing was released
    done = cli("volume", "status")
    assert f"  claim  alloc {short}  job app  write  in use" in done.stdout, done.stdout
    assert "default/vol  plugin=hostpath" in done.stdout and "schedulable=true  node plugin: healthy" in done.stdout

    # Snapshots of the created volume, through the controller.
    done = cli("volume", "snapshot", "create", "made", "snap-one")
    assert done.returncode == 0, done
    assert done.stdout.startswith('created snapshot "') and 'of volume "made"' in done.stdout, done.stdout
    snapshot_id = done.stdout.split('"')[1]
    done = cli("volume", "snapshot", "list", "-plugin", "hostpath")
    assert done.returncode == 0, done
    [row] = [line for line in done.stdout.splitlines() if line.startswith(snapshot_id)]
    assert "plugin=hostpath  volume=made" in row and row.endswith("ready"), row
    done = cli("volume", "snapshot", "list", "--json")
    assert [s["ID"] for s in json.loads(done.stdout)] == [snapshot_id]
    done = cli("volume", "snapshot", "delete", "hostpath", snapshot_id)
    assert (done.returncode, done.stdout.strip()) == (0, f'deleted snapshot "{snapshot_id}" of CSI plugin "hostpath"')
    done = cli("volume", "snapshot", "delete", "hostpath", snapshot_id)
    assert done.returncode == 1 and f'has no snapshot "{snapshot_id}", so nothing was deleted' in done.stderr

    done = cli("volume", "delete", "made")
    assert done.returncode == 0 and done.stdout.startswith('deleted CSI volume "made" (external ID "'), done
    with pytest.raises(APIRequestError) as err:
        client.get("/v1/volume/csi/made")
    assert err.value.status == 404

    # Once the job is stopped, the claim is released and the volume can go.
    purge_job(process, "app")
    done = cli("volume", "detach", "vol")
    assert done.returncode == 0, done
    done = cli("volume", "deregister", "vol")
    assert (done.returncode, done.stdout.strip()) == (0, 'deregistered CSI volume "vol"'), done
    done = cli("volume", "status")
    assert (done.returncode, done.stdout.strip()) == (0, "no CSI volumes registered"), done
    done = cli("volume", "deregister", "vol")
    assert done.returncode == 1 and 'volume "vol" is not registered in namespace "default"' in done.stderr
    # The CLI never made a state store of its own.
    assert list(empty.iterdir()) == []
    purge_job(process, "storage")


def test_write_endpoints_refuse_bad_bodies_and_never_answer_secrets(agent: AgentProcess, tmp_path: Path) -> None:
    client = agent.client()
    spec = tmp_path / "v.hcl"
    spec.write_text(VOLUME_FILE)
    body = volume_to_api(parse_volume_file(spec))
    for path, payload, needle in [
        ("/v1/volume/csi/other", {"Volumes": [body]}, 'the path names "other"'),
        ("/v1/volume/csi/vol", {"Volumes": []}, "exactly one volume"),
        ("/v1/volume/csi/vol", {"Volumes": [{**body, "PluginID": ""}]}, "missing PluginID"),
        ("/v1/volume/csi/vol/create", {"Volumes": [{**body, "ExternalID": ""}]}, "no controller instance"),
    ]:
        with pytest.raises(APIRequestError) as err:
            client.request("PUT", path, body=payload)
        assert err.value.status == 400 and needle in str(err.value), str(err.value)
        assert SECRET not in str(err.value)
    assert client.get("/v1/volumes", type="csi") == []  # nothing half-registered

    answer, _ = client.request("PUT", "/v1/volume/csi/vol", body={"Volumes": [body]})
    text = json.dumps(answer)
    assert answer["Volumes"][0]["ID"] == "vol" and SECRET not in text and "hunter2" not in text
    with pytest.raises(APIRequestError) as err:
        client.request("DELETE", "/v1/volume/csi/vol/detach")
    assert (err.value.status, str(err.value)) == (400, "detach requires node ID")
    with pytest.raises(APIRequestError) as err:
        client.request("DELETE", "/v1/volume/csi/vol", {"force": "maybe"})
    assert (err.value.status, str(err.value)) == (400, "invalid force value")
    with pytest.raises(APIRequestError) as err:
        client.request("DELETE", "/v1/volumes/snapshot", {"plugin_id": "hostpath"})
    assert err.value.status == 400
    client.request("DELETE", "/v1/volume/csi/vol")
    with pytest.raises(APIRequestError) as err:
        client.request("DELETE", "/v1/volume/csi/vol")
    assert (err.value.status, str(err.value)) == (404, "volume not found")


def test_a_socket_nobody_answers_on_is_no_agent(tmp_path: Path) -> None:
    """A data dir whose agent.sock is left from an agent that is gone: the command works on the
    data dir, as with no agent."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "agent.sock").write_text("")  # not a listening socket
    env = {k: v for k, v in os.environ.items() if k != "NOMAD_ADDR"}
    done = subprocess.run([sys.executable, "-m", "driversdk.cli", "volume", "status", "--data-dir", str(data)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60, env=env)  # fmt: skip
    assert (done.returncode, done.stdout.strip()) == (0, "no CSI volumes registered"), done.stderr


def test_a_named_agent_that_does_not_answer_is_an_error_not_the_data_dir(tmp_path: Path) -> None:
    """-address / NOMAD_ADDR is the operator's choice: when nothing answers there, the command says
    so (exit 1, one sentence) instead of quietly writing the local data dir."""
    data = tmp_path / "data"
    data.mkdir()
    spec = tmp_path / "v.hcl"
    spec.write_text(VOLUME_FILE)
    gone = f"unix://{tmp_path / 'nobody.sock'}"
    for args in (["volume", "register", str(spec)], ["volume", "status"], ["plugin", "status"]):
        done = subprocess.run([sys.executable, "-m", "driversdk.cli", *args, "-address", gone, "--data-dir", str(data)],
                              capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
        assert done.returncode == 1, done
        assert done.stderr.startswith(f"error: cannot reach the driversdk agent at {gone}") and "Traceback" not in (
            done.stderr
        ), done.stderr
    assert list(data.iterdir()) == []


def test_over_tcp_with_acls_the_volume_commands_need_the_token(agent_dir: Path, tmp_path: Path) -> None:
    """Without the token, or with a wrong one, a volume command is refused (403, one sentence) and
    changes nothing; with -token or NOMAD_TOKEN it goes through."""
    port = free_port()
    process = AgentProcess(agent_dir / "data", config=write_config(agent_dir, port, acl=True)).start()
    try:
        status, token = http_call(port, "POST", "/v1/acl/bootstrap")
        assert status == 200
        secret = token["SecretID"]
        spec = tmp_path / "v.hcl"
        spec.write_text(VOLUME_FILE)
        empty = tmp_path / "cli-data"
        empty.mkdir()
        base = {k: v for k, v in os.environ.items() if k not in ("NOMAD_ADDR", "NOMAD_TOKEN")}
        base["NOMAD_ADDR"] = f"http://127.0.0.1:{port}"

        def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "driversdk.cli", *args, "--data-dir", str(empty)],
                                  capture_output=True, text=True, cwd=ROOT, timeout=60, env=env or base)  # fmt: skip

        for extra in ([], ["-token", "00000000-0000-0000-0000-000000000000"], ["-token", secret[:-1]]):
            done = cli("volume", "register", str(spec), *extra)
            assert (done.returncode, done.stderr.strip()) == (1, "error: Permission denied"), done
        assert process.client().get("/v1/volumes", type="csi") == []  # the socket agrees: nothing registered
        done = cli("volume", "register", str(spec), "-token", secret)
        assert (done.returncode, done.stdout.strip()) == (0, 'registered CSI volume "vol" (plugin "hostpath")'), done
        done = cli("volume", "deregister", "vol")
        assert (done.returncode, done.stderr.strip()) == (1, "error: Permission denied"), done
        done = cli("volume", "status", env={**base, "NOMAD_TOKEN": secret})
        assert done.returncode == 0 and done.stdout.startswith("default/vol  plugin=hostpath"), done
        done = cli("volume", "deregister", "vol", env={**base, "NOMAD_TOKEN": secret})
        assert (done.returncode, done.stdout.strip()) == (0, 'deregistered CSI volume "vol"'), done
        assert list(empty.iterdir()) == []
    finally:
        process.close()
