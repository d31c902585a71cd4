"""Role settings resolved once from the config at start-up: how a role's model is loaded, how its
forward passes and its updates split a batch, and its learning-rate schedule.

Each spec is a frozen dataclass built from the config sections by a ``resolve`` function; the
roles keep the spec and never read the config tree again. Errors name the config key.

Micro-batches follow verl: ``*_micro_batch_size_per_gpu`` rows per data-parallel rank (or the
deprecated global key divided by the ranks), or with ``use_dynamic_bsz`` a token budget of
``*_max_token_len_per_gpu`` per device times the sequence-parallel devices that share a shard's
sequences. verl's data-parallel size is devices // ``ulysses_sequence_parallel_size``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

from flax import nnx
from jax.sharding import Mesh

from jrl.models import abstract_pretrained, apply_lora, from_pretrained
from jrl.models.attention import check_sequence_heads
from jrl.models.decoder import set_memory_options
from jrl.models.dtypes import parse_dtype
from jrl.models.lora import LoraSettings
from jrl.optim.optimizers import make_optimizer
from jrl.optim.schedule import Schedule
from jrl.optim.settings import OptimizerSettings
from jrl.parallel import Offload, data_parallel_size, role_mesh, sequence_parallel_size
from jrl.runspec.models import lora_settings
from jrl.runspec.optim import optimizer_settings
from jrl.trainer.update.batching import Forward, forward_pass
from jrl.trainer.update.dynamic_batching import TokenBudget
from jrl.trainer.update.learner import Learner, UpdatePlan
from jrl.trainer.update.packing import packing_plan
from jrl_kernels.platform import platform_name


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How a ``*.model`` section's model is loaded: streamed from `path` straight onto the mesh
    (FSDP layout), computing in `dtype` over `param_dtype` parameters, with full remat of every
    decoder layer when `remat` (``enable_gradient_checkpointing``) and host offload of what it
    keeps when `activation_offload`; `lora` holds the LoRA adapters' settings (None: no LoRA);
    `key` names the weights' config key in errors."""

    path: str
    kind: str
    dtype: Any
    param_dtype: Any
    trust_remote_code: bool
    external_lib: str | None
    override_config: dict[str, Any]
    remat: bool
    activation_offload: bool
    lora: LoraSettings | None
    lora_seed: int = 0
    key: str = "actor_rollout_ref.model.path"

    @classmethod
    def resolve(
        cls,
        model_cfg: Any,
        fsdp_cfg: Any,
        kind: str = "causal_lm",
        *,
        section: str = "actor_rollout_ref.model",
        path_key: str = "path",
        lora_seed: int = 0,
    ) -> ModelSpec:
        """The spec of the ``*.model`` section `model_cfg` (at `section`) with the
        ``fsdp_config`` `fsdp_cfg` (``dtype``, ``model_dtype``); `path_key` names the key of
        the weights (SFT: ``partial_pretrain``)."""
        override = model_cfg.get("override_config")
        return cls(
            path=model_cfg[path_key],
            kind=kind,
            dtype=parse_dtype(fsdp_cfg.get("dtype", "bfloat16")),
            param_dtype=parse_dtype(fsdp_cfg.get("model_dtype", "fp32")),
            trust_remote_code=bool(model_cfg.get("trust_remote_code", False)),
            external_lib=model_cfg.get("external_lib"),
            override_config=_plain(override),
            remat=bool(model_cfg.get("enable_gradient_checkpointing", False)),
            activation_offload=bool(model_cfg.get("enable_activation_offload", False)),
            lora=lora_settings(model_cfg, section),
            lora_seed=lora_seed,
            key=f"{section}.{path_key}",
        )

    def memory_options(self) -> dict[str, Any]:
        """`set_memory_options` arguments: full remat of every decoder layer with `remat`,
        host offload of what it keeps with `activation_offload`."""
        return {
            "remat_policy": "full" if self.remat else "none",
            "activation_offload": self.activation_offload,
        }

    def load(self, mesh: Mesh, *, abstract: bool = False) -> Any:
        """The model on `mesh`, with LoRA adapters when `lora` is set; with `abstract`, its
        shapes only, from config.json alone (to compile the run for a slice, `jrl.compile`).
        Errors name the section's keys."""
        common = dict(
            kind=self.kind,
            dtype=self.dtype,
            param_dtype=self.param_dtype,
            external_lib=self.external_lib,
            override_config=self.override_config,
        )
        try:
            if abstract:
                model = abstract_pretrained(self.path, **common)
            else:
                model = from_pretrained(
                    self.path, mesh=mesh, trust_remote_code=self.trust_remote_code, **common
                )
        except FileNotFoundError as err:
            raise FileNotFoundError(f"{self.key}: {err}") from err
        set_memory_options(model, **self.memory_options())
        if self.lora is None:
            return model
        try:
            if abstract:
                adapt = functools.partial(apply_lora, settings=self.lora, seed=self.lora_seed)
                return nnx.eval_shape(adapt, model)
            return apply_lora(model, self.lora, seed=self.lora_seed)
        except ValueError as err:
            raise ValueError(f"{self.key.rpartition('.')[0]}: {err}") from err


class SplitKeys(NamedTuple):
    """The config keys of a batch split: the dynamic-batch-size flag, the per-device token
    budget and the micro-batch size (``<micro>_per_gpu``, or the deprecated global ``<micro>``)."""

    flag: str
    limit: str
    micro: str


PPO_UPDATE_KEYS = SplitKeys("use_dynamic_bsz", "ppo_max_token_len_per_gpu", "ppo_micro_batch_size")
LOG_PROB_KEYS = SplitKeys(
    "log_prob_use_dynamic_bsz", "log_prob_max_token_len_per_gpu", "log_prob_micro_batch_size"
)
VALUE_KEYS = SplitKeys(
    "use_dynamic_bsz", "forward_max_token_len_per_gpu", "forward_micro_batch_size"
)
SCORE_KEYS = SplitKeys("use_dynamic_bsz", "forward_max_token_len_per_gpu", "micro_batch_size")


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
    def resolve(
        cls,
        section: Any,
        prefix: str,
        mesh: Mesh,
        packed: bool,
        keys: SplitKeys,
        world: int | None = None,
        sequence_parallel: int | None = None,
        share_prompts: bool = False,
    ) -> ForwardSpec:
        """The split of the role section `section` at `prefix` on `mesh`: the token budget of
        ``keys.limit`` when ``keys.flag`` is on, else ``keys.micro`` rows per rank (packed rows
        sharing prompts when `share_prompts`, see `shares_prompts`); `world` and
        `sequence_parallel` override the mesh's data-parallel and sequence-parallel sizes."""
        world = data_parallel_size(mesh) if world is None else world
        if sequence_parallel is None:
            sequence_parallel = sequence_parallel_size(mesh)
        budget = token_budget(section, prefix, keys.flag, keys.limit, packed, sequence_parallel)
        if budget is not None:
            return cls(None, budget, packed)
        micro = micro_rows_per_device(section, f"{keys.micro}_per_gpu", keys.micro, world)
        return cls(world * micro, None, packed, packed and share_prompts)

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
    def resolve(
        cls,
        section: Any,
        prefix: str,
        mesh: Mesh,
        packed: bool,
        sizes: tuple[int, int],
        share_prompts: bool = False,
    ) -> TrainSpec:
        """The PPO update of the trained role section at `prefix` (actor or critic), `sizes` =
        (``rollout.n``, total training steps): verl's mini-batches of ``ppo_mini_batch_size *
        rollout.n`` rows for ``ppo_epochs``, micro-batches split as `PPO_UPDATE_KEYS` say (rows
        per rank, packed with `packed` and prompts shared with `share_prompts`, or a token
        budget)."""
        rollout_n, total_training_steps = sizes
        optimizer = optimizer_settings(section.optim, f"{prefix}.optim")
        split = ForwardSpec.resolve(
            section, prefix, mesh, packed, PPO_UPDATE_KEYS, share_prompts=share_prompts
        )
        micro: dict[str, Any] = {"token_budget": split.budget}
        if split.budget is None:
            packing = packing_plan(split.rows, mesh, packed, split.share_prompts)
            micro = {"micro_rows": split.rows, "packing": packing}
        plan = UpdatePlan(
            grad_clip=float(section.grad_clip),
            mini_rows=int(section.ppo_mini_batch_size) * int(rollout_n),
            epochs=int(section.ppo_epochs),
            loss_scale_factor=section.get("loss_scale_factor"),
            **micro,
        )
        seed = section.get("data_loader_seed")
        shuffle = (0 if seed is None else int(seed)) if section.get("shuffle") else None
        schedule = Schedule.from_settings(optimizer, total_training_steps)
        return cls(plan, optimizer, schedule, shuffle)

    def shuffle_seed(self, step: int) -> tuple[int, int] | None:
        """Seed of step `step`'s per-epoch mini-batch shuffle: (data_loader_seed, step)."""
        return None if self.shuffle is None else (self.shuffle, int(step))


def shares_prompts(model_cfg: Any, mesh: Mesh, rollout_n: int) -> bool:
    """Whether packed rows of a role whose ``model`` section is `model_cfg` let the `rollout_n`
    answers of a prompt share it (`jrl.trainer.update.packing`): with ``use_remove_padding``, n > 1,
    no sequence parallelism, and an attention kernel that takes a mask (the TPU splash kernel
    of ``flash_attention_2`` does not)."""
    if not model_cfg.get("use_remove_padding") or rollout_n <= 1:
        return False
    if sequence_parallel_size(mesh) > 1:
        return False
    attention = (model_cfg.get("override_config") or {}).get("attn_implementation")
    platform = platform_name(mesh.devices.flat[0].platform)
    return not (attention == "flash_attention_2" and platform == "tpu")


def micro_rows_per_device(section: Any, per_gpu_key: str, global_key: str, world: int) -> int:
    """verl's micro-batch size per device: `*_per_gpu`, else the deprecated global key // world."""
    per_gpu = section.get(per_gpu_key)
    if per_gpu:
        return int(per_gpu)
    return max(1, int(section[global_key]) // world)


def token_budget(
    section: Any,
    prefix: str,
    flag_key: str,
    limit_key: str,
    packed: bool,
    sequence_parallel: int = 1,
) -> TokenBudget | None:
    """The token budget of one batch shard when the role section at `prefix` has its `flag_key`
    (``use_dynamic_bsz`` or ``log_prob_use_dynamic_bsz``) on, else None: the per-device
    `limit_key` times the `sequence_parallel` devices that share the shard's sequences (verl)."""
    if not section.get(flag_key):
        return None
    return TokenBudget(int(section[limit_key]) * sequence_parallel, f"{prefix}.{limit_key}", packed)


def role_mesh_of(section: Any, prefix: str, mesh: Mesh, fsdp_cfg: Any) -> Mesh:
    """The mesh of the role section at `prefix`: `mesh`'s devices with the section's
    ``ulysses_sequence_parallel_size`` on the `sequence` axis and its ``fsdp_config``'s
    ``tensor_parallel_size`` on the `tensor` axis and ``fsdp_size`` on the `fsdp` axis."""
    size = int(section.get("ulysses_sequence_parallel_size") or 1)
    tensor = int(fsdp_cfg.get("tensor_parallel_size") or 1)
    return role_mesh(mesh, size, fsdp_cfg.get("fsdp_size", -1), prefix, tensor_parallel=tensor)


def check_heads(model: Any, mesh: Mesh, prefix: str) -> None:
    """Fails early unless sequence parallelism on `mesh` can split `model`'s attention heads."""
    c = model.config
    key = f"{prefix}.ulysses_sequence_parallel_size"
    check_sequence_heads(c.num_heads, c.num_kv_heads, sequence_parallel_size(mesh), key)


def load_learner(
    model: ModelSpec,
    optimizer: OptimizerSettings,
    mesh: Mesh,
    fsdp: tuple[Any, str],
    prefix: str,
    trainable: Any,
    abstract: bool = False,
) -> Learner:
    """A trained role's `Learner`: its model loaded on `mesh` (checked against sequence
    parallelism; `prefix` names the role section), the `trainable` parameters (an NNX filter)
    with the optimizer of `optimizer`, states offloaded as `fsdp` = (the ``fsdp_config``
    section, its key) says; shapes only with `abstract` (`ModelSpec.load`)."""
    loaded = model.load(mesh, abstract=abstract)
    check_heads(loaded, mesh, prefix)
    offload = offloads(*fsdp, mesh)
    return Learner.create(loaded, make_optimizer(optimizer), mesh, trainable, **offload)


def offloads(fsdp_cfg: Any, prefix: str, mesh: Mesh) -> dict[str, Offload]:
    """`Learner.create`'s ``param_offload`` and ``optimizer_offload`` from the ``fsdp_config``
    section at `prefix`."""
    return {
        name: Offload.configure(
            bool(fsdp_cfg.get(name, False)), f"{prefix}.{name}", mesh.local_devices
        )
        for name in ("param_offload", "optimizer_offload")
    }


def _plain(section: Any) -> dict[str, Any]:
    """A config section (or None) as a plain dict."""
    if section is None:
        return {}
    return section.to_dict() if hasattr(section, "to_dict") else dict(section)
