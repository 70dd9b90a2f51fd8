"""A task of the same allocation swaps a log fifo in alloc/logs for a symlink (or a hard link) to a
host file before its neighbour starts: the root driver must not write the neighbour's output there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from driversdk.errors import DriverError
from driversdk.logfifo import NotAFifoError, open_fifo_for_writing
from driversdk.taskkit.logs import open_log


def _planted(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    host = tmp_path / "host-file"
    host.write_bytes(b"host data\n")
    fifo = tmp_path / "logs" / ".web.stdout.fifo"
    fifo.parent.mkdir()
    if kind == "symlink":
        fifo.symlink_to(host)
    elif kind == "hardlink":
        os.link(host, fifo)
    else:
        fifo.write_bytes(b"")
    return host, fifo


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "regular"])
def test_exec_driver_refuses_a_log_path_that_is_not_a_fifo(tmp_path: Path, kind: str) -> None:
    host, fifo = _planted(tmp_path, kind)
    with pytest.raises(DriverError, match="refusing to write the task's output to it"):
        open_log(str(fifo), task="web", what="stdout", timeout=1)
    assert host.read_bytes() == b"host data\n"


def test_exec_driver_opens_a_real_fifo_with_a_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        fd = open_log(str(fifo), task="web", what="stdout", timeout=1)
        os.write(fd, b"hello")
        os.close(fd)
        assert os.read(reader, 10) == b"hello"
    finally:
        os.close(reader)


@pytest.mark.parametrize("kind", ["symlink", "hardlink", "regular"])
def test_the_sdk_fifo_opener_used_by_the_docker_driver_refuses_it_too(tmp_path: Path, kind: str) -> None:
    host, fifo = _planted(tmp_path, kind)
    with pytest.raises(NotAFifoError, match="refusing to write the task's output to it"):
        open_fifo_for_writing(str(fifo), task="web", what="stdout")
    assert host.read_bytes() == b"host data\n"
