"""A role's settings (`jrl.runspec.roles`, read once from the keys) on its mesh: its model
loaded (`load_model`), how its forward passes (`ForwardSpec`) and its updates (`TrainSpec`) split a
batch, its learning-rate schedule, its mesh and its offloads. What needs the mesh is computed
here: the data-parallel ranks that divide a deprecated global micro-batch size (verl's
data-parallel size is devices // ``ulysses_sequence_parallel_size``), the sequence-parallel
devices that share a token budget, whether the attention kernel lets answers share their prompt,
and the host memory of the local devices. Errors name the config key.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from flax import nnx
from jax.sharding import Mesh

from jrl.models import abstract_pretrained, apply_lora, from_pretrained
from jrl.models.attention import check_sequence_heads
from jrl.models.decoder import set_memory_options
from jrl.optim.optimizers import make_optimizer
from jrl.optim.schedule import Schedule
from jrl.optim.settings import OptimizerSettings
from jrl.parallel import Offload, data_parallel_size, role_mesh, sequence_parallel_size
from jrl.runspec.models import ModelSettings
from jrl.runspec.roles import BatchSplit, Offloads, RoleMesh, UpdateSettings
from jrl.trainer.update.batching import Forward, forward_pass
from jrl.trainer.update.dynamic_batching import TokenBudget
from jrl.trainer.update.learner import Learner, UpdatePlan
from jrl.trainer.update.packing import packing_plan
from jrl_kernels.platform import platform_name


def load_model(model: ModelSettings, mesh: Mesh, *, abstract: bool = False) -> Any:
    """`model`'s model on `mesh`, with LoRA adapters when it has them; with `abstract`, its
    shapes only, from config.json alone (to compile the run for a slice, `jrl.compile`).
    Errors name the section's keys."""
    common = dict(
        kind=model.kind,
        dtype=model.dtype,
        param_dtype=model.param_dtype,
        external_lib=model.external_lib,
        override_config=model.override_config,
    )
    try:
        if abstract:
            loaded = abstract_pretrained(model.path, **common)
        else:
            loaded = from_pretrained(
                model.path, mesh=mesh, trust_remote_code=model.trust_remote_code, **common
            )
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{model.key}: {err}") from err
    set_memory_options(loaded, **model.memory_options())
    if model.lora is None:
        return loaded
    try:
        if abstract:
            adapt = functools.partial(apply_lora, settings=model.lora, seed=model.lora_seed)
            return nnx.eval_shape(adapt, loaded)
        return apply_lora(loaded, model.lora, seed=model.lora_seed)
    except ValueError as err:
        raise ValueError(f"{model.section}: {err}") from err


@dataclasses.dataclass(frozen=True)
class ForwardSpec:
    """How a pass splits a batch: chunks (micro-batches) of `rows` rows (packed when
    `remove_padding`, with the answers of one prompt sharing it when `share_prompts`), or
    micro-batches under the token `budget`."""

    rows: int | None
    budget: TokenBudget | None
    remove_padding: bool = False
    share_prompts: bool = False

    @classmethod
    def of(
        cls,
        split: BatchSplit,
        mesh: Mesh,
        world: int | None = None,
        sequence_parallel: int | None = None,
    ) -> ForwardSpec:
        """`split` on `mesh`: a token budget per batch shard (the per-device budget times the
        sequence-parallel devices that share the shard's sequences, as verl's), else rows per
        rank times the ranks (packed rows sharing prompts where `shares_prompts`); `world` and
        `sequence_parallel` override the mesh's data-parallel and sequence-parallel sizes."""
        world = data_parallel_size(mesh) if world is None else world
        if sequence_parallel is None:
            sequence_parallel = sequence_parallel_size(mesh)
        packed = split.remove_padding
        if split.max_tokens is not None:
            budget = TokenBudget(split.max_tokens * sequence_parallel, split.budget_key, packed)
            return cls(None, budget, packed)
        micro = split.micro_rows or max(1, split.global_rows // world)
        return cls(world * micro, None, packed, shares_prompts(split, mesh))

    def run(self, fn: Forward, tensors: dict[str, Any], mesh: Mesh) -> Any:
        """Per-row outputs of the jitted ``fn(micro_batch, layout)`` over the whole batch."""
        return forward_pass(
            fn,
            tensors,
            mesh,
            rows=self.rows,
            remove_padding=self.remove_padding,
            budget=self.budget,
            share_prompts=self.share_prompts,
        )


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """How a trained role updates: its `UpdatePlan`, its `optimizer`, the learning rate per
    training step (`schedule`, one scheduler step per training step, as verl) and the mini-batch
    shuffle seed (``data_loader_seed``, None when ``shuffle`` is off)."""

    plan: UpdatePlan
    optimizer: OptimizerSettings
    schedule: Schedule
    shuffle: int | None

    @classmethod
    def of(cls, update: UpdateSettings, mesh: Mesh, total_training_steps: int) -> TrainSpec:
        """The PPO update `update` on the role's `mesh` over `total_training_steps`: verl's
        mini-batches for its epochs, micro-batches of rows per rank (packed, prompts shared
        where the mesh allows) or under a token budget."""
        split = ForwardSpec.of(update.split, mesh)
        micro: dict[str, Any] = {"token_budget": split.budget}
        if split.budget is None:
            packing = packing_plan(split.rows, mesh, split.remove_padding, split.share_prompts)
            micro = {"micro_rows": split.rows, "packing": packing}
        plan = UpdatePlan(
            grad_clip=update.grad_clip,
            mini_rows=update.mini_rows,
            epochs=update.epochs,
            loss_scale_factor=update.loss_scale_factor,
            **micro,
        )
        schedule = Schedule.from_settings(update.optimizer, total_training_steps)
        return cls(plan, update.optimizer, schedule, update.shuffle_seed)

    def shuffle_seed(self, step: int) -> tuple[int, int] | None:
        """Seed of step `step`'s per-epoch mini-batch shuffle: (data_loader_seed, step)."""
        return None if self.shuffle is None else (self.shuffle, int(step))


def shares_prompts(split: BatchSplit, mesh: Mesh) -> bool:
    """Whether the packed rows of `split` let the answers of a prompt share it
    (`jrl.trainer.update.packing`) on `mesh`: asked for (``use_remove_padding`` with n > 1), no
    sequence parallelism, and an attention kernel that takes a mask (the TPU splash kernel of
    ``flash_attention_2`` does not)."""
    if not split.share_prompts or sequence_parallel_size(mesh) > 1:
        return False
    platform = platform_name(mesh.devices.flat[0].platform)
    return not (split.attention == "flash_attention_2" and platform == "tpu")


def role_mesh_of(sizes: RoleMesh, mesh: Mesh) -> Mesh:
    """The role's mesh: `mesh`'s devices with the role's sequence-parallel, tensor-parallel,
    FSDP and expert-parallel sizes."""
    return role_mesh(
        mesh,
        sizes.sequence_parallel,
        sizes.fsdp_size,
        sizes.key,
        tensor_parallel=sizes.tensor_parallel,
        expert_parallel=sizes.expert_parallel,
    )


def check_heads(model: Any, mesh: Mesh, prefix: str) -> None:
    """Fails early unless sequence parallelism on `mesh` can split `model`'s attention heads;
    `prefix` names the section of ``ulysses_sequence_parallel_size`` ('' : the top level, SFT's)."""
    c = model.config
    key = f"{prefix}.ulysses_sequence_parallel_size" if prefix else "ulysses_sequence_parallel_size"
    check_sequence_heads(c.num_heads, c.num_kv_heads, sequence_parallel_size(mesh), key)


def load_learner(
    model: ModelSettings,
    optimizer: OptimizerSettings,
    mesh: Mesh,
    offload: Offloads,
    prefix: str,
    trainable: Any,
    abstract: bool = False,
) -> Learner:
    """A trained role's `Learner`: its model loaded on `mesh` (checked against sequence
    parallelism; `prefix` names the role section), the `trainable` parameters (an NNX filter)
    with the optimizer of `optimizer`, states offloaded as `offload` says; shapes only with
    `abstract` (`load_model`)."""
    loaded = load_model(model, mesh, abstract=abstract)
    check_heads(loaded, mesh, prefix)
    placed = {
        "param_offload": param_offload(offload, mesh),
        "optimizer_offload": Offload.configure(
            offload.optimizer, f"{offload.key}.optimizer_offload", mesh.local_devices
        ),
    }
    return Learner.create(loaded, make_optimizer(optimizer), mesh, trainable, **placed)


def param_offload(offload: Offloads, mesh: Mesh) -> Offload:
    """Where the parameters of a role with `offload` live between uses, on `mesh`'s devices."""
    return Offload.configure(offload.params, f"{offload.key}.param_offload", mesh.local_devices)
