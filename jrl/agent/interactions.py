"""Interactions (verl v0.6.0's ``multi_turn.interaction_config_path``): a simulated user that
answers each assistant turn, may score it, and says when the conversation ends."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import yaml

from jrl.agent.imports import user_class
from jrl.reward import gsm8k

# verl's interaction classes -> jrl's.
VERL_INTERACTIONS = {
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": (
        "jrl.agent.interactions:Gsm8kInteraction"
    )
}
_KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"


class BaseInteraction:
    """verl's interaction lifecycle: ``start_interaction`` -> ``generate_response`` per turn ->
    ``finalize_interaction``, all coroutines."""

    def __init__(self, config: Mapping[str, Any]):
        self.config = dict(config)
        self.name: str = self.config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        return instance_id or uuid.uuid4().hex

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        """(end the conversation?, the user's reply, this turn's score, metrics)."""
        return False, "Your current result seems acceptable.", 0.8, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        return None


class Gsm8kInteraction(BaseInteraction):
    """Tells the model whether its last answer (strict ``#### n`` extraction) equals the ground
    truth; a right answer ends the conversation, a wrong one asks it to try again."""

    def __init__(self, config: Mapping[str, Any]):
        super().__init__(config)
        self._instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(
        self, instance_id: str | None = None, ground_truth: str | None = None, **kwargs: Any
    ) -> str:
        instance_id = await super().start_interaction(instance_id)
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth}
        return instance_id

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs: Any
    ) -> tuple[bool, str, float, dict[str, Any]]:
        said = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
        self._instances[instance_id]["response"] = said[-1] if said else ""
        score = await self.calculate_score(instance_id)
        if score == 1.0:
            return True, "Your response is correct!", score, {}
        reply = "Your response is incorrect! You need to reflect on your answer and try again."
        return False, reply, score, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        state = self._instances[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return float(gsm8k.compute_score(state["response"], state["ground_truth"], method="strict"))

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)


def load_interactions(path: str) -> dict[str, BaseInteraction]:
    """The interactions of the file `path` (``interaction: [{name, class_name, config}]``) by
    name; a missing name is the class name less ``Interaction``, lower-cased, as verl."""
    with open(path) as file:
        entries = (yaml.safe_load(file) or {}).get("interaction")
    if not isinstance(entries, list):
        raise ValueError(f"{_KEY}={path!r}: the file needs a list under 'interaction'")
    found: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(entries):
        where = f"{path} interaction[{i}]"
        class_name = str(entry.get("class_name"))
        cls = user_class(class_name, BaseInteraction, where, VERL_INTERACTIONS)
        short = class_name.replace(":", ".").rsplit(".", 1)[-1]
        name = entry.get("name") or short.removesuffix("Interaction").lower()
        if name in found:
            raise ValueError(f"{where}: a second interaction named {name!r}")
        found[name] = cls({**(entry.get("config") or {}), "name": name})
    return found
