"""The log collector's copy loop: pipe -> rotated files, by splice(2) and by read/write alike.

The files are no longer O_APPEND (splice refuses such a target), so these pin what O_APPEND
used to guarantee: a resumed file is written at its end, never over what it holds.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from driversdk.agent.logmon.tasklogs import CHUNK, LOG_MODE, RotatingFile


def _pump(sink: RotatingFile, data: bytes) -> None:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    buffer = bytearray(CHUNK)
    try:
        view = memoryview(data)
        while view:
            written = os.write(write_end, view[:32768])
            view = view[written:]
            while True:
                try:
                    sink.pull(read_end, buffer)
                except BlockingIOError:
                    break
    finally:
        os.close(read_end)
        os.close(write_end)


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "read-write"])
def test_pull_rotates_by_size_and_keeps_every_byte(tmp_path: Path, splice: bool) -> None:
    sink = RotatingFile(str(tmp_path), "web.stdout", max_files=10, max_size=100_000)
    sink._splice = splice and hasattr(os, "splice")
    data = bytes(range(256)) * 1200  # 307200 bytes: three full files and a partial one
    _pump(sink, data)
    sink.close()
    names = sorted(os.listdir(tmp_path), key=lambda n: int(n.rsplit(".", 1)[1]))
    assert names == ["web.stdout.0", "web.stdout.1", "web.stdout.2", "web.stdout.3"]
    assert [os.stat(tmp_path / n).st_size for n in names] == [100_000, 100_000, 100_000, 7200]
    assert b"".join((tmp_path / n).read_bytes() for n in names) == data
    for name in names:
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == LOG_MODE


@pytest.mark.parametrize("splice", [True, False], ids=["splice", "read-write"])
def test_a_resumed_file_is_written_at_its_end(tmp_path: Path, splice: bool) -> None:
    first = RotatingFile(str(tmp_path), "web.stdout", max_files=10, max_size=100)
    first.write(b"before\n")
    first.close()
    resumed = RotatingFile(str(tmp_path), "web.stdout", max_files=10, max_size=100)
    resumed._splice = splice and hasattr(os, "splice")
    _pump(resumed, b"after\n")
    resumed.write(b"written\n")
    resumed.close()
    assert (tmp_path / "web.stdout.0").read_bytes() == b"before\nafter\nwritten\n"
