"""Tool calls in the model's text: the Hermes format, ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>``, as verl's ``multi_turn.format=hermes`` reads it."""

from __future__ import annotations

import dataclasses
import json
import re

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class FunctionCall:
    """One call the model asked for: the tool's name and its arguments as JSON text."""

    name: str
    arguments: str


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn's text without its tool calls, the calls, and how many
    ``<tool_call>`` blocks were not a JSON object with a string ``name`` and ``arguments``
    (any JSON value, as verl reads them: a tool given other than an object answers with an
    error turn, as verl's does)."""

    content: str
    calls: tuple[FunctionCall, ...]
    malformed: int


def parse_hermes(text: str) -> ParsedTurn:
    """The tool calls of `text` in order; a block that does not parse is counted, not called."""
    calls, malformed = [], 0
    for block in _HERMES.findall(text):
        try:
            call = json.loads(block)
            name, arguments = call["name"], call["arguments"]
            if not isinstance(name, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            malformed += 1
            continue
        calls.append(FunctionCall(name, json.dumps(arguments, ensure_ascii=False)))
    return ParsedTurn(_HERMES.sub("", text), tuple(calls), malformed)


# ``multi_turn.format`` -> the parser of that format.
TOOL_CALL_FORMATS = {"hermes": parse_hermes}
