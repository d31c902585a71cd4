"""Rollout engines: generate responses for a batch of prompts (`jax` everywhere, `vllm` on GPU)."""

from __future__ import annotations

from jrl.rollout.build import build_rollout, make_rollout, sampling_params
from jrl.rollout.jax_rollout import JaxRollout
from jrl.rollout.limits import EngineLimits, SlotPlan
from jrl.rollout.metrics import log_prob_mismatch_metrics
from jrl.rollout.protocol import Rollout
from jrl.rollout.sampler import generate_tokens
from jrl.rollout.sampling import SamplingParams

__all__ = [
    "EngineLimits",
    "JaxRollout",
    "Rollout",
    "SamplingParams",
    "SlotPlan",
    "build_rollout",
    "generate_tokens",
    "log_prob_mismatch_metrics",
    "make_rollout",
    "sampling_params",
]
