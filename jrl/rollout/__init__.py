"""Rollout engines: generate responses for a batch of prompts (`jax` everywhere, `vllm` on GPU)."""

from __future__ import annotations

import importlib.util
from typing import Any

from jrl.models import CausalLM
from jrl.rollout.jax_rollout import JaxRollout
from jrl.rollout.sampler import generate_tokens
from jrl.rollout.sampling import SamplingParams

__all__ = ["JaxRollout", "SamplingParams", "generate_tokens", "make_rollout"]

_ENGINES = ("jax", "vllm")


def make_rollout(name: str, model: CausalLM, **kwargs: Any) -> JaxRollout:
    """The engine that `actor_rollout_ref.rollout.name` names; `kwargs` go to its constructor."""
    if name == "jax":
        return JaxRollout(model, **kwargs)
    if name == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(
                "actor_rollout_ref.rollout.name=vllm but vllm is not installed: install the vllm "
                "extra on a GPU machine, or set actor_rollout_ref.rollout.name=jax"
            )
        raise NotImplementedError(
            "the vllm rollout engine is not available in this version of jrl; "
            "set actor_rollout_ref.rollout.name=jax"
        )
    raise ValueError(
        f"actor_rollout_ref.rollout.name={name!r} is unknown; choose one of {_ENGINES}"
    )
