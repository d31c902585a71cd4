"""Building the rollout engine of a `RolloutSpec` over the actor's parameters, and its sampling
parameters."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from jrl.models import CausalLM, apply_lora
from jrl.models.dtypes import parse_dtype
from jrl.models.lora import LoraSettings
from jrl.rollout.engines import Host, engine, serving
from jrl.rollout.protocol import Rollout
from jrl.rollout.sampling import SamplingParams, as_token_ids
from jrl.rollout.spec import RolloutSpec


def host_of(devices: Sequence[jax.Device]) -> Host:
    """The `Host` of a run on `devices`: their platform, how many this process holds and how
    many processes run."""
    local = sum(d.process_index == jax.process_index() for d in devices)
    return Host(devices[0].platform, local_devices=local, processes=jax.process_count())


def serving_engine(spec: RolloutSpec, devices: Sequence[jax.Device]) -> tuple[str, str | None]:
    """(the engine that generates on `devices`, why the named one cannot: `engines.serving`)."""
    return serving(spec, host_of(devices))


def generating_engine(spec: RolloutSpec, devices: Sequence[jax.Device]) -> str:
    """`serving_engine`'s engine, announcing in one line when it is not the one `spec` names."""
    name, why = serving_engine(spec, devices)
    if why:
        print(
            f"jrl: {spec.section}.name={spec.engine}: {why}; jrl's JAX sampler generates with "
            f"the same sampling keys and tensor_model_parallel_size={spec.tensor_parallel_size}",
            flush=True,
        )
    return name


def make_rollout(
    name: str,
    model: CausalLM,
    spec: RolloutSpec,
    *,
    pad_token_id: int,
    eos_token_ids: int | Iterable[int] | None,
    mesh: Mesh | None = None,
) -> Rollout:
    """The engine `name` (one of jrl's own in `jrl.rollout.engines.ENGINES`) for the rollout of
    `spec`, generating with `model` on `mesh`."""
    build = engine(name).build()
    return build(model, spec, pad_token_id=pad_token_id, eos_token_ids=eos_token_ids, mesh=mesh)


def build_rollout(
    spec: RolloutSpec,
    graphdef: nnx.GraphDef,
    params: nnx.State,
    mesh: Mesh,
    tokenizer: Any,
    engine_name: str | None = None,
    lora: LoraSettings | None = None,
) -> Rollout:
    """The engine of `spec` (or `engine_name`, in place of ``rollout.name``; a name that cannot
    serve the mesh falls back to jrl's JAX sampler, announced: `generating_engine`) for the actor
    (`graphdef`, `params` on `mesh`): a model computing in the rollout dtype over the actor's
    parameters, the actor's LoRA adapters (`lora`) applied unmerged; responses of
    `spec.response_length` tokens, padded with the tokenizer's pad token and ended by its and the
    model config's EOS tokens."""
    model_config = nnx.merge(graphdef, params).config
    dtype = parse_dtype(spec.dtype)

    def abstract_model() -> CausalLM:
        model = CausalLM(model_config, dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
        return model if lora is None else apply_lora(model, lora)

    rollout_graphdef = nnx.graphdef(nnx.eval_shape(abstract_model))
    eos = {tokenizer.eos_token_id, *as_token_ids(model_config.eos_token_id)} - {None}
    if engine_name is None:
        engine_name = generating_engine(spec, list(mesh.devices.flat))
    return make_rollout(
        engine_name,
        nnx.merge(rollout_graphdef, params),
        spec,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=sorted(eos),
        mesh=mesh,
    )


def sampling_params(settings: SamplingParams, rollout: Rollout) -> SamplingParams:
    """`settings` (a `RolloutSpec`'s training or validation sampling) for `rollout`'s response
    length, pad and EOS tokens."""
    return dataclasses.replace(
        settings,
        max_new_tokens=rollout.response_length,
        eos_token_ids=rollout.eos_token_ids,
        pad_token_id=rollout.pad_token_id,
    )
