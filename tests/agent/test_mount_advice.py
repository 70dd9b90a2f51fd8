"""`driversdk validate`'s mount advice converges: for every mount problem the validator can report,
the test does what the message says (edits the job or client file, runs the host command it names)
and validates again; one step must reach a valid job. The real CLI, real bind mounts on this host.

The first alternative a message gives is the one applied (``…; <change> (or …)`` / ``…, or …``):
an operator follows the first advice, so that is the one that must work.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from driversdk.mountinfo import read_mountinfo
from tests.agent.runs import ROOT

HELLO = ROOT / "examples" / "hello_driver.py"


@dataclass
class Mount:
    volume: str = "data"
    destination: str = "/data"
    read_only: bool = False
    propagation: str = "private"


@dataclass
class Case:
    """One job (a group volume per entry of ``volumes``, one task) and its client config."""

    propagation: str = "private"
    request_read_only: bool = False
    mount_read_only: bool = False
    client_read_only: bool = False
    path: str = "private"  # "private" | "shared" | "missing": the host path's state
    driver: str = "docker"
    mounts: list[Mount] | None = None
    in_client: bool = True
    volumes: dict[str, bool] = field(default_factory=dict)  # group volume -> read_only (others than "data")


class World:
    """The files of one case and the host paths it uses; the mounts it made are undone after."""

    def __init__(self, tmp: Path, case: Case) -> None:
        self.tmp = tmp
        self.host_path = tmp / "vol"
        self.client_volumes: dict[str, tuple[str, bool]] = {}
        if case.in_client:
            self.client_volumes["data"] = (str(self.host_path), case.client_read_only)
        if case.path != "missing":
            self.host_path.mkdir()
        if case.path == "shared":
            sh(f"mount --bind {self.host_path} {self.host_path} && mount --make-shared {self.host_path}")
        self.volumes = {"data": case.request_read_only, **case.volumes}
        self.mounts = case.mounts or [Mount("data", "/data", case.mount_read_only, case.propagation)]
        self.driver = case.driver

    def write(self) -> tuple[Path, Path]:
        blocks = "\n".join(
            f'  host_volume "{n}" {{\n    path = "{p}"\n    read_only = {str(ro).lower()}\n  }}'
            for n, (p, ro) in self.client_volumes.items()
        )
        client = self.tmp / "client.hcl"
        client.write_text(
            f'data_dir = "{self.tmp / "data-dir"}"\nclient {{\n{blocks}\n}}\n'
            f'plugin "hello" {{\n  command = ["{sys.executable}", "{HELLO}"]\n}}\n'
        )
        volumes = "\n".join(
            f'    volume "{n}" {{\n      type = "host"\n      source = "{n}"\n'
            f"      read_only = {str(ro).lower()}\n    }}"
            for n, ro in self.volumes.items()
        )
        mounts = "\n".join(
            f'      volume_mount {{\n        volume = "{m.volume}"\n        destination = "{m.destination}"\n'
            f'        read_only = {str(m.read_only).lower()}\n        propagation_mode = "{m.propagation}"\n      }}'
            for m in self.mounts
        )
        config = 'image = "busybox:1"' if self.driver == "docker" else 'command = "/bin/true"'
        job = self.tmp / "job.hcl"
        job.write_text(
            f'job "shop" {{\n  group "web" {{\n{volumes}\n    task "web" {{\n      driver = "{self.driver}"\n'
            f"      config {{\n        {config}\n      }}\n{mounts}\n    }}\n  }}\n}}\n"
        )
        return job, client

    def validate(self) -> subprocess.CompletedProcess[str]:
        job, client = self.write()
        return subprocess.run(
            [sys.executable, "-m", "driversdk.cli", "validate", str(job), "--client", str(client)],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
        )  # fmt: skip

    def apply(self, message: str) -> list[str]:
        """Do what the message's first advice says; returns what was done (never empty)."""
        advice = message.split("; ", 1)[1] if "; " in message else message
        cut = [i for i in (advice.find(s) for s in (", or ", " or ", " (or ", ' ("')) if i >= 0]
        first = advice[: min(cut)] if cut else advice
        done: list[str] = []
        for command in re.findall(r"`([^`]+)`", first):
            assert "make-rshared /" not in command and not re.search(r"\s/(\s|$)", command), command
            assert str(self.tmp) in command, f"a host change outside the volume's own path: {command}"
            sh(command)
            done.append(command)
        if m := re.search(r'propagation_mode = "([a-z-]+)"', first):
            for mount in self.mounts:
                mount.propagation = m.group(1)
            done.append(f"propagation {m.group(1)}")
        for name in re.findall(r'read_only = true on volume "(\w+)"', first):
            self.volumes[name] = True
            done.append(f"volume {name} read-only")
        if "set read_only = true on the volume" in first:
            self.volumes = dict.fromkeys(self.volumes, True)
            done.append("volumes read-only")
        for name in re.findall(r'volume "(\w+)" \(remove read_only = true\)', first):
            self.volumes[name] = False
            done.append(f"volume {name} read-write")
        if "this volume_mount (remove read_only = true)" in first:
            self.mounts = [replace(m, read_only=False) for m in self.mounts]
            done.append("volume_mount read-write")
        if m := re.search(r'add a host_volume "(\w+)" block with its path', first):
            self.client_volumes[m.group(1)] = (str(self.host_path), False)
            self.host_path.mkdir(exist_ok=True)
            done.append("host_volume added")
        if m := re.search(r'such as "(/\w+)"', first):
            self.mounts[0].destination = m.group(1)
            done.append("destination absolute")
        if "give each volume_mount its own destination" in first:
            self.mounts = [replace(mt, destination=f"/d{i}") for i, mt in enumerate(self.mounts)]
            done.append("destinations apart")
        if "run the task with a driver that supports mounts (docker" in first:
            self.driver = "docker"
            done.append("driver docker")
        if "remove its volume_mount blocks" in first:
            self.mounts = []
            done.append("mounts removed")
        if m := re.search(r'use "([a-z-]+)", "', first):
            for mount in self.mounts:
                mount.propagation = m.group(1)
            done.append(f"propagation {m.group(1)}")
        assert done, f"no change this test can make from the advice: {first!r}"
        return done


def sh(command: str) -> None:
    subprocess.run(["bash", "-c", command], check=True)


def errors(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line.removeprefix("error ") for line in done.stdout.splitlines() if line.startswith("error ")]


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for entry in reversed(read_mountinfo()):
        if entry.mount_point.startswith(str(tmp_path)):
            subprocess.run(["umount", "-l", entry.mount_point], check=True)
    assert not [e for e in read_mountinfo() if e.mount_point.startswith(str(tmp_path))]


CASES = {
    # The issue's case: a read-only host volume mounted bidirectional, its path on a private mount.
    "client read-only, bidirectional, private path": Case("bidirectional", client_read_only=True),
    "client read-only, bidirectional, shared path": Case("bidirectional", client_read_only=True, path="shared"),
    "client read-only, bidirectional, request read-only": Case(
        "bidirectional", client_read_only=True, request_read_only=True
    ),
    "client read-only, bidirectional, missing path": Case("bidirectional", client_read_only=True, path="missing"),
    "volume_mount read-only, bidirectional, private path": Case("bidirectional", mount_read_only=True),
    "volume_mount read-only, bidirectional, shared path": Case("bidirectional", mount_read_only=True, path="shared"),
    "request and mount read-only, bidirectional, shared path": Case(
        "bidirectional", request_read_only=True, mount_read_only=True, path="shared"
    ),
    "host-to-task, private path": Case("host-to-task"),
    "bidirectional, private path": Case("bidirectional"),
    "host-to-task, missing path": Case("host-to-task", path="missing"),
    "private, missing path": Case(path="missing"),
    "client read-only, request read-write": Case(client_read_only=True),
    "client read-only, request read-write, host-to-task on a shared path": Case(
        "host-to-task", client_read_only=True, path="shared"
    ),
    "host volume not in the client config": Case(in_client=False),
    "relative destination": Case(mounts=[Mount(destination="data")]),
    "two mounts at one destination": Case(mounts=[Mount(), Mount("other")], volumes={"other": False}),
    "unknown propagation_mode": Case("both-ways"),
    "driver without mount support": Case(driver="hello"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_mount_problem_converges_in_one_step(tmp: Path, name: str) -> None:
    case = CASES[name]
    world = World(tmp, case)
    if case.volumes:
        (tmp / "vol-other").mkdir()
        world.client_volumes.update({n: (str(tmp / "vol-other"), False) for n in case.volumes})
    first = world.validate()
    assert first.returncode == 1, first.stdout + first.stderr
    problems = errors(first)
    # One problem per mount: the root cause, not a chain of symptoms.
    assert len(problems) == 1, first.stdout
    assert "make-rshared /" not in first.stdout
    world.apply(problems[0])
    second = world.validate()
    assert second.returncode == 0, f"advice {problems[0]!r} led to:\n{second.stdout}{second.stderr}"
    assert second.stdout.rstrip().endswith("job 'shop': valid")


def test_the_issue_case_step_by_step(tmp: Path) -> None:
    """A client ``host_volume "certs" { read_only = true }`` mounted bidirectional: the message says
    bidirectional cannot work with that volume and what can; doing that validates."""
    world = World(tmp, Case("bidirectional", client_read_only=True))
    first = world.validate()
    (problem,) = errors(first)
    assert 'propagation_mode "bidirectional" cannot work with host volume "data"' in problem
    assert "the client config makes it read-only" in problem
    assert 'use propagation_mode = "private", and set read_only = true on volume "data"' in problem
    # What can, besides: host-to-task once the volume's own path is shared (never the whole host).
    assert f"`mount --bind {world.host_path} {world.host_path} && mount --make-shared {world.host_path}`" in problem
    assert "set read_only = false" not in problem and "make-rshared" not in first.stdout
    # No `ok` for the host volume or the mount the error is about.
    assert 'ok    host volume "data"' not in first.stdout and "volume_mount" not in first.stdout.split("error")[0]
    assert world.apply(problem) == ["propagation private", "volume data read-only"]
    second = world.validate()
    assert second.returncode == 0, second.stdout
    # Step 2 of the old circle (host-to-task → `mount --make-rshared /`) is not reached: the
    # parenthetical alternative, taken instead, validates too after the one host command it names.
    world.mounts[0].propagation = "host-to-task"
    third = world.validate()
    (again,) = errors(third)
    assert f"mount --bind {world.host_path} {world.host_path} && mount --make-shared {world.host_path}" in again
    world.apply(again)
    assert world.validate().returncode == 0


def test_no_ok_before_or_about_an_object_with_an_error(tmp: Path) -> None:
    """`ok` lines never come before an error, and none is printed for a host volume or a mount a
    problem is about (the missing host path case of the issue)."""
    world = World(tmp, Case(path="missing", mounts=[Mount(), Mount("other", "/other")], volumes={"other": False}))
    (tmp / "vol-other").mkdir()
    world.client_volumes["other"] = (str(tmp / "vol-other"), False)
    out = world.validate().stdout.splitlines()
    kinds = [line.split()[0] for line in out[:-1]]
    assert kinds == sorted(kinds, key=lambda k: k != "error"), out  # every error first
    assert kinds.count("error") == 1, out
    assert not [line for line in out if line.startswith("ok") and '"data"' in line], out
    # The volume without a problem is still said to be fine.
    assert any(line.startswith('ok    host volume "other"') for line in out), out
    assert any(line.startswith("ok") and 'volume "other" at "/other"' in line for line in out), out
