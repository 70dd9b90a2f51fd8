"""The attacker is another local user who makes the process driver's exit-file dir in the shared
temp dir first: the root plugin must refuse it rather than trust (or follow) what they made."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from driversdk.errors import DriverError
from examples.hello_driver import HelloDriver


@pytest.fixture
def driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> HelloDriver:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    return HelloDriver()


def _planned(driver: HelloDriver, tmp_path: Path) -> Path:
    return tmp_path / f"driversdk-{driver.name}-{os.geteuid()}"


def test_a_symlink_planted_at_the_exit_dir_is_refused(driver: HelloDriver, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    _planned(driver, tmp_path).symlink_to(target)
    with pytest.raises(DriverError, match="not a private directory"):
        _ = driver.state_dir


def test_a_dir_of_another_user_is_refused(driver: HelloDriver, tmp_path: Path) -> None:
    planted = _planned(driver, tmp_path)
    planted.mkdir(mode=0o700)
    os.chown(planted, 65534, 65534)
    with pytest.raises(DriverError, match="not a private directory"):
        _ = driver.state_dir


def test_a_dir_others_may_write_is_refused(driver: HelloDriver, tmp_path: Path) -> None:
    planted = _planned(driver, tmp_path)
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(DriverError, match="not a private directory"):
        _ = driver.state_dir


def test_our_own_private_dir_is_used(driver: HelloDriver, tmp_path: Path) -> None:
    path = Path(driver.state_dir)
    assert path == _planned(driver, tmp_path)
    assert path.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("task_id", ["..", ".", ""])
def test_a_task_id_that_names_no_directory_of_its_own_is_refused(
    driver: HelloDriver, tmp_path: Path, task_id: str
) -> None:
    from driversdk.testing import AllocDir

    bystander = tmp_path / "bystander"
    bystander.write_text("kept")
    alloc = AllocDir.create(tmp_path / "alloc", tasks=["web"])
    task = alloc.task_config("web", driver_config={"command": "/bin/true"})
    task = type(task)(**{**task.__dict__, "id": task_id})
    with pytest.raises(DriverError, match="cannot name a directory"):
        driver.start_task(task)
    assert bystander.read_text() == "kept", "start_task emptied a directory that is not the task's"
