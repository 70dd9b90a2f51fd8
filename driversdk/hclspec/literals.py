"""Evaluate the HCL expression held by an hclspec ``Literal`` (``"\\"5s\\""``, ``true``, ``[]``)."""

from __future__ import annotations

import json
import re
from typing import Any

from driversdk.errors import DriverSDKError
from driversdk.hclspec.types import to_number


class LiteralError(DriverSDKError, ValueError):
    """A Literal whose expression we cannot evaluate (also a ValueError, so a caller that catches
    ValueError for a bad value catches it)."""


_NUMBER = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def evaluate_literal(text: str) -> Any:
    parser = _Parser(text)
    value = parser.value()
    parser.skip_space()
    if parser.i != len(text):
        raise LiteralError(f"literal {text!r} has unexpected text at {text[parser.i :]!r}")
    return value


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0

    def skip_space(self) -> None:
        while self.i < len(self.text) and self.text[self.i] in " \t\r\n":
            self.i += 1

    def _peek(self) -> str:
        self.skip_space()
        return self.text[self.i] if self.i < len(self.text) else ""

    def value(self) -> Any:
        ch = self._peek()
        if ch == '"':
            return self._string()
        if ch == "[":
            return self._list()
        if ch == "{":
            return self._object()
        m = _NUMBER.match(self.text, self.i)
        if m:
            self.i = m.end()
            return to_number(m.group(0))
        m = _IDENT.match(self.text, self.i)
        if m:
            word = m.group(0)
            self.i = m.end()
            if word in ("true", "false"):
                return word == "true"
            if word == "null":
                return None
            if self._peek() == "(":
                raise LiteralError(
                    f"literal {self.text!r} calls function {word}(); only constant literals are supported"
                )
            raise LiteralError(f"literal {self.text!r} refers to {word!r}; strings need quotes, e.g. '\"{word}\"'")
        raise LiteralError(f"literal {self.text!r} is not an HCL expression we can evaluate")

    def _string(self) -> str:
        start = self.i
        self.i += 1
        while self.i < len(self.text):
            ch = self.text[self.i]
            if ch == "\\":
                self.i += 2
                continue
            if ch == '"':
                self.i += 1
                raw = self.text[start : self.i]
                if "${" in raw:
                    raise LiteralError(f"literal {self.text!r} uses interpolation, which a default cannot")
                decoded: str = json.loads(raw)
                return decoded
            self.i += 1
        raise LiteralError(f"literal {self.text!r} has an unterminated string")

    def _list(self) -> list[Any]:
        self.i += 1
        items: list[Any] = []
        while self._peek() != "]":
            if self._peek() == "":
                raise LiteralError(f"literal {self.text!r} has an unterminated list")
            items.append(self.value())
            if self._peek() == ",":
                self.i += 1
        self.i += 1
        return items

    def _object(self) -> dict[str, Any]:
        self.i += 1
        out: dict[str, Any] = {}
        while self._peek() != "}":
            ch = self._peek()
            if ch == "":
                raise LiteralError(f"literal {self.text!r} has an unterminated object")
            if ch == '"':
                key = self._string()
            else:
                m = _IDENT.match(self.text, self.i)
                if not m:
                    raise LiteralError(f"literal {self.text!r} has a bad object key at {self.text[self.i :]!r}")
                key = m.group(0)
                self.i = m.end()
            if self._peek() not in ("=", ":"):
                raise LiteralError(f"literal {self.text!r}: expected '=' after key {key!r}")
            self.i += 1
            out[key] = self.value()
            if self._peek() == ",":
                self.i += 1
        self.i += 1
        return out
