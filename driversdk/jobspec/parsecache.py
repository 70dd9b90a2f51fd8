"""The HCL parsers, built once per process and kept on disk between processes.

Every ``driversdk validate`` / ``run`` is a fresh process that reads an agent config (HCL1,
pyhcl) and a job (HCL2, python-hcl2's lark grammar). Building those parsers was most of what
validation cost: pyhcl's bundled PLY computes its LALR tables on every ``hcl.loads`` (its PLY no
longer writes table modules), and lark rebuilds its parser from python-hcl2's cache file object
by object. Here each parser is built once per process, and what it is built from is kept in a
private cache dir:

* pyhcl: the LALR tables and productions as JSON; the grammar actions are bound to a fresh
  ``HclParser`` again on load, so the file holds no code.
* the results: an agent config's parsed value and a job file's parse tree, as JSON, one file
  per text (the newest KEPT_LIMIT of each kind, at most KEPT_BYTES_LIMIT of each kind in all),
  under a key of the text and the parser's sources: a command that reads a text read before
  imports no parser. Texts over MAX_CACHED_TEXT_BYTES are never kept: a tree is ~30x its text
  as JSON, and a hostile job file must not leave hundreds of MB in the cache.
* lark: the whole parser pickled (the C unpickler makes its objects several times faster than
  lark's own loader). A pickle can run code, so it is only read from a directory that is ours
  alone (0700, owned by this user, not a symlink), from a file that is ours and not writable by
  others, and only the lark / python-hcl2 classes it is made of may be named in it.

Each file starts with a key: a hash of the sources the tables come from (the grammars, the
parser generators, the Python version), so an upgrade never reads tables of another version.
Anything wrong with the cache — no home, an unwritable or foreign dir, a truncated or tampered
file — falls back to building the parser as before; the cache is never needed for correctness.

The dir is ``$DRIVERSDK_CACHE_DIR``, else ``$XDG_CACHE_HOME/driversdk``, else
``~/.cache/driversdk``.
"""

from __future__ import annotations

import copyreg
import functools
import hashlib
import importlib
import io
import json
import os
import pickle
import re
import stat
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from driversdk import privatedir
from driversdk.jobspec.hcllimits import MAX_CACHED_TEXT_BYTES, MIB

if TYPE_CHECKING:
    from lark import Lark

    from driversdk.jobspec.hcl.tree import Tree

ENV_CACHE_DIR = privatedir.ENV_CACHE_DIR
FORMAT = "2"  # bumped when what a cache file holds changes (2: lark actions as globals)
HCL1_FILE = "hcl1-tables.json"
HCL2_FILE = "hcl2-lark.pickle"
TREE_PREFIX = "hcl2-tree-"  # + the key's hash + ".json": one parsed job file each
HCL1_RESULT_PREFIX = "hcl1-result-"  # + the key's hash + ".json": one parsed agent config each
KEPT_LIMIT = 128  # files kept of each prefix; the oldest written go first
KEPT_BYTES_LIMIT = 64 * MIB  # and their sizes added up; a real job's tree is 10-100 KB


def cache_dir() -> Path:
    """Where the parser caches live (the directory may not exist yet)."""
    return Path(privatedir.cache_dir())


def _private_dir(create: bool) -> Path | None:
    """The cache dir when it is ours alone (created 0700 when ``create``), else None."""
    path = privatedir.private_dir(create)
    return Path(path) if path is not None else None


def _key(*sources: str) -> str:
    digest = hashlib.sha256(f"{FORMAT}\n{sys.version}\n".encode())
    for source in sources:
        digest.update(source.encode() + b"\0")
        try:
            digest.update(Path(source).read_bytes())
        except OSError:
            digest.update(b"<missing>")
    return digest.hexdigest()


def read(name: str, key: str) -> bytes | None:
    """The payload of cache file ``name`` when it was written for ``key`` and can be trusted."""
    directory = _private_dir(create=False)
    if directory is None:
        return None
    try:
        fd = os.open(directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read()
    except OSError:
        return None
    finally:
        os.close(fd)
    header, newline, payload = data.partition(b"\n")
    if not newline or header != key.encode():
        return None  # another version's tables, or a file cut short
    return payload


def write(name: str, key: str, payload: bytes) -> bool:
    """Replace cache file ``name`` atomically (readers see the old or the new file, whole)."""
    directory = _private_dir(create=True)
    if directory is None:
        return False
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)  # 0600
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(key.encode() + b"\n" + payload)
        os.replace(temp, directory / name)
        return True
    except OSError:
        try:
            os.unlink(temp)
        except OSError:
            pass
        return False


# --- HCL1 (pyhcl) ---------------------------------------------------------------------------


class _Production:
    """What PLY's LR engine reads of a production (name, length, action) when it reduces."""

    __slots__ = ("callable", "func", "len", "name", "str")

    def __init__(self, name: str, length: int, func: str | None, action: Any) -> None:
        self.name = name
        self.len = length
        self.func = func
        self.callable = action
        self.str = name


def _hcl1_tables(lr: Any) -> dict[str, Any]:
    return {
        "action": {str(state): actions for state, actions in lr.action.items()},
        "goto": {str(state): gotos for state, gotos in lr.goto.items()},
        "productions": [[p.name, p.len, p.func] for p in lr.productions],
    }


def _int_keyed(table: Any) -> dict[int, dict[str, int]]:
    if not isinstance(table, dict):
        raise ValueError("not a table")
    out: dict[int, dict[str, int]] = {}
    for state, row in table.items():
        if not isinstance(row, dict) or not all(isinstance(k, str) and type(v) is int for k, v in row.items()):
            raise ValueError("not a table row")
        out[int(state)] = row
    return out


def _hcl1_from_tables(tables: Any) -> Any:
    """An ``HclParser`` whose PLY engine runs on cached tables; ValueError if they do not fit."""
    from hcl.parser import HclParser
    from hcl.ply import yacc

    if not isinstance(tables, dict):
        raise ValueError("not a table file")
    parser = HclParser.__new__(HclParser)
    productions = []
    for entry in tables["productions"]:
        name, length, func = entry
        if not isinstance(name, str) or type(length) is not int or not (func is None or isinstance(func, str)):
            raise ValueError("not a production")
        # Only the grammar's own actions (p_*) are ever bound: the file names methods, never code.
        if func is not None and (not func.startswith("p_") or not callable(getattr(HclParser, func, None))):
            raise ValueError(f"no grammar action {func!r}")
        productions.append(_Production(name, length, func, getattr(parser, func) if func else None))
    lrtab = types.SimpleNamespace(
        lr_productions=productions, lr_action=_int_keyed(tables["action"]), lr_goto=_int_keyed(tables["goto"])
    )
    parser.yacc = yacc.LRParser(lrtab, parser.p_error)
    return parser


@functools.cache
def _hcl1_parser() -> Any:
    import hcl.parser
    from hcl.ply import yacc

    key = _key(str(hcl.parser.__file__), str(yacc.__file__))
    payload = read(HCL1_FILE, key)
    if payload is not None:
        try:
            return _hcl1_from_tables(json.loads(payload))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass  # a damaged file: built afresh and written again below
    parser = hcl.parser.HclParser()
    write(HCL1_FILE, key, json.dumps(_hcl1_tables(parser.yacc)).encode())
    return parser


_hcl1_lock = threading.Lock()


def hcl1_loads(text: str, keep: bool = False) -> Any:
    """``hcl.loads(text)`` on this process's one pyhcl parser (PLY's engine keeps its stacks on
    the parser object, so parses take turns).

    With ``keep`` (an agent config, read by every command), what the text parses to is kept as
    JSON under a key of the text and pyhcl's sources: the next command that reads the same text
    imports no parser at all. Syntax errors are never kept."""
    keep = keep and len(text) <= MAX_CACHED_TEXT_BYTES
    if keep:
        kept = _read_kept(HCL1_RESULT_PREFIX, _hcl1_result_key(text))
        if isinstance(kept, dict):
            return kept
    from hcl.api import isHcl

    if not isHcl(text):
        data = json.loads(text)
    else:
        with _hcl1_lock:
            data = _hcl1_parser().parse(text)
    if keep and isinstance(data, dict):
        _keep(HCL1_RESULT_PREFIX, _hcl1_result_key(text), data)
    return data


@functools.cache
def _hcl1_sources_key() -> str:
    from importlib.util import find_spec

    spec = find_spec("hcl")
    origin = spec.origin if spec is not None else None
    if origin is None:
        return _key("<no hcl>")
    here = os.path.dirname(origin)
    names = ("api.py", "lexer.py", "parser.py", "ply/lex.py", "ply/yacc.py")
    return _key(*(os.path.join(here, name) for name in names))


def _hcl1_result_key(text: str) -> str:
    return hashlib.sha256(f"{_hcl1_sources_key()}\n{text}".encode()).hexdigest()


# --- HCL2 (python-hcl2's lark parser) -------------------------------------------------------

# The classes a lark parser is made of come from these; nothing else may be named in the pickle.
_PICKLE_MODULES = ("lark.", "hcl2.")


_ACTIONS = "lark.parsers.lalr_analysis"  # where lark's two LALR actions live, as module globals


def _action_by_name(action: Any) -> str:
    # A reduce value that is a string pickles the object as that global of its module.
    return str(action.name)


class _ParserPickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        from lark.parsers.lalr_analysis import Action

        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        # The LALR engine tells actions apart by identity (``action is Shift``): the singletons are
        # pickled as references to lark's own (a global, memoized: one lookup per load).
        self.dispatch_table = {**copyreg.dispatch_table, Action: _action_by_name}

    def persistent_id(self, obj: Any) -> str | None:
        if type(obj) is types.ModuleType:  # the lexer's regex module
            return f"module:{obj.__name__}"
        return None


class _ParserUnpickler(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> Any:
        if pid in ("module:re", "module:regex"):
            return importlib.import_module(pid.removeprefix("module:"))
        raise pickle.UnpicklingError(f"unexpected reference {pid!r}")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("re", "_compile"):
            # How a compiled pattern pickles (the lexer's, once it has lexed); it only compiles.
            return getattr(re, "_compile")  # noqa: B009 - private to re, not in its stubs
        if module == _ACTIONS and name in ("Shift", "Reduce"):
            from lark.parsers.lalr_analysis import Action

            action = super().find_class(module, name)
            if isinstance(action, Action):
                return action
        allowed = module.startswith(_PICKLE_MODULES) or (module, name) == ("functools", "partial")
        found = super().find_class(module, name) if allowed and "." not in name else None
        if not isinstance(found, type):  # else classes only: no other function can be called from the file
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a parser")
        return found


def _hcl2_key() -> str:
    import hcl2.parser
    import lark

    here = Path(str(hcl2.parser.__file__)).parent
    return _key(
        f"lark {lark.__version__}",
        str(hcl2.parser.__file__),
        str(here / "hcl2.lark"),
        str(here / "postlexer.py"),
        str(Path(str(lark.__file__)).parent / "parsers" / "lalr_analysis.py"),
    )


@functools.cache
def hcl2_parser() -> Lark:
    """python-hcl2's lark parser (the one ``hcl2.parser.parser()`` builds), from the cache when
    it holds one for these versions."""
    from lark import Lark

    key = _hcl2_key()
    payload = read(HCL2_FILE, key)
    if payload is not None:
        try:
            loaded = _ParserUnpickler(io.BytesIO(payload)).load()
        except Exception:  # any damage to the file (unpickling raises many kinds): build afresh
            loaded = None
        if isinstance(loaded, Lark):
            return loaded
    from hcl2.parser import parser

    # A parser of its own, built as python-hcl2 builds its shared one (``parser`` is an lru_cache),
    # and not used yet: one that has lexed holds its compiled patterns, which would be pickled and
    # compiled again on every load instead of on the first parse only.
    built: Lark = parser.__wrapped__()
    out = io.BytesIO()
    try:
        _ParserPickler(out).dump(built)
    except (pickle.PicklingError, TypeError, AttributeError):
        return built  # a lark version whose parser does not pickle: no cache, same parser
    write(HCL2_FILE, key, out.getvalue())
    return built


# --- parsed job files -----------------------------------------------------------------------
#
# A job file validated is usually run next, and run again: its parse tree is kept, as JSON (no
# code can come from it), under a key made of the text and the parser's sources. The key is found
# without importing lark or python-hcl2: a hit is the only case that needs neither.


@functools.cache
def _tree_sources_key() -> str:
    from importlib.util import find_spec

    files: list[str] = [os.path.join(os.path.dirname(__file__), "hcl", "tree.py")]
    for package, names in (
        ("hcl2", ("parser.py", "hcl2.lark", "postlexer.py")),
        ("lark", ("__init__.py", "lexer.py", "parsers/lalr_analysis.py", "parsers/lalr_parser.py")),
    ):
        spec = find_spec(package)
        origin = spec.origin if spec is not None else None
        if origin is None:
            files.append(f"<no {package}>")
            continue
        here = os.path.dirname(origin)
        files += [os.path.join(here, name) for name in names]
    return _key(*files)


def _tree_key(text: str) -> str:
    return hashlib.sha256(f"{_tree_sources_key()}\n{text}".encode()).hexdigest()


def read_tree(text: str) -> Tree | None:
    """The parse tree kept for exactly this text by these parser versions, if any."""
    from driversdk.jobspec.hcl.tree import TreeFormatError, from_plain

    if len(text) > MAX_CACHED_TEXT_BYTES:
        return None  # never kept
    plain = _read_kept(TREE_PREFIX, _tree_key(text))
    if plain is None:
        return None
    try:
        return from_plain(plain)
    except (TreeFormatError, ValueError, RecursionError):  # damaged: parsed afresh and written again
        return None


def write_tree(text: str, tree: Tree) -> None:
    """Keep ``tree`` for the next command that reads ``text``; the oldest trees beyond
    KEPT_LIMIT are removed. Failing to keep it changes nothing but the next command's speed.
    A text over MAX_CACHED_TEXT_BYTES is not kept."""
    from driversdk.jobspec.hcl.tree import to_plain

    if len(text) > MAX_CACHED_TEXT_BYTES:
        return
    try:
        plain = to_plain(tree)
    except RecursionError:
        return
    _keep(TREE_PREFIX, _tree_key(text), plain)


# --- kept parse results: one JSON file per text, ``<prefix><key>.json`` --------------------------


def _read_kept(prefix: str, key: str) -> Any:
    """The JSON value kept for ``key``, or None (none kept, another key's, or not JSON)."""
    payload = read(f"{prefix}{key}.json", key)
    if payload is None:
        return None
    try:
        return json.loads(payload)
    except (ValueError, RecursionError):
        return None


def _keep(prefix: str, key: str, value: Any) -> None:
    try:
        payload = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (ValueError, TypeError, RecursionError):
        return  # not plain JSON: nothing is kept, the next command parses again
    if json.loads(payload) != value:
        return  # JSON would change it (a key that is not a string, a tuple): kept only if read back the same
    if write(f"{prefix}{key}.json", key, payload):
        _prune_kept(prefix)


def _prune_kept(prefix: str) -> None:
    directory = _private_dir(create=False)
    if directory is None:
        return
    try:
        with os.scandir(directory) as entries:
            kept = []
            for entry in entries:
                if entry.name.startswith(prefix) and entry.name.endswith(".json"):
                    info = entry.stat(follow_symlinks=False)
                    kept.append((info.st_mtime_ns, entry.name, info.st_size))
    except OSError:
        return
    # Newest first: each is kept while both the count and the bytes fit.
    kept.sort(reverse=True)
    total = 0
    for index, (_, name, size) in enumerate(kept):
        total += size
        if index < KEPT_LIMIT and total <= KEPT_BYTES_LIMIT:
            continue
        try:
            os.unlink(directory / name)
        except OSError:
            pass
