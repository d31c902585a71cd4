"""Token ids from the chat template, for a conversation that grows turn by turn: the first
prompt (with the tools' schemas), and each later turn as the template's token delta appended to
the exact tokens the model sampled (never re-tokenised from text)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

Messages = Sequence[Mapping[str, Any]]
# A conversation the template renders before the appended turns: the delta is what follows it.
_BEFORE = ({"role": "user", "content": "?"}, {"role": "assistant", "content": "!"})
# Where a template ignores `tools=`, the schemas go into this system message (Hermes style).
TOOLS_SYSTEM_PROMPT = (
    "You may call one or more functions to assist with the user query. The functions are:\n"
    "<tools>\n{tools}\n</tools>\n"
    "For each call, answer with a JSON object of the function's name and arguments inside "
    '<tool_call></tool_call> tags, e.g. <tool_call>{{"name": "f", "arguments": {{"x": 1}}}}'
    "</tool_call>"
)


def _render(tokenizer: Any, messages: Messages, generation: bool, **kwargs: Any) -> str:
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=generation, **kwargs
    )


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def with_tools(
    tokenizer: Any, messages: Messages, tools: Sequence[Mapping[str, Any]], **template: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, template kwargs) that show `tools` to the model: the template's ``tools=``
    where it renders them, else a system message listing their schemas (appended to the
    conversation's own system message, if any)."""
    messages = [dict(m) for m in messages]
    if not tools:
        return messages, template
    if _render(tokenizer, messages, True, tools=list(tools), **template) != _render(
        tokenizer, messages, True, **template
    ):
        return messages, {**template, "tools": list(tools)}
    listing = TOOLS_SYSTEM_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
    if messages and messages[0].get("role") == "system":
        messages[0]["content"] = f"{messages[0]['content']}\n\n{listing}"
    else:
        messages.insert(0, {"role": "system", "content": listing})
    return messages, template


def prompt_ids(tokenizer: Any, messages: Messages, **template: Any) -> list[int]:
    """The first prompt: the conversation rendered with the generation prompt."""
    return _ids(tokenizer, _render(tokenizer, messages, True, **template))


def turn_delta(tokenizer: Any, appended: Messages, **template: Any) -> list[int]:
    """Token ids of the turns `appended` after an assistant turn that ended with the tokenizer's
    EOS token, through the next generation prompt: what the template writes after the EOS
    (its turn separator included)."""
    before = _render(tokenizer, _BEFORE, False, **template)
    after = _render(tokenizer, [*_BEFORE, *appended], True, **template)
    if not after.startswith(before):
        raise ValueError("the chat template renders earlier turns differently once turns follow")
    end = before.rfind(tokenizer.eos_token) if tokenizer.eos_token else -1
    cut = end + len(tokenizer.eos_token) if end >= 0 else len(before)
    return _ids(tokenizer, after[cut:])


def matches_full_render(
    tokenizer: Any, messages: Messages, ids: Sequence[int], mode: str, **template: Any
) -> bool:
    """``tokenization_sanity_check_mode``: whether `ids` (built turn by turn) equal the whole
    conversation `messages` tokenised at once (`strict`), or equal it once whitespace is
    stripped from both texts (`ignore_strippable`); always true with `disable`."""
    if mode == "disable":
        return True
    whole = _render(tokenizer, messages, False, **template)
    end = whole.rfind(tokenizer.eos_token) if tokenizer.eos_token else -1
    whole = whole[: end + len(tokenizer.eos_token)] if end >= 0 else whole  # the model's last EOS
    if mode == "strict":
        return list(ids) == _ids(tokenizer, whole)
    built = tokenizer.decode(list(ids), skip_special_tokens=False)
    return "".join(built.split()) == "".join(whole.split())
