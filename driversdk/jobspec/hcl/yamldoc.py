"""The YAML reading behind ``yamldecode``: PyYAML's safe loader, told to make only what Nomad's
YAML decoder (cty's) makes, so every value it hands on is an HCL value.

Where PyYAML and cty part, cty's documented mapping wins (Nomad's yamldecode page):

- a timestamp is a string in RFC 3339 (``2001-12-14`` → ``"2001-12-14T00:00:00Z"``; a fraction
  of a second is dropped, as Go's RFC 3339 layout drops it). A plain scalar is a timestamp only
  in the forms cty reads as one; any other (``2001-12-14 21:59:43.10 -5``) stays the text as
  written, as in cty. An explicit ``!!timestamp`` that is none of those forms is refused;
- ``!!binary`` is its base64 text as written, once checked to be base64;
- ``!!set``, ``!!omap`` and ``!!pairs`` have no HCL value: refused, as cty refuses a mapping or
  sequence with any tag but ``!!map`` / ``!!seq``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from datetime import UTC, datetime, timedelta, timezone

from driversdk.errors import DriverSDKError
from driversdk.jobspec.hcl.values import to_string


class YAMLValueError(DriverSDKError, ValueError):
    """YAML that is well formed but holds what cty's decoder refuses; the message says what, where."""


_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_BINARY = "tag:yaml.org,2002:binary"
# What a plain scalar in one of cty's timestamp forms resolves to here (never written in a file:
# it is not a tag YAML knows), so that only an explicit !!timestamp can fail.
_PLAIN_TIMESTAMP = "tag:driversdk,2026:plain-timestamp"
_REFUSED = {
    "tag:yaml.org,2002:set": "a sequence (a list)",
    "tag:yaml.org,2002:omap": "a mapping",
    "tag:yaml.org,2002:pairs": "a mapping or a sequence of mappings",
}

# The forms Go's time.Parse accepts in cty's YAML decoder: a date with 1- or 2-digit month and
# day, alone, or with a time after "T"/"t" and a zone ("Z" or ±hh:mm), or after one space and no
# zone (UTC). Seconds may have a fraction, after "." or ",".
_FORMS = re.compile(
    r"(?P<y>[0-9]{4})-(?P<mo>[0-9]{1,2})-(?P<d>[0-9]{1,2})"
    r"(?:(?:[Tt](?P<h>[0-9]{1,2}):(?P<mi>[0-9]{1,2}):(?P<s>[0-9]{1,2})(?:[.,][0-9]+)?(?P<z>Z|[+-][0-9]{2}:[0-9]{2}))"
    r"|(?: (?P<h2>[0-9]{1,2}):(?P<mi2>[0-9]{1,2}):(?P<s2>[0-9]{1,2})(?:[.,][0-9]+)?))?"
)


def rfc3339(text: str) -> str | None:
    """``text`` as cty's YAML decoder writes a timestamp, or None when it is none of its forms
    (or no real date and time, as 2001-02-30)."""
    m = _FORMS.fullmatch(text)
    if m is None:
        return None
    hour, minute, second = (m["h"] or m["h2"] or "0"), (m["mi"] or m["mi2"] or "0"), (m["s"] or m["s2"] or "0")
    try:
        zone = UTC
        if m["z"] and m["z"] != "Z":
            sign = -1 if m["z"][0] == "-" else 1
            hours, minutes = int(m["z"][1:3]), int(m["z"][4:6])
            if minutes > 59:  # Go refuses it; timedelta would carry it into the hours
                return None
            zone = timezone(sign * timedelta(hours=hours, minutes=minutes))  # ValueError past 23:59
        when = datetime(int(m["y"]), int(m["mo"]), int(m["d"]), int(hour), int(minute), int(second), tzinfo=zone)
    except ValueError:
        return None
    offset = when.utcoffset()
    written = when.strftime("%Y-%m-%dT%H:%M:%S")
    return written + ("Z" if not offset else when.strftime("%z")[:3] + ":" + when.strftime("%z")[3:])


def _where(node: object) -> str:
    mark = getattr(node, "start_mark", None)
    line, column = getattr(mark, "line", None), getattr(mark, "column", None)
    return f" at line {line + 1}, column {column + 1} of the YAML" if line is not None and column is not None else ""


def _short(tag: str) -> str:
    return tag.replace("tag:yaml.org,2002:", "!!")


@functools.cache
def _loader() -> type:
    """PyYAML's SafeLoader with cty's timestamps, binary and refusals (built once, on first use:
    PyYAML is imported only when a job calls yamldecode)."""
    import yaml

    class CtyLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML is untyped here (see pyproject)
        # Plain scalars: PyYAML's timestamp pattern out, cty's forms in (they start with a digit).
        yaml_implicit_resolvers = {
            first: [(tag, rx) for tag, rx in entries if tag != _TIMESTAMP]
            for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()
        }

        def construct_mapping(self, node: object, deep: bool = False) -> dict[str, object]:
            # Keys as cty writes them, before they meet in a dict: Python's would merge true: and
            # 1: (True == 1), and could not hold a key that is a list.
            if not isinstance(node, yaml.MappingNode):
                raise YAMLValueError(f"a mapping was expected{_where(node)}")
            self.flatten_mapping(node)
            mapping: dict[str, object] = {}
            for key_node, value_node in node.value:
                key = _key(self.construct_object(key_node, deep=deep), key_node)
                mapping[key] = self.construct_object(value_node, deep=deep)
            return mapping

    CtyLoader.add_implicit_resolver(_PLAIN_TIMESTAMP, re.compile(_FORMS.pattern + "$"), list("0123456789"))
    CtyLoader.add_constructor(_PLAIN_TIMESTAMP, _plain_timestamp)
    CtyLoader.add_constructor(_TIMESTAMP, _timestamp)
    CtyLoader.add_constructor(_BINARY, _binary)
    for tag in _REFUSED:
        CtyLoader.add_constructor(tag, _refused)
    return CtyLoader


def _key(key: object, node: object) -> str:
    """A mapping key as cty writes it: true → "true", 1.0 → "1"; null or a collection refused."""
    if key is None:
        raise YAMLValueError(f"a mapping key{_where(node)} is null, and a key cannot be")
    if isinstance(key, bool | int | float | str):
        return to_string(key)
    raise YAMLValueError(f"a mapping key{_where(node)} is a {type(key).__name__}; only strings may be keys")


def _text(node: object) -> str:
    return str(getattr(node, "value", ""))


def _plain_timestamp(loader: object, node: object) -> str:
    text = _text(node)
    return rfc3339(text) or text


def _timestamp(loader: object, node: object) -> str:
    written = rfc3339(_text(node))
    if written is None:
        raise YAMLValueError(f"{_text(node)!r}{_where(node)} is not a timestamp (write one as 2001-12-14T21:59:43Z)")
    return written


def _binary(loader: object, node: object) -> str:
    text = _text(node)
    try:  # Go's base64 skips line breaks; anything else must be base64, padded
        base64.b64decode(text.replace("\r", "").replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        raise YAMLValueError(f"the !!binary value{_where(node)} is not valid base64") from None
    return text


def _refused(loader: object, node: object) -> str:
    tag = str(getattr(node, "tag", ""))
    raise YAMLValueError(f"{_short(tag)}{_where(node)} has no HCL value; write {_REFUSED[tag]} instead")


def load(text: str) -> object:
    """The one YAML document in ``text``: None, bool, int, float, str, and lists and dicts (with
    string keys) of them. Raises
    YAMLValueError for what cty refuses, yaml.YAMLError for text that is not YAML."""
    import yaml

    # yaml.load with a SafeLoader subclass: constructs no Python objects, as safe_load.
    document: object = yaml.load(text, Loader=_loader())
    return document
