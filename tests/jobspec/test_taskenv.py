"""taskenv: the environment Nomad's client gives a task, and interpolation with it."""

from __future__ import annotations

from driversdk.jobspec.job import CSIPluginConfig, Group, Job, Port, Task
from driversdk.jobspec.taskenv import Alloc, Node, PortValue, TaskEnv, build, dry


def sample() -> tuple[Job, Group, Task]:
    job = Job("job.hcl", "shop", namespace="prod", region="eu", meta={"owner": "a", "tier": "job"})
    group = Group("web", meta={"tier": "group"}, ports=[Port("http", static=8080, to=80), Port("dyn")])
    task = Task("api", "docker", cpu=250, memory=128, memory_max=256, meta={"rack.id": "r1"})
    group.tasks.append(task)
    job.groups.append(group)
    return job, group, task


def test_the_client_variables() -> None:
    job, group, task = sample()
    alloc = Alloc(id="0123456789abcdef-rest", index=2, parent_job_id="parent")
    env = build(job, group, task, alloc, node=Node(datacenter="dc7")).env
    assert env["NOMAD_ALLOC_DIR"] == "/alloc"
    assert env["NOMAD_TASK_DIR"] == "/local"
    assert env["NOMAD_SECRETS_DIR"] == "/secrets"
    assert env["NOMAD_ALLOC_ID"] == "0123456789abcdef-rest"
    assert env["NOMAD_SHORT_ALLOC_ID"] == "01234567"
    assert env["NOMAD_ALLOC_INDEX"] == "2"
    assert env["NOMAD_ALLOC_NAME"] == "shop.web[2]"
    assert env["NOMAD_JOB_ID"] == env["NOMAD_JOB_NAME"] == "shop"
    assert env["NOMAD_JOB_PARENT_ID"] == "parent"
    assert env["NOMAD_GROUP_NAME"] == "web"
    assert env["NOMAD_TASK_NAME"] == "api"
    assert env["NOMAD_NAMESPACE"] == "prod"
    assert env["NOMAD_REGION"] == "eu"
    assert env["NOMAD_DC"] == "dc7"
    assert env["NOMAD_CPU_LIMIT"] == "250"
    assert env["NOMAD_MEMORY_LIMIT"] == "128"
    assert env["NOMAD_MEMORY_MAX_LIMIT"] == "256"
    assert "CSI_ENDPOINT" not in env


def test_meta_merges_job_group_task_with_upper_case_copies() -> None:
    job, group, task = sample()
    env = build(job, group, task).env
    assert env["NOMAD_META_owner"] == env["NOMAD_META_OWNER"] == "a"
    assert env["NOMAD_META_tier"] == "group"
    assert env["NOMAD_META_rack_id"] == env["NOMAD_META_RACK_ID"] == "r1"


def test_ports() -> None:
    job, group, task = sample()
    alloc = Alloc(ports=[PortValue("http", 8080, 80, "10.0.0.5"), PortValue("dyn", 23456)])
    env = build(job, group, task, alloc).env
    assert env["NOMAD_PORT_http"] == "80"
    assert env["NOMAD_ALLOC_PORT_http"] == "80"
    assert env["NOMAD_HOST_PORT_http"] == "8080"
    assert env["NOMAD_IP_http"] == env["NOMAD_HOST_IP_http"] == "10.0.0.5"
    assert env["NOMAD_ADDR_http"] == env["NOMAD_HOST_ADDR_http"] == "10.0.0.5:8080"
    assert env["NOMAD_PORT_dyn"] == env["NOMAD_HOST_PORT_dyn"] == "23456"


def test_host_paths_for_a_driver_without_filesystem_isolation() -> None:
    job, group, task = sample()
    env = build(job, group, task, Alloc(dir="/var/lib/x/allocs/abc/"), fs_isolation=False).env
    assert env["NOMAD_ALLOC_DIR"] == "/var/lib/x/allocs/abc/alloc"
    assert env["NOMAD_TASK_DIR"] == "/var/lib/x/allocs/abc/api/local"
    assert env["NOMAD_SECRETS_DIR"] == "/var/lib/x/allocs/abc/api/secrets"


def test_csi_endpoint_for_a_plugin_task() -> None:
    job, group, task = sample()
    task.csi_plugin = CSIPluginConfig(id="hostpath", type="node", mount_dir="/csi/")
    env = build(job, group, task)
    assert env.env["CSI_ENDPOINT"] == "unix:///csi/csi.sock"
    assert env.replace("--endpoint=${CSI_ENDPOINT}") == "--endpoint=unix:///csi/csi.sock"


def test_the_task_env_is_interpolated() -> None:
    job, group, task = sample()
    task.env = {"DATA": "${NOMAD_ALLOC_DIR}/data", "WHO": "${NOMAD_TASK_NAME}@${node.unique.name}"}
    env = build(job, group, task, node=Node(name="n1")).env
    assert env["DATA"] == "/alloc/data"
    assert env["WHO"] == "api@n1"


def test_interpolation_of_nested_values_and_unknowns_left_as_written() -> None:
    node = Node(id="id-1", attributes={"kernel.name": "linux"}, meta={"rack": "r9"})
    env = TaskEnv({"NOMAD_TASK_DIR": "/local", "HOME": "/root"}, node.lookup())
    config = {
        "args": ["${NOMAD_TASK_DIR}/x", "${attr.kernel.name}", "${meta.rack}", "${node.unique.id}", '${env["HOME"]}'],
        "nested": [{"path": "${NOMAD_TASK_DIR}"}],
        "n": 5,
        "unknown": "${attr.nope} ${NOMAD_NOPE} ${var.x}",
    }
    out = env.interpolate(config)
    assert out["args"] == ["/local/x", "linux", "r9", "id-1", "/root"]
    assert out["nested"] == [{"path": "/local"}]
    assert out["n"] == 5
    assert out["unknown"] == "${attr.nope} ${NOMAD_NOPE} ${var.x}"
    assert env.unresolved(out["unknown"]) == ["attr.nope", "NOMAD_NOPE", "var.x"]
    assert config["args"][0] == "${NOMAD_TASK_DIR}/x"  # the input is not changed


def test_dry_uses_static_ports_only() -> None:
    job, group, task = sample()
    env = dry(job, group, task).env
    assert env["NOMAD_HOST_PORT_http"] == "8080"
    assert "NOMAD_PORT_dyn" not in env
    assert env["NOMAD_ALLOC_ID"] == "00000000-0000-0000-0000-000000000000"


def test_the_allocation_environment_has_no_task_in_it() -> None:
    # What group-level values (network.hostname) are interpolated with, as Nomad's.
    from driversdk.jobspec.taskenv import for_alloc

    job, group, _ = sample()
    env = for_alloc(job, group, Alloc(id="0123456789abcdef", index=3, ports=(PortValue("http", 8080, 80),))).env
    assert env["NOMAD_ALLOC_NAME"] == "shop.web[3]" and env["NOMAD_GROUP_NAME"] == "web"
    assert env["NOMAD_META_tier"] == "group" and "NOMAD_META_rack_id" not in env
    assert env["NOMAD_PORT_http"] == "80"
    assert not [k for k in env if k.startswith(("NOMAD_TASK", "NOMAD_ALLOC_DIR", "NOMAD_CPU", "NOMAD_MEMORY"))]
