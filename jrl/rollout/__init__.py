"""Rollout engines: generate responses for a batch of prompts (`jax` everywhere, `vllm` on the CPU
or a GPU).

Names are imported on first use (`jrl.lazy`): the engine registry (`jrl.rollout.engines`) and the
settings types come without JAX or the engines.
"""

from jrl.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "ENGINES": "jrl.rollout.engines",
        "EngineLimits": "jrl.rollout.limits",
        "JaxRollout": "jrl.rollout.jax_rollout",
        "Rollout": "jrl.rollout.protocol",
        "RolloutSpec": "jrl.rollout.spec",
        "SamplingParams": "jrl.rollout.sampling",
        "SlotPlan": "jrl.rollout.limits",
        "TurnEngine": "jrl.rollout.protocol",
        "VllmSettings": "jrl.rollout.vllm_args",
        "build_rollout": "jrl.rollout.build",
        "generate_tokens": "jrl.rollout.sampler",
        "log_prob_mismatch_metrics": "jrl.rollout.metrics",
        "route_mismatch_metrics": "jrl.rollout.metrics",
        "make_rollout": "jrl.rollout.build",
        "sampling_params": "jrl.rollout.build",
    },
)
