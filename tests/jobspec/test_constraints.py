"""Constraints and affinities against a node, operator by operator, as Nomad's scheduler reads
them (scheduler/feasible.go), and the client config's node fields and dynamic port range."""

from __future__ import annotations

from pathlib import Path

import pytest

from driversdk.jobspec import constraints
from driversdk.jobspec.clientconfig import load_client
from driversdk.jobspec.constraints import Constraint, Placement
from driversdk.jobspec.problems import ValidationFailed
from driversdk.jobspec.taskenv import Node

NODE = Node(
    id="n1",
    name="web-1",
    datacenter="dc2",
    node_class="big",
    attributes={
        "kernel.name": "linux",
        "kernel.version": "6.1.0-13-amd64",
        "cpu.numcores": "8",
        "driver.docker": "true",
        "driver.docker.version": "24.0.7",
        "nomad.version": "1.7.2",
        "os.name": "debian",
        "unique.hostname": "web-1",
    },
    meta={"rack": "r1", "tags": "ssd, gpu,fast"},
)


def met(attribute: str, operator: str, value: str = "") -> bool:
    return constraints.unmet(Constraint(attribute, operator, value, {"job": "j", "group": "g"}), NODE) is None


@pytest.mark.parametrize(
    ("attribute", "operator", "value", "expected"),
    [
        ("${attr.kernel.name}", "=", "linux", True),
        ("${attr.kernel.name}", "=", "windows", False),
        ("${attr.kernel.name}", "!=", "windows", True),
        ("${attr.missing}", "!=", "x", True),  # Nomad: not equal when unset
        ("${attr.missing}", "=", "", False),
        ("${attr.cpu.numcores}", ">=", "4", True),
        ("${attr.cpu.numcores}", ">", "10", False),  # numbers as numbers, not "8" > "10"
        ("${attr.os.name}", "<", "fedora", True),  # lexical otherwise
        ("${attr.cpu.numcores}", "<=", "8", True),
        ("${attr.os.name}", "regexp", "^deb", True),
        ("${attr.os.name}", "regexp", "^ubu", False),
        ("${meta.tags}", "set_contains", "gpu,ssd", True),
        ("${meta.tags}", "set_contains_all", "gpu,nvme", False),
        ("${meta.tags}", "set_contains_any", "nvme,fast", True),
        ("${attr.driver.docker.version}", "version", ">= 20.10, < 25", True),
        ("${attr.driver.docker.version}", "version", "~> 24.1", False),
        ("${attr.nomad.version}", "version", "~> 1.7", True),
        ("${attr.kernel.version}", "version", ">= 5.0", False),  # a prerelease to go-version
        ("${attr.kernel.version}", "semver", ">= 5.0.0", True),
        ("${attr.driver.docker}", "is_set", "", True),
        ("${attr.driver.podman}", "is_not_set", "", True),
        ("${attr.driver.podman}", "is_set", "", False),
        ("${node.datacenter}", "=", "dc2", True),
        ("${node.class}", "=", "big", True),
        ("${node.unique.name}", "=", "web-1", True),
        ("${meta.rack}", "=", "r2", False),
    ],
)
def test_operators(attribute: str, operator: str, value: str, expected: bool) -> None:
    assert met(attribute, operator, value) is expected


def test_the_reason_names_the_attribute_and_its_value() -> None:
    c = Constraint("${attr.kernel.name}", "=", "windows", {"job": "j", "group": "g"})
    why = constraints.unmet(c, NODE)
    assert why == 'attr.kernel.name is "linux"'
    assert constraints.sentence(c, why).startswith(
        'constraint ${attr.kernel.name} = "windows" is not met on this node: attr.kernel.name is "linux"'
    )
    assert constraints.unmet(Constraint("${attr.nope}", "=", "x"), NODE) == "attr.nope is not set on this node"


def test_shorthand_blocks_and_levels_are_collected_per_group() -> None:
    data = {
        "job": [
            {
                "j": {
                    "constraint": [{"attribute": "${attr.kernel.name}", "value": "linux"}],
                    "group": [
                        {
                            "g": {
                                "count": 3,
                                "constraint": [{"distinct_hosts": True}, {"distinct_property": "${meta.rack}"}],
                                "affinity": [{"attribute": "${meta.rack}", "value": "r1", "weight": 50}],
                                "task": [{"t": {"constraint": [{"attribute": "${attr.os.name}", "regexp": "deb"}]}}],
                            }
                        },
                        {"one": {"constraint": [{"distinct_hosts": True}], "task": [{"x": {}}]}},
                    ],
                }
            }
        ]
    }
    placement = constraints.collect(data)
    assert [c.operator for c in placement.constraints["g"]] == ["=", "distinct_hosts", "distinct_property", "regexp"]
    assert placement.constraints["g"][3].where == {"job": "j", "group": "g", "task": "t"}
    assert placement.affinities["g"][0].weight == 50
    refused = constraints.refusals(placement, NODE, "g")
    assert [c.operator for c, _ in refused] == ["distinct_hosts", "distinct_property"]
    assert refused[0][1] == "3 allocations would share this one node"
    assert refused[1][1] == '3 allocations would share meta.rack = "r1" (at most 1)'
    # A group of one: distinct_hosts is met, but the job's other group counts at job level only.
    assert constraints.refusals(placement, NODE, "one") == []


def test_job_level_distinct_hosts_counts_every_allocation_of_the_job() -> None:
    placement = Placement(
        constraints={"a": [Constraint("", "distinct_hosts", "", {"job": "j"})]}, counts={"a": 1, "b": 1}
    )
    assert constraints.refusals(placement, NODE, "a")[0][1] == "2 allocations would share this one node"


def test_client_config_node_fields_and_dynamic_ports(tmp_path: Path) -> None:
    path = tmp_path / "client.hcl"
    path.write_text(
        'name = "n1"\ndatacenter = "east"\nclient {\n  node_class = "gpu"\n  meta {\n    rack = "r9"\n  }\n'
        "  min_dynamic_port = 21000\n  max_dynamic_port = 21100\n}\n"
    )
    cfg = load_client(path)
    assert (cfg.name, cfg.datacenter, cfg.node_class, cfg.meta) == ("n1", "east", "gpu", {"rack": "r9"})
    assert (cfg.min_dynamic_port, cfg.max_dynamic_port) == (21000, 21100)
    assert not any("min_dynamic_port" in n or "meta" in n for n in cfg.notes)
    path.write_text("client {\n  min_dynamic_port = 30000\n  max_dynamic_port = 70000\n}\n")
    with pytest.raises(ValidationFailed) as err:
        load_client(path)
    assert "client.max_dynamic_port must be a port number (1-65535), not 70000" in str(err.value)


def test_a_static_port_fits_one_allocation_on_this_node(tmp_path: Path) -> None:
    from driversdk.agent.validate import check_files

    job = tmp_path / "ports.hcl"
    job.write_text(
        'job "p" {\n  group "a" {\n    count = 2\n    network {\n      port "http" {\n        static = 18080\n'
        '      }\n    }\n    task "t" {\n      driver = "exec"\n      config {\n        command = "/bin/true"\n'
        '      }\n    }\n  }\n  group "b" {\n    network {\n      port "web" {\n        static = 18080\n'
        '      }\n    }\n    task "t" {\n      driver = "exec"\n      config {\n        command = "/bin/true"\n'
        "      }\n    }\n  }\n}\n"
    )
    client = tmp_path / "client.hcl"
    client.write_text(f'data_dir = "{tmp_path / "data"}"\n')
    report = check_files(str(job), str(client))
    said = [(p.field, p.message) for p in report.problems]
    assert (
        "network.port http.static",
        "static port 18080 (port 'http') cannot be given to 2 allocations on one node; use a dynamic port "
        "(port without static) or count = 1",
    ) in said, said
    assert ("network.port web.static", "static port 18080 (port 'web') is also port 'http' of group \"a\"") in said
