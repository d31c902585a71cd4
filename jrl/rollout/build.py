"""Building a rollout engine and its sampling parameters from verl's config."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from jrl.models import CausalLM, apply_lora
from jrl.models.dtypes import parse_dtype
from jrl.models.lora import LoraSettings
from jrl.rollout.jax_rollout import JaxRollout
from jrl.rollout.limits import EngineLimits
from jrl.rollout.protocol import Rollout
from jrl.rollout.sampling import SamplingParams, as_token_ids

_ENGINES = ("jax", "vllm", "hf")
_SECTION = "actor_rollout_ref.rollout"


def vllm_cannot_serve(
    rollout_cfg: Any, *, platform: str, local_devices: int, processes: int, installed: bool
) -> str | None:
    """Why the in-process vLLM engine cannot serve this run (None when it can): it needs vllm
    installed, a GPU, one device in one process and one engine (tensor, data and pipeline
    parallel sizes 1)."""
    if not installed:
        return "vllm is not installed"
    if platform != "gpu":
        return f"vLLM does not run on {platform}"
    if processes > 1 or local_devices > 1:
        return f"the vllm engine serves one GPU in one process ({local_devices} devices here)"
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        size = int(rollout_cfg.get(key) or 1)
        if size != 1:
            return f"{key}={size} needs several vLLM engine processes"
    return None


def serving_engine(rollout_cfg: Any, devices: Sequence[jax.Device]) -> tuple[str, str | None]:
    """(the engine that generates on `devices`, why vLLM cannot when ``rollout.name=vllm``
    falls back to jrl's JAX sampler). Other names come back as they are (`make_rollout` checks
    them)."""
    if rollout_cfg.name != "vllm":
        return rollout_cfg.name, None
    why = vllm_cannot_serve(
        rollout_cfg,
        platform=devices[0].platform,
        local_devices=sum(d.process_index == jax.process_index() for d in devices),
        processes=jax.process_count(),
        installed=importlib.util.find_spec("vllm") is not None,
    )
    return ("jax", why) if why else ("vllm", None)


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
    lora: LoraSettings | None = None,
) -> Rollout:
    """The engine of ``actor_rollout_ref.rollout`` (or `engine`, in place of ``rollout.name``;
    ``vllm`` falls back to jrl's JAX sampler, announced, where vLLM cannot serve the mesh:
    `serving_engine`) for the actor (`graphdef`, `params` on `mesh`): a model computing in
    ``rollout.dtype`` over the actor's parameters, the actor's LoRA adapters (`lora`) applied
    unmerged; responses of ``rollout.response_length`` tokens (verl's default: the interpolated
    ``data.max_response_length``), padded with the tokenizer's pad token and ended by its and
    the model config's EOS tokens."""
    arr = config.actor_rollout_ref
    rollout_cfg = arr.rollout
    model_config = nnx.merge(graphdef, params).config
    dtype = parse_dtype(rollout_cfg.dtype)

    def abstract_model() -> CausalLM:
        model = CausalLM(model_config, dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
        return model if lora is None else apply_lora(model, lora)

    rollout_graphdef = nnx.graphdef(nnx.eval_shape(abstract_model))
    eos = {tokenizer.eos_token_id, *as_token_ids(model_config.eos_token_id)} - {None}
    if engine is None:
        engine, why = serving_engine(rollout_cfg, list(mesh.devices.flat))
        if why:
            print(
                f"jrl: {_SECTION}.name=vllm: {why}; jrl's JAX sampler generates with the same "
                "sampling keys and tensor_model_parallel_size="
                f"{rollout_cfg.tensor_model_parallel_size}",
                flush=True,
            )
    return make_rollout(
        engine,
        nnx.merge(rollout_graphdef, params),
        response_length=int(rollout_cfg.response_length),
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
