"""Building a rollout engine and its sampling parameters from verl's config."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from jrl.models import CausalLM, apply_lora
from jrl.models.dtypes import parse_dtype
from jrl.models.lora import lora_settings
from jrl.rollout.jax_rollout import JaxRollout
from jrl.rollout.limits import EngineLimits
from jrl.rollout.protocol import Rollout
from jrl.rollout.sampling import SamplingParams, as_token_ids

_ENGINES = ("jax", "vllm", "hf")


def make_rollout(
    name: str,
    model: CausalLM,
    *,
    rollout_cfg: Any = None,
    model_path: str | None = None,
    trust_remote_code: bool = False,
    **kwargs: Any,
) -> Rollout:
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


def build_rollout(
    config: Any,
    graphdef: nnx.GraphDef,
    params: nnx.State,
    mesh: Mesh,
    tokenizer: Any,
    engine: str | None = None,
) -> Rollout:
    """The engine of ``actor_rollout_ref.rollout`` (or `engine`, in place of ``rollout.name``)
    for the actor (`graphdef`, `params` on `mesh`): a model computing in ``rollout.dtype`` over
    the actor's parameters, LoRA adapters (``model.lora_rank``) applied unmerged; responses of
    ``data.max_response_length`` tokens, padded with the tokenizer's pad token and ended by its
    and the model config's EOS tokens."""
    arr = config.actor_rollout_ref
    rollout_cfg = arr.rollout
    model_config = nnx.merge(graphdef, params).config
    dtype = parse_dtype(rollout_cfg.dtype)
    lora = lora_settings(arr.model)

    def abstract_model() -> CausalLM:
        model = CausalLM(model_config, dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
        return model if lora is None else apply_lora(model, **lora)

    rollout_graphdef = nnx.graphdef(nnx.eval_shape(abstract_model))
    eos = {tokenizer.eos_token_id, *as_token_ids(model_config.eos_token_id)} - {None}
    return make_rollout(
        engine or rollout_cfg.name,
        nnx.merge(rollout_graphdef, params),
        response_length=config.data.max_response_length,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=sorted(eos),
        mesh=mesh,
        tensor_parallel_size=int(rollout_cfg.tensor_model_parallel_size),
        limits=EngineLimits.from_rollout_config(rollout_cfg),
        rollout_cfg=rollout_cfg,
        model_path=arr.model.path,
        trust_remote_code=bool(arr.model.get("trust_remote_code", False)),
    )


def sampling_params(
    rollout_cfg: Any, rollout: Rollout, *, validate: bool = False
) -> SamplingParams:
    """`SamplingParams.from_rollout_config` of verl's ``actor_rollout_ref.rollout`` section (its
    ``val_kwargs`` with `validate`) for `rollout`'s response length, pad and EOS tokens."""
    return SamplingParams.from_rollout_config(
        rollout_cfg,
        response_length=rollout.response_length,
        eos_token_ids=rollout.eos_token_ids,
        pad_token_id=rollout.pad_token_id,
        validate=validate,
    )
