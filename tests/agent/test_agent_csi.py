"""The agent's CSI endpoints in Nomad's shapes, against the real reference hostpath plugin run by
the agent as an exec task and a docker task that mounts a registered volume: the volume list and
read (with its writer's allocation, never its secrets), the plugin list and read (with each
instance's fingerprint), and Nomad's codes for what is not there."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driversdk.cli.apiclient import APIRequestError
from tests.agent.agentproc import AgentProcess
from tests.agent.csienv import Env, app_group, plugin_group, running_csi_agent

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="CSI runs mount and run runc: root only")

SECRET = "s3cr3t-token-value"
FLAG = "password=hunter2"


@pytest.fixture
def csi_agent(agent_dir: Path) -> Iterator[tuple[Env, AgentProcess]]:
    with running_csi_agent(agent_dir) as both:
        yield both


def register_volume(env: Env) -> None:
    (env.work / "backing" / "volumes" / "vol").mkdir(parents=True, exist_ok=True)
    spec = env.work / "vol.hcl"
    spec.write_text(
        'id = "vol"\nname = "the volume"\nplugin_id = "hostpath"\nexternal_id = "vol"\n'
        'capability {\n  access_mode = "single-node-writer"\n  attachment_mode = "file-system"\n}\n'
        f'secrets {{\n  token = "{SECRET}"\n}}\nmount_options {{\n  mount_flags = ["{FLAG}"]\n}}\n'
        'parameters {\n  kind = "fast"\n}\n'
    )
    done = env.cli("volume", "register", str(spec), "--client", str(env.client))
    assert done.returncode == 0, done.stderr


def raw(process: AgentProcess, path: str, **query: str) -> tuple[Any, str]:
    body, _ = process.client().request("GET", path, query or None)
    return body, json.dumps(body)


def test_csi_volume_and_plugin_endpoints_in_nomads_shape(csi_agent: tuple[Env, AgentProcess]) -> None:
    env, process = csi_agent
    client = process.client()
    register_volume(env)

    # Registered, no plugin yet: listed, not schedulable, no plugin instances.
    assert client.get("/v1/volumes") == []  # no type: Nomad answers an empty list
    [stub], text = raw(process, "/v1/volumes", type="csi")
    assert SECRET not in text and "hunter2" not in text
    assert stub["ID"] == "vol" and stub["Name"] == "the volume" and stub["Namespace"] == "default"
    assert stub["PluginID"] == "hostpath" and stub["ExternalID"] == "vol"
    assert stub["Schedulable"] is False and stub["NodesExpected"] == 0 and stub["NodesHealthy"] == 0
    assert stub["CurrentReaders"] == 0 and stub["CurrentWriters"] == 0 and stub["AccessMode"] == ""
    assert client.get("/v1/plugins", type="csi") == []

    process.submit('job "storage" {\n  type = "service"\n' + plugin_group() + "\n}\n")
    [plugin_alloc] = process.wait_allocs("storage", "running")
    deadline = time.monotonic() + 60
    while [p["NodesHealthy"] for p in client.get("/v1/plugins", type="csi")] != [1]:  # the plugin registers
        assert time.monotonic() < deadline, process.log()
        time.sleep(0.1)
    script = "echo hi > /data/hello; exec sleep 300"
    process.submit('job "app" {\n  type = "service"\n' + app_group(script) + "\n}\n")
    [app_alloc] = process.wait_allocs("app", "running")

    [stub], text = raw(process, "/v1/volumes", type="csi")
    assert SECRET not in text and "hunter2" not in text
    assert stub["Schedulable"] is True and stub["NodesHealthy"] == 1 and stub["NodesExpected"] == 1
    assert stub["CurrentWriters"] == 1 and stub["CurrentReaders"] == 0
    assert stub["AccessMode"] == "single-node-writer" and stub["AttachmentMode"] == "file-system"
    assert stub["Provider"] and isinstance(stub["ControllerRequired"], bool)
    expected_stub = {"ID", "Namespace", "Name", "ExternalID", "Topologies", "AccessMode", "AttachmentMode",
                     "CurrentReaders", "CurrentWriters", "Schedulable", "PluginID", "Provider", "ControllerRequired",
                     "ControllersHealthy", "ControllersExpected", "NodesHealthy", "NodesExpected",
                     "ResourceExhausted", "CreateIndex", "ModifyIndex", "CreateTime", "ModifyTime"}  # fmt: skip
    assert set(stub) == expected_stub

    volume, text = raw(process, "/v1/volume/csi/vol")
    assert SECRET not in text and "hunter2" not in text
    assert volume["Secrets"] is None and volume["MountOptions"] is None
    assert volume["WriteAllocs"] == {app_alloc["ID"]: None} and volume["ReadAllocs"] == {}
    assert [a["ID"] for a in volume["Allocations"]] == [app_alloc["ID"]]
    assert volume["Allocations"][0]["JobID"] == "app" and volume["Allocations"][0]["ClientStatus"] == "running"
    assert volume["RequestedCapabilities"] == [{"AccessMode": "single-node-writer", "AttachmentMode": "file-system"}]
    assert volume["Parameters"] == {"kind": "fast"} and volume["Schedulable"] is True
    assert "CurrentWriters" not in volume

    [plugin_stub] = client.get("/v1/plugins", type="csi")
    assert plugin_stub["ID"] == "hostpath" and plugin_stub["NodesHealthy"] == 1 and plugin_stub["Provider"]
    assert set(plugin_stub) == {"ID", "Provider", "ControllerRequired", "ControllersHealthy", "ControllersExpected",
                                "NodesHealthy", "NodesExpected", "CreateIndex", "ModifyIndex"}  # fmt: skip
    plugin = client.get("/v1/plugin/csi/hostpath")
    node_id = client.get("/v1/nodes")[0]["ID"]
    info = plugin["Nodes"][node_id]
    assert info["Healthy"] is True and info["AllocID"] == plugin_alloc["ID"] and info["PluginID"] == "hostpath"
    assert info["NodeInfo"]["ID"] and isinstance(info["NodeInfo"]["RequiresNodeStageVolume"], bool)
    assert [a["ID"] for a in plugin["Allocations"]] == [plugin_alloc["ID"]]
    assert plugin["NodeJobs"] == [
        {"Namespace": "default", "ID": "storage", "Version": plugin["NodeJobs"][0]["Version"]}
    ]

    for path, query, status, message in [
        ("/v1/volumes", {"type": "host"}, 404, "resource not found"),
        ("/v1/plugins", {"type": "nope"}, 404, "resource not found"),
        ("/v1/volume/csi/missing", {}, 404, "volume not found"),
        ("/v1/volume/csi/vol", {"namespace": "other"}, 404, "volume not found"),
        ("/v1/plugin/csi/missing", {}, 404, "plugin not found"),
    ]:
        with pytest.raises(APIRequestError) as err:
            client.request("GET", path, query or None)
        assert (err.value.status, str(err.value)) == (status, message)
    with pytest.raises(APIRequestError) as err:  # deregistering a claimed volume: refused, nothing changed
        client.request("DELETE", "/v1/volume/csi/vol")
    assert err.value.status == 400 and "stop those jobs before deregistering it" in str(err.value)
    assert client.get("/v1/volume/csi/vol")["WriteAllocs"] == {app_alloc["ID"]: None}
