"""The file functions of a job file, under an explicit :class:`FilePolicy`.

Nomad evaluates a job sent to its HTTP API with its file functions turned off
(``ParseConfig.AllowFS = false``); ``nomad job run`` turns them on for any path. Here a job file
reads nothing of the host unless its caller says where: ``FilePolicy(root=None)`` (the default,
and what jobs submitted over an API get) refuses every function that touches the filesystem, and
``FilePolicy.beside(job_path)`` (``driversdk validate`` / ``run`` of a local file) lets them read
regular files below the job file's directory, and nothing else:

* the path is resolved below the root one component at a time from the root's descriptor, with
  O_NOFOLLOW: no symlink is ever followed (not even one pointing inside), ``..`` cannot leave;
* ``~`` is refused; an absolute path only when it names something below the root;
* the file is opened as O_PATH first and must be a regular file (no device, fifo or socket is
  ever opened for reading, so /dev/zero or a fifo cannot flood or block), of at most
  MAX_READ_FILE_BYTES, and all reads of an evaluation at most MAX_READ_TOTAL_BYTES;
* ``fileset`` walks below the root only, lists regular files only, never enters a symlink, and
  looks at MAX_FILESET_ENTRIES entries at most.

Every refusal is a :class:`FunctionError` the evaluator turns into one sentence with the file and
line of the call.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from driversdk.jobspec.hcl.values import ConvertError, Value, to_string
from driversdk.jobspec.hcllimits import MAX_READ_FILE_BYTES, Budget

FILES_OFF = (
    "file functions are turned off for this job (it was not read from a file on this machine); "
    "put the value in the job file itself"
)


@dataclass(frozen=True)
class FilePolicy:
    """Where a job file's file functions may read: below ``root``, or nowhere (None)."""

    root: Path | None = None
    # The sentence a refused file function says when there is no root (who turned them off, and
    # what to do instead); empty for the general one.
    refusal: str = ""

    @classmethod
    def none(cls) -> FilePolicy:
        return cls(None)

    @classmethod
    def beside(cls, job_path: str) -> FilePolicy:
        """Below the job file's directory; nowhere for a job read from stdin ("-"), or for one
        directly in / (whose "directory" would be the whole host)."""
        if job_path == "-":
            return cls(None)
        root = Path(os.path.dirname(os.path.abspath(job_path)))
        return cls(None if root == Path("/") else root)


_OPEN_PATH = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class FileReader:
    """The file functions of one evaluation, bound to its policy and its budget."""

    def __init__(self, policy: FilePolicy, budget: Budget, error: Callable[[str], Exception]) -> None:
        self.policy = policy
        self.budget = budget
        self.error = error

    # --- where a path leads ------------------------------------------------------------------

    def _root(self) -> Path:
        if self.policy.root is None:
            raise self.error(self.policy.refusal or FILES_OFF)
        return self.policy.root

    def _parts(self, arg: Value) -> tuple[str, list[str]]:
        """The components of ``arg`` below the root, or a refusal naming the path."""
        root = self._root()
        try:
            text = to_string(arg)
        except ConvertError as err:
            raise self.error(str(err)) from None
        outside = (
            f"{text!r} is outside the job file's directory {root}; a job file reads only files below its own "
            "directory: move the file next to the job file"
        )
        if "\x00" in text:
            raise self.error(f"{text!r} holds a NUL byte, which no path may")
        if text.startswith("~"):
            raise self.error(
                f"{text!r} starts with ~, and a job file reads only files below its own directory {root}: "
                "move the file next to the job file and give its relative path"
            )
        if os.path.isabs(text):
            norm = os.path.normpath(text)
            for base in dict.fromkeys((str(root), os.path.realpath(root))):
                if norm == base or norm.startswith(base.rstrip("/") + "/"):
                    text = os.path.relpath(norm, base)
                    break
            else:
                raise self.error(outside)
        rel = os.path.normpath(text)
        if rel == ".." or rel.startswith("../"):
            raise self.error(outside)
        return text, [] if rel == "." else rel.split("/")

    @contextmanager
    def _at(self, arg: Value, *, want_dir: bool = False) -> Iterator[tuple[str, int | None, os.stat_result]]:
        """An O_PATH descriptor of what ``arg`` names below the root (None when it does not
        exist), its stat, never through a symlink."""
        shown, parts = self._parts(arg)
        root = self._root()
        try:
            fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            raise self.error(f"the job file's directory {root} cannot be opened: {err.strerror or err}") from None
        try:
            info = os.fstat(fd)
            for index, part in enumerate(parts):
                try:
                    nfd = os.open(part, _OPEN_PATH, dir_fd=fd)
                except FileNotFoundError:
                    yield shown, None, info
                    return
                except OSError as err:
                    raise self.error(f"{shown!r} cannot be opened: {err.strerror or err}") from None
                os.close(fd)
                fd = nfd
                info = os.fstat(fd)
                if stat.S_ISLNK(info.st_mode):
                    where = "/".join(parts[: index + 1])
                    raise self.error(
                        f"{shown!r} goes through the symbolic link {where!r}, and file functions follow none: "
                        "put the file itself below the job file's directory"
                    )
                if index < len(parts) - 1 and not stat.S_ISDIR(info.st_mode):
                    yield shown, None, info
                    return
            if want_dir and not stat.S_ISDIR(info.st_mode):
                raise self.error(f"{shown!r} is not a directory")
            yield shown, fd, info
        finally:
            os.close(fd)

    # --- the functions ---------------------------------------------------------------------------

    def read(self, arg: Value) -> bytes:
        with self._at(arg) as (shown, fd, info):
            if fd is None:
                raise self.error(f"there is no file {shown!r} below the job file's directory {self._root()}")
            if not stat.S_ISREG(info.st_mode):
                raise self.error(f"{shown!r} is not a regular file ({_kind(info.st_mode)}); give a regular file")
            if info.st_size > MAX_READ_FILE_BYTES:
                raise self.error(
                    f"{shown!r} is {info.st_size} bytes, more than the {MAX_READ_FILE_BYTES} a file function reads; "
                    "give a smaller file"
                )
            # Opened for reading only now that it is known to be a regular file, through the
            # descriptor already held (no second lookup of the path).
            try:
                rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
            except OSError as err:
                raise self.error(f"{shown!r} cannot be read: {err.strerror or err}") from None
            try:
                again = os.fstat(rfd)
                if (again.st_dev, again.st_ino) != (info.st_dev, info.st_ino):
                    raise self.error(f"{shown!r} changed while it was opened; try again")
                chunks: list[bytes] = []
                total = 0
                while total <= MAX_READ_FILE_BYTES:
                    chunk = os.read(rfd, MAX_READ_FILE_BYTES + 1 - total)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    total += len(chunk)
            except OSError as err:
                raise self.error(f"{shown!r} cannot be read: {err.strerror or err}") from None
            finally:
                os.close(rfd)
        if total > MAX_READ_FILE_BYTES:
            raise self.error(f"{shown!r} grew past the {MAX_READ_FILE_BYTES} bytes a file function reads")
        self.budget.read(total)
        return b"".join(chunks)

    def exists(self, arg: Value) -> bool:
        """Whether a regular file is there; refused (not false) for a path outside the root or
        through a symlink, so the answer says nothing about the rest of the host."""
        with self._at(arg) as (_, fd, info):
            return fd is not None and stat.S_ISREG(info.st_mode)

    def fileset(self, path: Value, pattern: Value) -> list[str]:
        try:
            glob = to_string(pattern)
        except ConvertError as err:
            raise self.error(str(err)) from None
        if glob.startswith("/") or ".." in glob.split("/"):
            raise self.error(f"the pattern {glob!r} must be relative and stay below the path; drop the / or ..")
        matcher = _glob_regex(glob)
        max_depth = None if "**" in glob else glob.count("/") + 1
        out: list[str] = []
        with self._at(path, want_dir=True) as (shown, fd, _):
            if fd is None:
                return []
            stack: list[tuple[int, str, int]] = [(os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
                                                          dir_fd=fd), "", 1)]  # fmt: skip
            try:
                while stack:
                    dfd, prefix, depth = stack.pop()
                    try:
                        with os.scandir(dfd) as entries:
                            listed = list(entries)
                        self.budget.listed(len(listed))
                        for entry in listed:
                            rel = prefix + entry.name
                            if entry.is_symlink():
                                continue  # never followed, never listed
                            if entry.is_dir(follow_symlinks=False):
                                if max_depth is None or depth < max_depth:
                                    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                                    try:
                                        stack.append((os.open(entry.name, flags, dir_fd=dfd), rel + "/", depth + 1))
                                    except OSError:
                                        continue  # gone, or swapped for a symlink: not listed
                            elif entry.is_file(follow_symlinks=False) and matcher.fullmatch(rel):
                                out.append(rel)
                    finally:
                        os.close(dfd)
            except OSError as err:
                raise self.error(f"{shown!r} cannot be listed: {err.strerror or err}") from None
            finally:
                for dfd, _, _ in stack:
                    os.close(dfd)
        return sorted(out)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a fifo"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def _glob_regex(pattern: str) -> re.Pattern[str]:
    """A fileset pattern as a regex over paths relative to its directory: ``**`` any number of
    directories, ``*`` and ``?`` within one name, ``[…]`` a class, ``{a,b}`` alternatives."""
    out: list[str] = []
    i = 0
    n = len(pattern)
    depth = 0
    while i < n:
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape("["))
                i += 1
                continue
            body = pattern[i + 1 : end]
            if body[:1] in ("!", "^"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif pattern[i] == "{":
            out.append("(?:")
            depth += 1
            i += 1
        elif pattern[i] == "," and depth:
            out.append("|")
            i += 1
        elif pattern[i] == "}" and depth:
            out.append(")")
            depth -= 1
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    out.append(")" * depth)
    try:
        return re.compile("".join(out))
    except re.error:
        return re.compile(re.escape(pattern))


__all__ = ["FilePolicy", "FileReader"]
