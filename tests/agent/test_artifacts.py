"""Artifacts under `driversdk run`: the real CLI, raw_exec plugin processes and a real HTTP server on
127.0.0.1 started by the test. The task sees what was fetched where it asked, with the archive's
modes; a wrong checksum, a 404, a hostile archive or a local file outside the allocation fail the
task with Nomad's "Failed Artifact Download" event and leave nothing, inside or outside the task dir."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import io
import json
import secrets
import stat
import subprocess
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.runs import NO_RESTARTS, ROOT, cli, raw_exec_client
from tests.raw_exec import conftest as raw_exec_fixtures
from tests.raw_exec.conftest import Tracker

track = raw_exec_fixtures.track
no_leaks = raw_exec_fixtures.no_leaks

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A directory served over HTTP on loopback: (base URL, directory)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def job(track: Tracker, artifacts: str, script: str = "true", restart: str = "") -> tuple[Path, Path]:
    path = track.base / "job.hcl"
    path.write_text(
        f"""job "fetch" {{
  type = "batch"
  group "g" {{
    {restart}
    task "app" {{
      driver = "raw_exec"
      config {{
        command = "/bin/sh"
        args = ["-c", "{script}"]
      }}
{artifacts}
    }}
  }}
}}
"""
    )
    return path, raw_exec_client(track)


def run(path: Path, client: Path, command: str = "run") -> subprocess.CompletedProcess[str]:
    args = ("run", "--json") if command == "run" else (command,)
    return subprocess.run(
        cli(*args, str(path), "--client", str(client)), capture_output=True, text=True, cwd=ROOT, timeout=180
    )


def events(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def task_dir(track: Tracker) -> Path:
    (alloc,) = (track.base / "data" / "allocs").iterdir()
    return alloc / "app"


def tar_bytes(entries: list[tarfile.TarInfo], data: dict[str, bytes], compression: str = "gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=f"w:{compression}") as tar:
        for info in entries:
            body = data.get(info.name)
            if body is not None:
                info.size = len(body)
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return buf.getvalue()


def member(name: str, mode: int = 0o644, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode, info.type, info.linkname = mode, kind, link
    return info


def test_artifacts_file_tar_gz_and_zip_are_where_the_task_looks(track: Tracker, served: tuple[str, Path]) -> None:
    base, www = served
    (www / "hello.txt").write_text("hello artifact\n")
    bundle = tar_bytes(
        [
            member("app", 0o755, tarfile.DIRTYPE),
            member("app/run.sh", 0o4755),
            member("app/conf.txt", 0o600),
            member("app/link", kind=tarfile.SYMTYPE, link="conf.txt"),
        ],
        {"app/run.sh": b"#!/bin/sh\necho ran\n", "app/conf.txt": b"conf\n"},
    )
    (www / "bundle.tar.gz").write_bytes(bundle)
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as z:
        info = zipfile.ZipInfo("web/index.html")
        info.external_attr = (stat.S_IFREG | 0o640) << 16
        z.writestr(info, "<h1>hi</h1>")
    (www / "site.zip").write_bytes(zipped.getvalue())
    (www / "notes.txt.gz").write_bytes(gzip.compress(b"notes\n"))
    digest = hashlib.sha256(bundle).hexdigest()
    path, client = job(
        track,
        f"""
      artifact {{
        source = "{base}/hello.txt"
      }}
      artifact {{
        source      = "{base}/bundle.tar.gz"
        destination = "local/bundle"
        options {{
          checksum = "sha256:{digest}"
        }}
      }}
      artifact {{
        source      = "{base}/site.zip"
        destination = "${{NOMAD_TASK_DIR}}/site"
        mode        = "dir"
      }}
      artifact {{
        source      = "{base}/hello.txt"
        destination = "local/renamed.txt"
        mode        = "file"
      }}
      artifact {{
        source = "{base}/notes.txt.gz"
      }}""",
        "cat local/hello.txt local/renamed.txt local/site/web/index.html && local/bundle/app/run.sh",
    )
    done = run(path, client)
    assert done.returncode == 0, done.stdout + done.stderr
    types = [e["type"] for e in events(done) if e["task"] == "app"]
    assert "Downloading Artifacts" in types and "Failed Artifact Download" not in types
    local = task_dir(track) / "local"
    assert (local / "hello.txt").read_text() == "hello artifact\n"
    assert stat.S_IMODE((local / "hello.txt").stat().st_mode) == 0o644
    assert (local / "renamed.txt").read_text() == "hello artifact\n"
    assert (local / "notes.txt").read_text() == "notes\n"  # a .gz is one file, decompressed
    assert stat.S_IMODE((local / "bundle/app/run.sh").stat().st_mode) == 0o755  # setuid dropped, as Nomad's umask
    assert stat.S_IMODE((local / "bundle/app/conf.txt").stat().st_mode) == 0o600
    assert (local / "bundle/app/link").readlink() == Path("conf.txt")
    assert stat.S_IMODE((local / "site/web/index.html").stat().st_mode) == 0o640
    logs = task_dir(track).parent / "alloc" / "logs"
    assert (logs / "app.stdout.0").read_text() == "hello artifact\nhello artifact\n<h1>hi</h1>ran\n"
    assert not list(task_dir(track).parent.glob(".artifact-*")), "the staging dir is removed"


def failed(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr
    messages = [e["message"] for e in events(done) if e["type"] == "Failed Artifact Download"]
    assert len(messages) == 1, done.stdout
    return messages[0]


def nothing_fetched(track: Tracker) -> None:
    local = task_dir(track) / "local"
    assert not local.exists() or list(local.iterdir()) == []
    assert not list(task_dir(track).parent.glob(".artifact-*"))


def test_artifacts_a_wrong_checksum_fails_the_task_and_leaves_nothing(track: Tracker, served: tuple[str, Path]) -> None:
    base, www = served
    (www / "hello.txt").write_text("hello\n")
    path, client = job(
        track,
        f"""
      artifact {{
        source = "{base}/hello.txt"
        options {{
          checksum = "md5:{"0" * 32}"
        }}
      }}""",
        restart=NO_RESTARTS,
    )
    message = failed(run(path, client))
    assert "checksums did not match" in message and hashlib.md5(b"hello\n").hexdigest() in message
    nothing_fetched(track)


def test_artifacts_a_404_fails_the_task_with_the_event(track: Tracker, served: tuple[str, Path]) -> None:
    base, _ = served
    path, client = job(
        track, f'      artifact {{\n        source = "{base}/missing.tgz"\n      }}', restart=NO_RESTARTS
    )
    message = failed(run(path, client))
    assert "bad response code: 404" in message
    nothing_fetched(track)


@pytest.mark.parametrize("hostile", ["dotdot", "absolute", "symlink", "chain", "device", "hardlink", "too_many"])
def test_artifacts_a_hostile_tar_is_refused_and_writes_nothing_outside(
    track: Tracker, served: tuple[str, Path], hostile: str
) -> None:
    base, www = served
    mark = f"driversdk-artifact-{secrets.token_hex(4)}"
    outside = {
        "dotdot": [member(f"../../{mark}")],
        "absolute": [member(f"/tmp/{mark}")],
        "symlink": [member("etc", kind=tarfile.SYMTYPE, link="/etc"), member(f"etc/{mark}")],
        # Each link stays inside on its own; followed through the first, the second leaves.
        "chain": [member("here", kind=tarfile.SYMTYPE, link="."), member(mark, kind=tarfile.SYMTYPE, link="here/..")],
        "device": [member(mark, kind=tarfile.CHRTYPE)],
        "hardlink": [member(mark, kind=tarfile.LNKTYPE, link="/etc/passwd")],
        # Nomad's decompression_file_count_limit default is 4096 entries.
        "too_many": [member(f"d/{i}") for i in range(4096)],
    }[hostile]
    names = {info.name: b"x\n" for info in outside if info.type == tarfile.REGTYPE}
    (www / "evil.tar.gz").write_bytes(tar_bytes([member("ok.txt"), *outside], {"ok.txt": b"ok\n", **names}))
    path, client = job(
        track, f'      artifact {{\n        source = "{base}/evil.tar.gz"\n      }}', restart=NO_RESTARTS
    )
    message = failed(run(path, client))
    assert "refusing the artifact" in message or "decompression_file_count_limit" in message
    nothing_fetched(track)
    alloc = task_dir(track).parent
    for place in (Path("/tmp") / mark, Path("/etc") / mark, alloc / mark, alloc.parent / mark, task_dir(track) / mark):
        assert not place.exists(), place


def test_artifacts_a_local_file_outside_the_alloc_is_refused(track: Tracker) -> None:
    secret = track.base / "secret.txt"
    secret.write_text("host secret\n")
    path, client = job(track, f'      artifact {{\n        source = "file://{secret}"\n      }}', restart=NO_RESTARTS)
    message = failed(run(path, client))
    assert "inside the allocation dir" in message
    nothing_fetched(track)


def test_artifacts_a_destination_that_escapes_is_refused_at_validate(track: Tracker) -> None:
    path, client = job(
        track, '      artifact {\n        source = "http://127.0.0.1:1/x"\n        destination = "../../x"\n      }'
    )
    done = run(path, client, "validate")
    assert done.returncode != 0
    assert 'destination "../../x" escapes the task dir' in done.stdout + done.stderr
    assert not (track.base / "data" / "allocs").exists()


class FlakyHandler(http.server.BaseHTTPRequestHandler):
    """404 for the first request, the file after: a server that was not ready yet."""

    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        body = b"ready\n"
        self.send_response(404 if type(self).hits == 1 else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_artifacts_a_failed_download_is_recoverable_under_the_restart_policy(track: Tracker) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FlakyHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        path, client = job(
            track,
            f"""
      restart {{
        attempts = 2
        delay    = "1s"
        interval = "1m"
        mode     = "fail"
      }}
      artifact {{
        source = "http://127.0.0.1:{server.server_address[1]}/ready.txt"
      }}""",
            "cat local/ready.txt",
        )
        done = run(path, client)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stdout + done.stderr
    types = [e["type"] for e in events(done) if e["task"] == "app"]
    first = types.index("Failed Artifact Download")
    assert "Restarting" in types[first:] and "Started" in types[first:], types
    assert types.count("Downloading Artifacts") == 2
    logs = task_dir(track).parent / "alloc" / "logs"
    assert (logs / "app.stdout.0").read_text() == "ready\n"
