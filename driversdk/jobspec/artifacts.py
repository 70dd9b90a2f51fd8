"""Artifacts: a task's ``artifact`` blocks fetched and unpacked as Nomad's getter does, for the
sources ``driversdk run`` supports.

Sources are ``http://`` and ``https://`` URLs (TLS verified unless ``insecure = true``, the
``headers`` sent) and local files (``file://…`` or a path, relative to the task dir as go-getter's
working directory is). Nomad's getter runs in a sandbox that can read only the allocation's own
directories, so a local source must be a regular file inside the allocation dir, reached without
following a symlink: a path elsewhere on the host is refused. ``options { checksum = "type:hex" }``
(md5, sha1, sha256, sha512) is verified before anything is unpacked; ``options { archive = false }``
keeps an archive as it is.

Archives are recognised by the source's extension (tar, tar.gz/tgz, tar.bz2/tbz2, tar.xz/txz, zip,
and the single-file gz, bz2, xz) and unpacked with Nomad's client defaults as limits
(``decompression_file_count_limit`` 4096 entries, ``decompression_size_limit`` 100 GB). An entry
that is absolute, has a ``..`` component, is a device, fifo or hard link, or is a symbolic link
whose target is absolute or leaves the destination refuses the whole artifact; a file is never
written through a link (each directory is opened with ``O_NOFOLLOW``). Modes are the archive's
without setuid, setgid and sticky bits (Nomad's getter umask); a downloaded file is 0644.

Everything is fetched into a private staging directory inside the allocation dir first and moved
into ``destination`` only once complete, so a failed fetch leaves nothing behind; the destination
is walked from the task dir one component at a time without following links, and an entry the
task planted there (a symlink) is replaced, never written through.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import os
import shutil
import ssl
import stat
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Protocol
from zlib import error as ZlibError

from driversdk.dirwalk import DIR_FLAGS, UnsafeStep, open_parent
from driversdk.errors import DriverSDKError
from driversdk.paths import show
from driversdk.pinning import PinError, open_beneath

# Nomad's client `artifact` defaults.
DECOMPRESSION_FILE_COUNT_LIMIT = 4096
DECOMPRESSION_SIZE_LIMIT = 100 * 10**9
HTTP_MAX_SIZE = 100 * 10**9
HTTP_READ_TIMEOUT = 30.0  # seconds without a byte before a download is given up
CHUNK = 1 << 16

CHECKSUMS = {"md5": 32, "sha1": 40, "sha256": 64, "sha512": 128}
OPTIONS = ("checksum", "archive")
MODES = ("any", "file", "dir")
# Longest first: ".tar.gz" before ".gz".
ARCHIVES = (
    (".tar.gz", "tar"),
    (".tar.bz2", "tar"),
    (".tar.xz", "tar"),
    (".tgz", "tar"),
    (".tbz2", "tar"),
    (".txz", "tar"),
    (".tar", "tar"),
    (".zip", "zip"),
    (".gz", "gz"),
    (".bz2", "bz2"),
    (".xz", "xz"),
)


class ArtifactError(DriverSDKError):
    """An artifact could not be fetched or unpacked. Recoverable, as Nomad's artifact hook
    reports a download failure: the task's restart policy decides whether to try again."""

    def __init__(self, message: str, *, recoverable: bool = True) -> None:
        super().__init__(message)
        self.recoverable = recoverable


@dataclass(frozen=True)
class Fetch:
    """One artifact, interpolated: what to fetch and where it goes."""

    source: str
    destination: str  # as written (interpolated), relative to the task dir
    mode: str = "any"
    checksum: str = ""
    archive: bool = True
    headers: tuple[tuple[str, str], ...] = ()
    insecure: bool = False


# --- checks shared with validate ------------------------------------------------------------------


def source_problem(source: str) -> str | None:
    """Why a source cannot be fetched by `run` (a go-getter source it has no getter for)."""
    if not source:
        return "source must be specified"
    forced, sep, _ = source.partition("::")
    if sep and "://" not in forced and "/" not in forced:
        return f'source {show(source)} uses the "{forced}" getter; driversdk run fetches http(s) URLs and local files'
    scheme = urllib.parse.urlsplit(source).scheme.lower()
    if scheme and scheme not in ("http", "https", "file") and len(scheme) > 1:
        return f'source {show(source)} is a "{scheme}" URL; driversdk run fetches http(s) URLs and local files'
    return None


def checksum_problem(value: str) -> str | None:
    kind, sep, digest = value.partition(":")
    if not sep or kind.lower() not in CHECKSUMS:
        return f'options.checksum {show(value)} must be "type:hex" with type md5, sha1, sha256 or sha512'
    want = CHECKSUMS[kind.lower()]
    if len(digest) != want or any(c not in "0123456789abcdefABCDEF" for c in digest):
        return f"options.checksum {show(value)}: a {kind.lower()} checksum is {want} hexadecimal characters"
    return None


def destination_parts(destination: str) -> list[str] | None:
    """The components of a destination below the task dir; None when it leaves it."""
    parts = [p for p in destination.split("/") if p not in ("", ".")]
    if ".." in parts or any("\x00" in p for p in parts):
        return None
    return parts


# --- fetch ----------------------------------------------------------------------------------------


def fetch(item: Fetch, task_dir: str, alloc_dir: str, where: str) -> None:
    """Fetch ``item`` into its destination below ``task_dir`` (``alloc/…`` is the shared alloc
    dir); ArtifactError with one sentence naming ``where`` otherwise. Nothing is left on failure."""
    # Checked again here: a value written with ${…} is only known now.
    why = source_problem(item.source) or (checksum_problem(item.checksum) if item.checksum else None)
    if why is not None:
        raise ArtifactError(f"{where}: {why}", recoverable=False)
    root, parts = _place(item.destination, task_dir, alloc_dir, where)
    staging = tempfile.mkdtemp(prefix=".artifact-", dir=alloc_dir)
    try:
        name = _basename(item.source)
        download = os.path.join(staging, "download")
        _download(item, task_dir, alloc_dir, download, where)
        if item.checksum:
            _verify(download, item.checksum, where)
        kind = _archive_kind(item.source) if item.archive else None
        out = os.path.join(staging, "out")
        os.mkdir(out, 0o700)
        if item.mode == "file":
            if kind in ("tar", "zip"):
                raise ArtifactError(f"{where}: mode \"file\" cannot hold the {kind} archive {show(name)}; use "
                                    'mode = "dir" or "any"', recoverable=False)  # fmt: skip
            target = os.path.join(out, "file")
            _single(download, kind, target, where)
            if not parts:
                raise ArtifactError(f'{where}: mode "file" needs a destination file name', recoverable=False)
            _install_file(root, parts, target, where)
            return
        if kind == "tar":
            _untar(download, out, where)
        elif kind == "zip":
            _unzip(download, out, where)
        elif item.mode == "dir":
            raise ArtifactError(f'{where}: mode "dir" needs an archive, and {show(name)} is not one (tar, zip, …); '
                                'use mode = "any" or "file"', recoverable=False)  # fmt: skip
        else:
            stem = name
            if kind is not None:
                stem = name[: -len(next(ext for ext, k in ARCHIVES if k == kind and name.lower().endswith(ext)))]
            _single(download, kind, os.path.join(out, stem or "artifact"), where)
        _inspect(out, where)
        _install_dir(root, parts, out, where)
    except OSError as err:
        raise ArtifactError(f"{where}: {err.strerror or err}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _place(destination: str, task_dir: str, alloc_dir: str, where: str) -> tuple[str, list[str]]:
    """The directory the destination is walked from and its components: the task dir, or the
    shared alloc dir for ``alloc/…`` (the host paths the task's environment gives map the same)."""
    shared = os.path.join(alloc_dir, "alloc")
    path = destination
    for base in (shared, task_dir):
        if path == base or path.startswith(base.rstrip("/") + "/"):
            path = path[len(base.rstrip("/")) :].lstrip("/")
            if base == shared:
                path = "alloc/" + path
            break
    parts = destination_parts(path)
    if parts is None:
        raise ArtifactError(f"{where}: destination {show(destination)} escapes the task dir; use a path inside it "
                            'such as "local/"', recoverable=False)  # fmt: skip
    if parts[:1] == ["alloc"]:
        return shared, parts[1:]
    return task_dir, parts


def _basename(source: str) -> str:
    path = urllib.parse.urlsplit(source).path if "://" in source else source
    return os.path.basename(path.rstrip("/")) or "artifact"


def _archive_kind(source: str) -> str | None:
    name = _basename(source).lower()
    return next((kind for ext, kind in ARCHIVES if name.endswith(ext)), None)


def _download(item: Fetch, task_dir: str, alloc_dir: str, target: str, where: str) -> None:
    scheme = urllib.parse.urlsplit(item.source).scheme.lower()
    if scheme in ("http", "https"):
        _http(item, target, where)
    else:
        _local(item.source, task_dir, alloc_dir, target, where)


def _http(item: Fetch, target: str, where: str) -> None:
    request = urllib.request.Request(item.source, headers=dict(item.headers))
    context = ssl.create_default_context()
    if item.insecure:  # the job asked for it (Nomad's `insecure`)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    shown = show(_redacted(item.source))
    try:
        with urllib.request.urlopen(request, timeout=HTTP_READ_TIMEOUT, context=context) as response:
            _copy(response, target, HTTP_MAX_SIZE, f"{where}: {shown}")
    except urllib.error.HTTPError as err:
        raise ArtifactError(f"{where}: GET {shown}: bad response code: {err.code}") from None
    except urllib.error.URLError as err:
        raise ArtifactError(f"{where}: GET {shown}: {err.reason}") from None
    except (TimeoutError, ConnectionError, ssl.SSLError) as err:
        raise ArtifactError(f"{where}: GET {shown}: {err}") from None


def _redacted(url: str) -> str:
    """The URL without a password in it (an operator's line must not show one)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _local(source: str, task_dir: str, alloc_dir: str, target: str, where: str) -> None:
    path = urllib.parse.unquote(urllib.parse.urlsplit(source).path) if source.startswith("file:") else source
    full = os.path.normpath(os.path.join(task_dir, path))
    try:
        fd = open_beneath(alloc_dir, full)
    except PinError as err:
        raise ArtifactError(
            f"{where}: local source {show(source)} cannot be read: {err.reason}; a local artifact must be a file "
            "inside the allocation dir (Nomad's getter sandbox reads nothing else)",
            recoverable=False,
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ArtifactError(f"{where}: local source {show(source)} is not a regular file", recoverable=False)
        with open(f"/proc/self/fd/{fd}", "rb") as src:
            _copy(src, target, HTTP_MAX_SIZE, f"{where}: {show(source)}")
    finally:
        os.close(fd)


def _copy(src: _Reader | IO[bytes], target: str, limit: int, what: str) -> int:
    total = 0
    with open(target, "xb") as out:
        while chunk := src.read(CHUNK):
            total += len(chunk)
            if total > limit:
                raise ArtifactError(f"{what} is larger than {limit} bytes")
            out.write(chunk)
    return total


def _verify(path: str, checksum: str, where: str) -> None:
    kind, _, want = checksum.partition(":")
    digest = hashlib.new(kind.lower())
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    got = digest.hexdigest()
    if got != want.lower():
        raise ArtifactError(f"{where}: checksums did not match: expected {kind.lower()}:{want.lower()}, got {got}")


# --- unpack ---------------------------------------------------------------------------------------


class _Reader(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


class _Budget:
    def __init__(self, where: str) -> None:
        self.where, self.files, self.bytes = where, 0, 0

    def entry(self) -> None:
        self.files += 1
        if self.files > DECOMPRESSION_FILE_COUNT_LIMIT:
            raise ArtifactError(f"{self.where}: the archive has more than {DECOMPRESSION_FILE_COUNT_LIMIT} entries "
                                "(Nomad's decompression_file_count_limit)", recoverable=False)  # fmt: skip

    def add(self, n: int) -> None:
        self.bytes += n
        if self.bytes > DECOMPRESSION_SIZE_LIMIT:
            raise ArtifactError(f"{self.where}: the archive unpacks to more than {DECOMPRESSION_SIZE_LIMIT} bytes "
                                "(Nomad's decompression_size_limit)", recoverable=False)  # fmt: skip


def _member_parts(name: str, where: str) -> list[str]:
    if name.startswith("/") or "\x00" in name:
        raise ArtifactError(f"{where}: the archive entry {show(name)} is an absolute path; refusing the artifact",
                            recoverable=False)  # fmt: skip
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ArtifactError(f"{where}: the archive entry {show(name)} leaves the destination (..); refusing the "
                            "artifact", recoverable=False)  # fmt: skip
    return parts


def _link_ok(parts: list[str], target: str) -> bool:
    """A symbolic link entry stays inside the destination: relative, and never above it."""
    if not target or target.startswith("/") or "\x00" in target:
        return False
    depth = len(parts) - 1
    for p in target.split("/"):
        if p == "..":
            depth -= 1
            if depth < 0:
                return False
        elif p not in ("", "."):
            depth += 1
    return True


def _open_parent(root: str, parts: list[str], where: str) -> int:
    """The directory holding ``parts[-1]`` below ``root``, made as needed, never through a link."""
    try:
        return open_parent(root, parts, create=True)
    except UnsafeStep:
        raise ArtifactError(f"{where}: {show('/'.join(parts))} passes through a symbolic link or a file; "
                            "refusing the artifact", recoverable=False) from None  # fmt: skip


def _write(root: str, parts: list[str], src: _Reader | IO[bytes], mode: int, budget: _Budget) -> None:
    fd = _open_parent(root, parts, budget.where)
    try:
        name = parts[-1]
        try:
            os.unlink(name, dir_fd=fd)  # a later entry of the same name replaces the earlier one
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            raise ArtifactError(f"{budget.where}: the archive has both a directory and a file "
                                f"{show('/'.join(parts))}", recoverable=False) from None  # fmt: skip
        out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        try:
            while chunk := src.read(CHUNK):
                budget.add(len(chunk))
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
            os.fchmod(out, mode & 0o777)  # setuid, setgid and sticky dropped
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _mkdir(root: str, parts: list[str], where: str) -> None:
    fd = _open_parent(root, [*parts, "."], where)
    os.close(fd)


def _symlink(root: str, parts: list[str], target: str, where: str) -> None:
    if not _link_ok(parts, target):
        raise ArtifactError(f"{where}: the archive entry {show('/'.join(parts))} is a symbolic link to "
                            f"{show(target)}, outside the destination; refusing the artifact",
                            recoverable=False)  # fmt: skip
    fd = _open_parent(root, parts, where)
    try:
        os.symlink(target, parts[-1], dir_fd=fd)
    finally:
        os.close(fd)


def _untar(path: str, out: str, where: str) -> None:
    budget = _Budget(where)
    dirs: list[tuple[list[str], int]] = []
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in _members(tar):
                budget.entry()
                parts = _member_parts(member.name, where)
                if not parts:
                    continue
                if member.isdir():
                    _mkdir(out, parts, where)
                    dirs.append((parts, member.mode))
                elif member.isreg():
                    src = tar.extractfile(member)
                    assert src is not None
                    _write(out, parts, src, member.mode, budget)
                elif member.issym():
                    _symlink(out, parts, member.linkname, where)
                else:
                    what = "a hard link" if member.islnk() else "a device or fifo"
                    raise ArtifactError(f"{where}: the archive entry {show(member.name)} is {what}; refusing the "
                                        "artifact", recoverable=False)  # fmt: skip
    except (tarfile.TarError, EOFError, ZlibError, lzma.LZMAError) as err:
        raise ArtifactError(f"{where}: the tar archive cannot be read: {err}") from None
    _dir_modes(out, dirs)


def _members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    while (member := tar.next()) is not None:
        yield member


def _unzip(path: str, out: str, where: str) -> None:
    budget = _Budget(where)
    dirs: list[tuple[list[str], int]] = []
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                budget.entry()
                parts = _member_parts(info.filename, where)
                if not parts:
                    continue
                mode = info.external_attr >> 16
                if info.is_dir():
                    _mkdir(out, parts, where)
                    dirs.append((parts, mode or 0o755))
                elif stat.S_ISLNK(mode):
                    _symlink(out, parts, archive.read(info)[:4096].decode("utf-8", "replace"), where)
                elif mode and not stat.S_ISREG(mode):
                    raise ArtifactError(f"{where}: the archive entry {show(info.filename)} is not a regular file, "
                                        "directory or link; refusing the artifact", recoverable=False)  # fmt: skip
                else:
                    with archive.open(info) as src:
                        _write(out, parts, src, (mode & 0o777) or 0o644, budget)
    except (zipfile.BadZipFile, ZlibError, EOFError) as err:
        raise ArtifactError(f"{where}: the zip archive cannot be read: {err}") from None
    _dir_modes(out, dirs)


def _dir_modes(out: str, dirs: list[tuple[list[str], int]]) -> None:
    for parts, mode in reversed(dirs):
        fd = _open_parent(out, [*parts, "."], "")
        try:
            os.fchmod(fd, (mode & 0o777) | 0o700)
        finally:
            os.close(fd)


def _open_single(path: str, kind: str | None) -> _Reader:
    if kind == "gz":
        return gzip.open(path, "rb")
    if kind == "bz2":
        return bz2.open(path, "rb")
    if kind == "xz":
        return lzma.open(path, "rb")
    return open(path, "rb")


def _single(path: str, kind: str | None, target: str, where: str) -> None:
    """One file: copied as it is, or decompressed (gz, bz2, xz) within the size limit."""
    budget = _Budget(where)
    parent, name = os.path.split(target)
    try:
        src = _open_single(path, kind)
        try:
            _write(parent, [name], src, 0o644, budget)
        finally:
            src.close()
    except (OSError, EOFError, lzma.LZMAError, ZlibError) as err:
        if isinstance(err, ArtifactError):
            raise
        raise ArtifactError(f"{where}: the {kind} file cannot be decompressed: {err}") from None


def _inspect(out: str, where: str) -> None:
    """Every link of the unpacked tree resolves inside it, through any chain of links (Nomad's
    getter inspects its sandbox the same way before moving anything into place)."""
    real_out = os.path.realpath(out)
    for dirpath, dirnames, filenames in os.walk(out):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                continue
            resolved = os.path.realpath(path)
            if resolved != real_out and not resolved.startswith(real_out + "/"):
                shown = show(os.path.relpath(path, out))
                raise ArtifactError(f"{where}: the archive entry {shown} is a symbolic link that resolves outside the "
                                    "destination; refusing the artifact", recoverable=False)  # fmt: skip


# --- install --------------------------------------------------------------------------------------


def _install_dir(root: str, parts: list[str], staged: str, where: str) -> None:
    """Move everything in ``staged`` into the destination directory, merging directories."""
    dest = _open_parent(root, [*parts, "."], where)
    src = os.open(staged, DIR_FLAGS)
    try:
        _merge(src, dest)
    finally:
        os.close(src)
        os.close(dest)


def _merge(src: int, dest: int) -> None:
    for name in os.listdir(src):
        info = os.stat(name, dir_fd=src, follow_symlinks=False)
        try:
            there = os.stat(name, dir_fd=dest, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(name, name, src_dir_fd=src, dst_dir_fd=dest)
            continue
        if stat.S_ISDIR(info.st_mode) and stat.S_ISDIR(there.st_mode):
            a = os.open(name, DIR_FLAGS, dir_fd=src)
            b = os.open(name, DIR_FLAGS, dir_fd=dest)
            try:
                _merge(a, b)
            finally:
                os.close(a)
                os.close(b)
            continue
        _remove(dest, name, there)
        os.rename(name, name, src_dir_fd=src, dst_dir_fd=dest)


def _remove(dir_fd: int, name: str, info: os.stat_result) -> None:
    """Remove an entry (a link itself, never what it points to)."""
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    try:
        for child in os.listdir(fd):
            _remove(fd, child, os.stat(child, dir_fd=fd, follow_symlinks=False))
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _install_file(root: str, parts: list[str], staged: str, where: str) -> None:
    dest = _open_parent(root, parts, where)
    try:
        name = parts[-1]
        try:
            there = os.stat(name, dir_fd=dest, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISDIR(there.st_mode):
                raise ArtifactError(f'{where}: mode "file" destination {show("/".join(parts))} is a directory',
                                    recoverable=False)  # fmt: skip
        os.rename(staged, name, dst_dir_fd=dest)
    finally:
        os.close(dest)
