"""verl's ``megatron`` sections: the Megatron-Core engine options of the actor, reference, critic
and reward model in verl v0.6.0's ``ppo_megatron_trainer``, with verl's defaults.

jrl trains with JAX, not Megatron-Core. A role's ``fsdp_config.tensor_parallel_size`` follows its
``megatron.tensor_model_parallel_size`` (the same split of attention heads, MLP and vocabulary
over devices, `jrl.parallel.TRAINING_RULES`); pipeline, virtual pipeline, context and expert
parallelism are refused away from their defaults (`jrl.runspec.unsupported`); the other keys are
announced as having no effect (`jrl.runspec.effects`).
"""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict
from ml_collections.config_dict import placeholder

from jrl.config.tree import section

ACTOR = "actor_rollout_ref.actor"
ACTOR_MEGATRON = f"{ACTOR}.megatron"
# The sections (roles) that hold a ``megatron`` section.
MEGATRON_ROLES = (ACTOR, "actor_rollout_ref.ref", "critic", "reward_model")


def _transformer_config() -> ConfigDict:
    """``override_transformer_config``: the Megatron-Core TransformerConfig fields verl sets."""
    return section(
        recompute_granularity=placeholder(str),
        recompute_modules=["core_attn"],
        recompute_method=placeholder(str),
        recompute_num_layers=placeholder(int),
        attention_backend="flash",
    )


def megatron_section(role: str) -> ConfigDict:
    """The ``megatron`` section of `role` (one of `MEGATRON_ROLES`). The reference and the reward
    model take the actor's seed and ``use_mbridge`` (verl's interpolations); the reward model's
    section has no optimizer or engine overrides."""
    own = role in (ACTOR, "critic")
    full = role != "reward_model"
    fields: dict[str, Any] = dict(param_offload=False)
    if full:
        fields.update(grad_offload=False, optimizer_offload=False)
    fields.update(
        tensor_model_parallel_size=1,
        expert_model_parallel_size=1,
        expert_tensor_parallel_size=1,
        pipeline_model_parallel_size=1,
        virtual_pipeline_model_parallel_size=placeholder(int),
        context_parallel_size=1,
        sequence_parallel=True,
        use_distributed_optimizer=full,
        use_dist_checkpointing=False,
        dist_checkpointing_path=placeholder(str),
        seed=42 if own else f"${{{ACTOR_MEGATRON}.seed}}",
    )
    if full:
        fields.update(override_ddp_config=section())
    fields.update(override_transformer_config=_transformer_config())
    if full:
        fields.update(override_mcore_model_config=section())
    fields.update(use_mbridge=False if own else f"${{{ACTOR_MEGATRON}.use_mbridge}}")
    # Current verl's engine options (McoreEngineConfig), which its example scripts set.
    fields.update(vanilla_mbridge=False, use_remove_padding=True, use_megatron_fsdp=False)
    if full:
        fields.update(forward_only=False)
    if role == ACTOR:  # current verl's engine spelling of actor.router_replay.mode
        fields.update(router_replay=section(mode="disabled"))
    return section(**fields)
