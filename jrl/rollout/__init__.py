"""Rollout engines: generate responses for a batch of prompts (`jax` everywhere, `vllm` on GPU)."""

from __future__ import annotations

from typing import Any

from jrl.models import CausalLM
from jrl.rollout.jax_rollout import JaxRollout
from jrl.rollout.limits import EngineLimits, SlotPlan
from jrl.rollout.metrics import log_prob_mismatch_metrics
from jrl.rollout.sampler import generate_tokens
from jrl.rollout.sampling import SamplingParams

__all__ = [
    "EngineLimits",
    "JaxRollout",
    "SamplingParams",
    "SlotPlan",
    "generate_tokens",
    "log_prob_mismatch_metrics",
    "make_rollout",
]

_ENGINES = ("jax", "vllm", "hf")


def make_rollout(
    name: str,
    model: CausalLM,
    *,
    rollout_cfg: Any = None,
    model_path: str | None = None,
    trust_remote_code: bool = False,
    **kwargs: Any,
) -> Any:
    """The engine that `actor_rollout_ref.rollout.name` names. `kwargs` go to the JAX engine;
    the vllm engine reads the rollout section and the HF folder at `model_path`."""
    if name in ("jax", "hf"):
        if name == "hf":
            print("jrl: rollout.name=hf runs jrl's JAX sampler", flush=True)
        return JaxRollout(model, **kwargs)
    if name == "vllm":
        from jrl.rollout.vllm_rollout import VllmRollout  # imports vllm when constructed

        return VllmRollout(
            model,
            rollout_cfg=rollout_cfg,
            model_path=model_path,
            trust_remote_code=trust_remote_code,
            response_length=kwargs["response_length"],
            pad_token_id=kwargs["pad_token_id"],
            eos_token_ids=kwargs.get("eos_token_ids"),
        )
    if name == "sglang":
        raise NotImplementedError(
            "actor_rollout_ref.rollout.name=sglang is not supported yet; use jax (any device) or "
            "vllm (one GPU)"
        )
    raise ValueError(
        f"actor_rollout_ref.rollout.name={name!r} is unknown; choose one of {', '.join(_ENGINES)}"
    )
