"""Token ids from the chat template, for a conversation that grows turn by turn: the first
prompt (with the tools' schemas), and each later turn as the template's token delta appended to
the exact tokens the model sampled (never re-tokenised from text)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

Messages = Sequence[Mapping[str, Any]]
# A conversation the template renders before the appended turns: the delta is what follows it.
_BEFORE = ({"role": "user", "content": "?"}, {"role": "assistant", "content": "!"})
# First prompts without and with a system message of their own (`ChatTemplate.tools_tokens`).
_PROBES = (
    ({"role": "user", "content": "?"},),
    ({"role": "system", "content": "."}, {"role": "user", "content": "?"}),
)
# Where a template ignores `tools=`, the schemas go into this system message (Hermes style).
TOOLS_SYSTEM_PROMPT = (
    "You may call one or more functions to assist with the user query. The functions are:\n"
    "<tools>\n{tools}\n</tools>\n"
    "For each call, answer with a JSON object of the function's name and arguments inside "
    '<tool_call></tool_call> tags, e.g. <tool_call>{{"name": "f", "arguments": {{"x": 1}}}}'
    "</tool_call>"
)


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """A run's chat template, probed once (`of`): its options (`kwargs`, with ``tools=`` where
    the template renders the tools), the system message that lists the tools where it does not
    (`tool_listing`), and the text it writes for a probe conversation through the assistant's
    EOS (`before_delta`: a turn delta is what follows it)."""

    tokenizer: Any
    kwargs: Mapping[str, Any]
    tool_listing: str | None
    before_delta: str

    @classmethod
    def of(
        cls, tokenizer: Any, template_kwargs: Mapping[str, Any], tools: Sequence[Mapping[str, Any]]
    ) -> ChatTemplate:
        plain = cls(tokenizer, dict(template_kwargs), None, "")
        kwargs, listing = plain.kwargs, None
        if tools:
            shown = {**kwargs, "tools": list(tools)}
            if plain.with_kwargs(shown).render(_BEFORE, True) != plain.render(_BEFORE, True):
                kwargs = shown
            else:
                listing = TOOLS_SYSTEM_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
        before = plain.with_kwargs(kwargs).render(_BEFORE, False)
        return cls(tokenizer, kwargs, listing, plain.through_last_eos(before))

    def with_kwargs(self, kwargs: Mapping[str, Any]) -> ChatTemplate:
        return dataclasses.replace(self, kwargs=kwargs)

    def render(self, messages: Messages, generation: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=generation, **self.kwargs
        )

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def through_last_eos(self, text: str) -> str:
        """`text` up to and including its last EOS token (all of it when it has none)."""
        eos = self.tokenizer.eos_token
        end = text.rfind(eos) if eos else -1
        return text[: end + len(eos)] if end >= 0 else text

    def show_tools(self, messages: Messages) -> list[dict[str, Any]]:
        """`messages` with the tools' listing added to (or as) the system message where the
        template does not render ``tools=``."""
        messages = [dict(m) for m in messages]
        if self.tool_listing is None:
            return messages
        if messages and messages[0].get("role") == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{self.tool_listing}"
        else:
            messages.insert(0, {"role": "system", "content": self.tool_listing})
        return messages

    @property
    def tools_tokens(self) -> int:
        """Tokens the tools add to a first prompt (their listing, or the template's rendering of
        them), with or without a system message of the row's own."""
        plain = self.with_kwargs({k: v for k, v in self.kwargs.items() if k != "tools"})
        added = 0
        for probe in _PROBES:
            shown = len(self.prompt_ids(self.show_tools(probe)))
            added = max(added, shown - len(plain.prompt_ids(probe)))
        return added

    def prompt_ids(self, messages: Messages) -> list[int]:
        """The first prompt: the conversation rendered with the generation prompt."""
        return self.ids(self.render(messages, True))

    def turn_delta(self, appended: Messages) -> list[int]:
        """Token ids of the turns `appended` after an assistant turn that ended with the
        tokenizer's EOS token, through the next generation prompt: what the template writes
        after that EOS (its turn separator included).

        The delta starts after as many EOS tokens as the probe conversation holds through its
        assistant turn, not after the probe's text: some templates write the last assistant
        turn otherwise than one that turns follow (Qwen3's adds an empty think block to the
        last), and the turns the model already sampled stay as it sampled them."""
        after = self.render([*_BEFORE, *appended], True)
        eos = self.tokenizer.eos_token
        turns = self.before_delta.count(eos) if eos else 0
        if not turns:  # no EOS to count: the probe's text itself must lead
            if not after.startswith(self.before_delta):
                raise ValueError(
                    "the chat template renders earlier turns differently once turns follow"
                )
            return self.ids(after[len(self.before_delta) :])
        end = 0  # just past the last EOS found
        for _ in range(turns):
            found = after.find(eos, end)
            if found < 0:
                raise ValueError(
                    f"the chat template ends fewer turns with {eos!r} once turns follow"
                )
            end = found + len(eos)
        return self.ids(after[end:])

    def matches_full_render(self, messages: Messages, ids: Sequence[int], mode: str) -> bool:
        """``tokenization_sanity_check_mode``: whether `ids` (built turn by turn) equal the whole
        conversation `messages` tokenised at once through the model's last EOS (`strict`), or
        equal it once whitespace is stripped from both texts (`ignore_strippable`); always true
        with `disable`."""
        if mode == "disable":
            return True
        whole = self.through_last_eos(self.render(messages, False))
        if mode == "strict":
            return list(ids) == self.ids(whole)
        built = self.tokenizer.decode(list(ids), skip_special_tokens=False)
        return "".join(built.split()) == "".join(whole.split())
