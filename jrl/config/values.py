r"""Command-line values read as Hydra reads them.

`1` int, `1e-6` / `0.5` / `inf` float, `true` / `False` bool, `null` None, `'a b'` or `"a b"` str,
other bare text str, `[a, 1]` list, `{k: v}` dict (nested freely); `${a.b}` stays text. In bare
text a backslash makes the next of Hydra's special characters plain (`a\,b` is `a,b`).
"""

from __future__ import annotations

import re
from typing import Any

from jrl.config.errors import ConfigError

_INT = re.compile(r"[+-]?(0|[1-9](_?[0-9])*)")
_FLOAT = re.compile(r"[+-]?((\d+\.\d*|\.\d+)([eE][+-]?\d+)?|\d+[eE][+-]?\d+|inf|nan)", re.I)
_QUOTES = "'\""
_ESCAPABLE = "\\()[]{}:=, \t"  # what a backslash escapes in bare text (Hydra's grammar)


def scalar(text: str) -> Any:
    """A bare word as a Hydra scalar: null, bool, int, float, else the text itself."""
    lowered = text.lower()
    if lowered == "null":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


class _Reader:
    """Recursive-descent reader over one value's text."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def fail(self, reason: str) -> ConfigError:
        return ConfigError(f"cannot read value {self.text!r}: {reason}")

    def peek(self) -> str:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise self.fail(f"expected {char!r} at position {self.pos}")
        self.pos += 1

    def quoted(self) -> str:
        """A quoted string, as Hydra reads it: backslashes escape only where they run into a
        quote (each pair is one backslash, an odd one escapes the quote); elsewhere they stay."""
        quote = self.text[self.pos]
        out, self.pos = [], self.pos + 1
        while self.pos < len(self.text) and self.text[self.pos] != quote:
            end = self.pos
            while end < len(self.text) and self.text[end] == "\\":
                end += 1
            if end == self.pos:
                out.append(self.text[self.pos])
                self.pos += 1
            elif end < len(self.text) and self.text[end] == quote:
                run = end - self.pos
                out.append("\\" * (run // 2) + quote * (run % 2))
                self.pos = end + run % 2
            else:
                out.append(self.text[self.pos : end])
                self.pos = end
        if self.pos >= len(self.text):
            raise self.fail(f"missing closing {quote}")
        self.pos += 1
        return "".join(out)

    def bare(self, stops: str) -> str:
        """Text up to one of `stops` (outside `${...}`), stripped, its escapes undone."""
        out = []
        while self.pos < len(self.text) and self.text[self.pos] not in stops:
            start = self.pos
            if self.text.startswith("${", self.pos):
                end = self.text.find("}", self.pos)
                if end < 0:
                    raise self.fail("'${' without '}'")
                self.pos = end + 1
            elif self.text[self.pos] == "\\" and self.text[self.pos + 1 : self.pos + 2]:
                start, self.pos = self.pos + 1, self.pos + 2
                if self.text[start] not in _ESCAPABLE:
                    start -= 1  # not an escape: the backslash stays
            else:
                self.pos += 1
            out.append(self.text[start : self.pos])
        return "".join(out).strip()

    def items(self, close: str, read_item) -> None:
        if self.peek() == close:
            self.pos += 1
            return
        while True:
            read_item()
            if self.peek() == close:
                self.pos += 1
                return
            if not self.peek():
                raise self.fail(f"missing closing {close!r}")
            self.expect(",")

    def element(self, stops: str) -> Any:
        char = self.peek()
        if char == "[":
            self.pos += 1
            values: list[Any] = []
            self.items("]", lambda: values.append(self.element(",]")))
            return values
        if char == "{":
            self.pos += 1
            mapping: dict[str, Any] = {}

            def entry() -> None:
                key = self.quoted() if self.peek() in _QUOTES else self.bare(":,}")
                if not key:
                    raise self.fail("a dict entry needs a key")
                self.expect(":")
                mapping[key] = self.element(",}")

            self.items("}", entry)
            return mapping
        if char and char in _QUOTES:
            return self.quoted()
        return scalar(self.bare(stops))


def parse_value(text: str) -> Any:
    """The Python value of one override's right-hand side, e.g. `[console,wandb]` -> list."""
    stripped = text.strip()
    reader = _Reader(stripped)
    if not stripped or stripped[0] not in "[{" + _QUOTES:
        return scalar(reader.bare(""))
    value = reader.element("")
    if reader.peek():
        raise reader.fail(f"unexpected text {stripped[reader.pos :]!r} after the value")
    return value
