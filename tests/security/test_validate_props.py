"""Property: for any job file and client file (hostile names, values of the wrong type, blocks
where values belong and values where blocks belong), validation returns a verdict and never
raises; through the real CLI it never prints a traceback.

Drivers are never "docker" or "exec" and plugin blocks never match a driver, so no plugin is
launched: the property is about reading files, not about plugins."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driversdk.agent.validate import Report, check_files

ROOT = Path(__file__).resolve().parents[2]

HOSTILE_NAMES = ["", ".", "..", "a/b", "/../../x/victim", "n" * 300, "a\x00b", "a\nb", "\x1b[31m", "é" * 130]
safe_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
names = st.one_of(st.sampled_from(HOSTILE_NAMES), safe_text, st.sampled_from(["web", "db", "v", "p"]))


def hcl_string(value: str) -> str:
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    # Template sequences are escaped, so the string stays a literal.
    return '"' + "".join(out).replace("${", "$${").replace("%{", "%%{") + '"'


scalars = st.one_of(
    names,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.sampled_from(["5s", "1m30s", ".", "-5s", "SIGTERM", "SIGFOO", "host", "csi", "node", "/data", "/../etc"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b", "gc", "image"]), inner, max_size=3)
    ),
    max_leaves=6,
)


def value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return hcl_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    return "{" + ", ".join(f"{k} = {value_text(v)}" for k, v in value.items()) + "}"


def body_text(body: dict[str, Any]) -> str:
    """Attributes are (key, value); blocks are (key, ("block", label | None, body))."""
    lines = []
    for key, item in body.items():
        name = key.split("#")[0]  # "task#1": a second block of the same type
        if isinstance(item, tuple):
            _, label, inner = item
            head = f"{name} {hcl_string(label)}" if label is not None else name
            lines.append(f"{head} {{\n{body_text(inner)}\n}}")
        else:
            lines.append(f"{name} = {value_text(item)}")
    return "\n".join(lines)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy, values)


@st.composite
def attrs(draw: st.DrawFn, spec: dict[str, st.SearchStrategy[Any]]) -> dict[str, Any]:
    out = {}
    for key, strategy in spec.items():
        value = draw(maybe(strategy))
        if value is not None:
            out[key] = value
    if draw(st.booleans()):
        out[draw(st.sampled_from(["extra", "config", "resources", "volume", "task"]))] = draw(values)
    return out


def block(label: st.SearchStrategy[Any], inner: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Any]:
    return st.tuples(st.just("block"), label, inner)


task_body = st.builds(
    lambda a, res, csi, mount, config: {
        **a,
        **({"resources": ("block", None, res)} if res is not None else {}),
        **({"csi_plugin": ("block", None, csi)} if csi is not None else {}),
        **({"volume_mount": ("block", None, mount)} if mount is not None else {}),
        **({"config": ("block", None, config)} if config is not None else {}),
    },
    attrs(
        {
            "driver": st.sampled_from(["d1", "d2", "", "../d", "a/b"]),
            "kill_timeout": st.sampled_from(["5s", "x", ".", ""]),
            "kill_signal": st.sampled_from(["SIGTERM", "term", "SIGFOO", "SIG_IGN"]),
        }
    ),
    st.none() | attrs({"cpu": st.integers(-5, 300000), "memory": st.integers(-5, 2**31), "memory_max": st.integers()}),
    st.none() | attrs({"id": names, "type": st.sampled_from(["node", "monolith", "x"]), "health_timeout": names}),
    st.none() | attrs({"volume": names, "destination": st.sampled_from(["/data", "rel", "/../x", "/a\x00b"])}),
    st.none() | attrs({"command": names, "gc": st.booleans()}),
)
volume_body = attrs(
    {
        "type": st.sampled_from(["host", "csi", "x"]),
        "source": names,
        "per_alloc": st.booleans(),
        "access_mode": st.sampled_from(["single-node-writer", "multi-node-reader-only", "x"]),
        "attachment_mode": st.sampled_from(["file-system", "block-device"]),
        "read_only": st.booleans(),
    }
)
group_body = st.builds(
    lambda a, vols, tasks: {
        **a,
        **{f"volume#{i}": ("block", n, b) for i, (n, b) in enumerate(vols)},
        **{f"task#{i}": ("block", n, b) for i, (n, b) in enumerate(tasks)},
    },
    attrs({"count": st.integers(-3, 1500)}),
    st.lists(st.tuples(names, volume_body), max_size=2),
    st.lists(st.tuples(names, task_body), max_size=2),
)
job_body = st.builds(
    lambda a, groups: {**a, **{f"group#{i}": ("block", n, b) for i, (n, b) in enumerate(groups)}},
    attrs({"type": st.sampled_from(["service", "batch", "system"]), "namespace": names}),
    st.lists(st.tuples(names, group_body), max_size=2),
)


@st.composite
def client_body(draw: st.DrawFn, data_dir: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # Only a temporary directory or a value that is refused: validation must never touch the host.
    choice = draw(st.sampled_from(["ok", "none", "bad"]))
    if choice == "ok":
        out["data_dir"] = data_dir
    elif choice == "bad":
        out["data_dir"] = draw(st.sampled_from([42, "relative", True, [data_dir], "a\x00b"]))
    for i, name in enumerate(draw(st.lists(names, max_size=2))):
        paths = st.sampled_from([data_dir + "/hv", "/", "rel/dir", data_dir + "/link"])
        out[f"host_volume#{i}"] = ("block", name, draw(attrs({"path": paths, "read_only": st.booleans()})))
    for i, name in enumerate(draw(st.lists(st.sampled_from(["p1", "p2"]), max_size=2))):
        spec = {"command": st.just(["/nonexistent"]), "args": st.just(["x"]), "config": st.just({"a": 1})}
        out[f"plugin#{i}"] = ("block", name, draw(attrs(spec)))
    return out


def assert_verdict(report: Report) -> None:
    assert isinstance(report, Report)
    assert report.valid == (not report.problems)
    for problem in report.problems:
        text = str(problem)
        assert "\n" not in text and "\x00" not in text, text
    json.dumps(report.as_dict())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(job=job_body, data=st.data())
def test_validation_always_returns_a_verdict(job: dict[str, Any], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory(prefix="dsx-prop-") as tmp:
        work = Path(tmp)
        (work / "hv").mkdir()
        (work / "link").symlink_to("/")
        job_file = work / "job.hcl"
        job_file.write_text(body_text({"job": ("block", data.draw(names), job)}))
        client_file = work / "client.hcl"
        client_file.write_text(body_text(data.draw(client_body(str(work / "data")))))
        assert_verdict(check_files(str(job_file), str(client_file)))
        assert not (work / "data").exists(), "validation created the data dir"


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(job=job_body, name=names)
def test_the_cli_never_prints_a_traceback(job: dict[str, Any], name: str) -> None:
    with tempfile.TemporaryDirectory(prefix="dsx-prop-") as tmp:
        job_file = Path(tmp) / "job.hcl"
        job_file.write_text(body_text({"job": ("block", name, job)}))
        client_file = Path(tmp) / "client.hcl"
        client_file.write_text(f'data_dir = "{tmp}/data"\n')
        for extra in ([], ["--json"]):
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "driversdk.cli",
                    "validate",
                    str(job_file),
                    "--client",
                    str(client_file),
                    *extra,
                ],
                capture_output=True,
                text=True,
                cwd=ROOT,
                timeout=120,
            )
            assert "Traceback" not in done.stdout + done.stderr
            assert done.returncode in (0, 1), done.stderr
            assert done.stdout or done.stderr.startswith("error: ")
