"""hclog-style JSON logging: what a Nomad host expects on a plugin's stderr, and its parser.

The host reads stderr line by line. ``@level``, ``@message`` and ``@timestamp`` must be JSON
strings (a number there panics the Nomad agent), the level one of trace|debug|info|warn|error,
and the timestamp in Go's ``2006-01-02T15:04:05.000000Z07:00`` layout: exactly six fractional
digits, then ``Z`` or ``±hh:mm``.
"""

from __future__ import annotations

import atexit
import errno
import json
import logging
import logging.handlers
import os
import queue
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

TRACE = 5
logging.addLevelName(TRACE, "TRACE")

_LEVEL_NAMES = {TRACE: "trace", logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn"}

# Attributes every LogRecord has; anything else came in through `extra=` and is passed on.
_RECORD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


def hclog_level(levelno: int) -> str:
    if levelno >= logging.ERROR:
        return "error"
    for threshold in (logging.WARNING, logging.INFO, logging.DEBUG, TRACE):
        if levelno >= threshold:
            return _LEVEL_NAMES[threshold]
    return "trace"


def hclog_timestamp(when: datetime) -> str:
    """Go layout with microseconds always present (isoformat drops them when they are 0)."""
    when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond:06d}Z"


def _json_safe(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)


class HclogFormatter(logging.Formatter):
    def __init__(self, module: str) -> None:
        super().__init__()
        self.module = module

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}: {self.formatException(record.exc_info)}"
        entry: dict[str, Any] = {
            "@level": hclog_level(record.levelno),
            "@message": message,
            "@module": f"{self.module}.{record.name}" if record.name != "root" else self.module,
            "@timestamp": hclog_timestamp(datetime.fromtimestamp(record.created, UTC)),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and not key.startswith("_") and not key.startswith("@"):
                entry[key] = _json_safe(value)
        return json.dumps(entry, separators=(",", ":"))


class SafeStreamHandler(logging.StreamHandler[TextIO]):
    """A stderr handler that stays quiet when the host is gone (EPIPE) instead of crashing."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.format(record) + "\n")
            self.stream.flush()
        except BrokenPipeError:
            pass
        except OSError as err:
            if err.errno != errno.EPIPE:
                self.handleError(record)
        except Exception:
            self.handleError(record)


GRPC_CYTHON_LOGGER = "grpc._cython.cygrpc"

# Set by a host that wants the plugin's lines kept in a file as well: the host reading stderr may
# be killed and the plugin reattached by its successor, and lines written to the dead pipe in
# between would be lost (Nomad's executor keeps a log file of its own for the same reason).
ENV_LOG_FILE = "DRIVERSDK_PLUGIN_LOG_FILE"
LOG_FILE_BYTES = 10 * 1024 * 1024
LOG_FILE_BACKUPS = 2


class _QuietFileHandler(logging.handlers.RotatingFileHandler):
    """The log file: a line that cannot be written (a full disk) is dropped, not printed as a
    traceback onto stderr, which still carries every line."""

    def handleError(self, record: logging.LogRecord) -> None:
        pass


def _file_handler(path: str) -> logging.Handler | None:
    try:
        # Created owner-only and never through a symlink; the rotating handler then appends to it.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        return _QuietFileHandler(path, maxBytes=LOG_FILE_BYTES, backupCount=LOG_FILE_BACKUPS)
    except OSError:
        return None  # stderr still has every line; the failure is said there once logging is set up


class _Enqueue(logging.handlers.QueueHandler):
    """Hands a record to the writer thread as it is, its message merged with its arguments (the
    arguments may change once the caller goes on); the writer's handlers format it as usual."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record.msg = record.getMessage()
        record.args = None
        return record


_writer: logging.handlers.QueueListener | None = None


def flush_plugin_logging() -> None:
    """Write every line still queued and stop the writer thread (the plugin is exiting)."""
    global _writer
    if _writer is not None:
        _writer.stop()
        _writer = None


def configure_plugin_logging(name: str, level: int = logging.DEBUG, stream: TextIO | None = None) -> None:
    """Send every log record of this process to stderr as one hclog JSON line, and to the file the
    host names in ``DRIVERSDK_PLUGIN_LOG_FILE`` if it names one.

    The lines are written by one thread of their own: a driver call that logs only queues its
    record. Written by the caller, under the handlers' locks, every call thread waited for every
    other's write into the host's stderr pipe (44 of a 1000-task teardown's DestroyTask threads
    at a time, waiting for the host to read)."""
    global _writer
    flush_plugin_logging()
    formatter = HclogFormatter(name)
    handler = SafeStreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    # Taken out of the environment: the tasks and helpers this plugin starts are not its log's writers.
    path = os.environ.pop(ENV_LOG_FILE, None)
    to_file = _file_handler(path) if path else None
    writers: list[logging.Handler] = [handler]
    if to_file is not None:
        to_file.setFormatter(formatter)
        writers.insert(0, to_file)
    lines: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    root.addHandler(_Enqueue(lines))
    _writer = logging.handlers.QueueListener(lines, *writers)
    _writer.start()
    atexit.register(flush_plugin_logging)
    root.setLevel(level)
    # grpc's Cython layer says "Loaded running loop" at debug on every call it serves: two lines a
    # task stop, each formatted twice and relayed by the host, and nothing an operator can act on.
    logging.getLogger(GRPC_CYTHON_LOGGER).setLevel(max(level, logging.INFO))
    if path and to_file is None:
        logging.getLogger("driversdk.plugin").warning("cannot open the plugin log file; logging to stderr only",
                                                      extra={"path": path})  # fmt: skip
    # A logging failure must never print a traceback to a pipe the host may have closed.
    logging.raiseExceptions = False


_PREFIX_LEVELS = {
    "[TRACE]": TRACE,
    "[DEBUG]": logging.DEBUG,
    "[INFO]": logging.INFO,
    "[WARN]": logging.WARNING,
    "[ERROR]": logging.ERROR,
}
_HCLOG_LEVELS = {
    "trace": TRACE,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}


def parse_hclog_line(line: str) -> tuple[int, str, dict[str, Any]]:
    """Host side: turn one plugin stderr line into (level, message, fields) as go-plugin does."""
    text = line.rstrip("\n")
    try:
        entry = json.loads(text)
    except ValueError:
        entry = None
    if isinstance(entry, dict):
        level_name = entry.get("@level")
        message = entry.get("@message")
        if isinstance(level_name, str) and isinstance(message, str):
            level = _HCLOG_LEVELS.get(level_name.lower())
            if level is not None:
                fields = {k: v for k, v in entry.items() if k not in ("@level", "@message", "@timestamp")}
                return level, message, fields
        return logging.DEBUG, text, {}
    for prefix, level in _PREFIX_LEVELS.items():
        if text.startswith(prefix):
            return level, text[len(prefix) :].strip(), {}
    return logging.DEBUG, text, {}
