"""What verl's role sections become: the settings of the actor, the reference policy, the critic
and the reward model, read once and free of any mesh (`jrl.trainer.roles` turns them into passes,
update plans and learners on the role's mesh).

Micro-batches follow verl: ``*_micro_batch_size_per_gpu`` rows per data-parallel rank (or the
deprecated global key, divided by the ranks on the mesh), or with ``*use_dynamic_bsz`` a token
budget of ``*_max_token_len_per_gpu`` per device (times the sequence-parallel devices that share
a shard's sequences, on the mesh). A trained role's mini-batches hold ``ppo_mini_batch_size *
rollout.n`` rows. The actor's log-prob pass splits as ``rollout.log_prob_*`` say (verl's).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from jrl.algos.aggregation import SEQ_MEAN_TOKEN_SUM_NORM
from jrl.optim.settings import OptimizerSettings
from jrl.runspec.models import ModelSettings, attention, lora_rank, model_settings
from jrl.runspec.optim import optimizer_settings
from jrl.runspec.reads import KeyReads
from jrl.runspec.validate import FUSED_KERNEL_IMPLS

ARR = "actor_rollout_ref"
ACTOR = f"{ARR}.actor"
REF = f"{ARR}.ref"
ROLLOUT = f"{ARR}.rollout"


class SplitKeys(NamedTuple):
    """The keys of a batch split: the dynamic-batch-size flag, the per-device token budget and
    the micro-batch size (``<micro>_per_gpu``, or the deprecated global ``<micro>``)."""

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
class RoleMesh:
    """A role's own parallel sizes over the run's devices (verl's workers each build their
    mesh): `sequence_parallel` (``ulysses_sequence_parallel_size``), `tensor_parallel`,
    `fsdp_size` (its ``fsdp_config``'s; -1 or None: every device left) and `expert_parallel`
    (its ``fsdp_config.expert_parallel_size``: the ``data`` axis); `key`: the role's section,
    named in errors."""

    sequence_parallel: int
    tensor_parallel: int
    fsdp_size: int | None
    key: str
    expert_parallel: int = 1


@dataclasses.dataclass(frozen=True)
class Offloads:
    """Whether a role keeps its parameters (``param_offload``) and optimizer state
    (``optimizer_offload``) in host memory between uses; `key`: its ``fsdp_config`` section."""

    params: bool
    optimizer: bool
    key: str


@dataclasses.dataclass(frozen=True)
class BatchSplit:
    """How a pass splits a batch: micro-batches under a token budget of `max_tokens` per device
    (`budget_key` names it), else of `micro_rows` rows per device or, with the deprecated global
    size, `global_rows` split over the data-parallel ranks; packed when `remove_padding`, the
    answers of a prompt sharing it when `share_prompts` (``use_remove_padding`` with n > 1) and
    the mesh lets the model's `attention` (``attn_implementation``) take the mask."""

    max_tokens: int | None = None
    budget_key: str | None = None
    micro_rows: int | None = None
    global_rows: int | None = None
    remove_padding: bool = False
    share_prompts: bool = False
    attention: str | None = None


@dataclasses.dataclass(frozen=True)
class UpdateSettings:
    """A trained role's PPO update: mini-batches of `mini_rows` rows (``ppo_mini_batch_size *
    rollout.n``) for `epochs` (``ppo_epochs``), micro-batches as `split` says, gradients clipped
    to `grad_clip`, ``loss_scale_factor``, the seed of the per-epoch mini-batch shuffle
    (``data_loader_seed``, 0 when null; None when ``shuffle`` is off) and the optimizer."""

    split: BatchSplit
    mini_rows: int
    epochs: int
    grad_clip: float
    loss_scale_factor: float | None
    shuffle_seed: int | None
    optimizer: OptimizerSettings


@dataclasses.dataclass(frozen=True)
class ActorSettings:
    """The actor: its model, mesh and offloads, its log-prob pass (`log_probs`, at the rollout's
    `temperature`, by the kernel `log_prob_impl`), its update, and how a mixture of experts
    replays routes (`router_replay`: one of `jrl.runspec.router_replay.ROUTER_REPLAY_MODES`)."""

    model: ModelSettings
    mesh: RoleMesh
    offload: Offloads
    log_probs: BatchSplit
    update: UpdateSettings
    temperature: float
    log_prob_impl: str
    router_replay: str = "disabled"


@dataclasses.dataclass(frozen=True)
class ReferenceSettings:
    """The reference policy: its model, mesh and parameter offload (all None with LoRA: it is
    then the actor's base model, on the actor's mesh) and its log-prob pass."""

    model: ModelSettings | None
    mesh: RoleMesh | None
    offload: Offloads | None
    log_probs: BatchSplit
    temperature: float
    log_prob_impl: str


@dataclasses.dataclass(frozen=True)
class CriticSettings:
    """The critic: its value model, mesh and offloads, its values pass (`values`), its update
    and its clipped value loss (``cliprange_value``, aggregated by ``loss_agg_mode``)."""

    model: ModelSettings
    mesh: RoleMesh
    offload: Offloads
    values: BatchSplit
    update: UpdateSettings
    cliprange_value: float
    loss_agg_mode: str


@dataclasses.dataclass(frozen=True)
class RewardModelSettings:
    """The reward model: its score model and parameter offload, its scoring pass (`scores`,
    split over every device), and the tokenizer that decodes the policy's tokens for its own
    chat template (``input_tokenizer``; None: it reads the policy's tokens) with the length of
    its inputs (``max_length``; None: prompt + response)."""

    model: ModelSettings
    offload: Offloads
    scores: BatchSplit
    input_tokenizer: str | None
    max_length: int | None


def log_prob_impl(arr: Any, role: str) -> str:
    """The `jrl_kernels.logprob_entropy` implementation of `role` (actor or ref) under the
    ``actor_rollout_ref`` section `arr`: ``naive`` (materialised logits) unless the role's
    ``use_fused_kernels`` (which follows ``model.use_fused_kernels``) is on, else
    `FUSED_KERNEL_IMPLS` of ``model.fused_kernel_options.impl_backend``."""
    arr = KeyReads.of(arr, ARR)
    fused = arr[role].get("use_fused_kernels")
    if not (arr.model.use_fused_kernels if fused is None else fused):
        arr.model.skip("fused_kernel_options", f"{ARR}.model.use_fused_kernels is False")
        return "naive"
    options = arr.model.get("fused_kernel_options") or {}
    return FUSED_KERNEL_IMPLS[options.get("impl_backend") or "torch"]


@dataclasses.dataclass(frozen=True)
class Packing:
    """How a model's rows are laid out in every pass of the roles that run it, resolved once:
    packed when its ``use_remove_padding``, the `group_size` answers of a prompt (``rollout.n``)
    then sharing the prompt's tokens where the mesh lets the model's `attention`
    (``attn_implementation``) take the mask."""

    remove_padding: bool
    group_size: int
    attention: str | None

    @property
    def share_prompts(self) -> bool:
        return self.remove_padding and self.group_size > 1


def packing(model: KeyReads, group_size: int) -> Packing:
    """The Packing of the ``*.model`` section `model` with `group_size` answers per prompt."""
    return Packing(bool(model.use_remove_padding), group_size, attention(model))


def batch_split(
    section: KeyReads, prefix: str, keys: SplitKeys, rows: Packing | None = None
) -> BatchSplit:
    """The split of the section at `prefix`: the token budget of ``keys.limit`` when
    ``keys.flag`` is on, else ``keys.micro`` rows; rows laid out as `rows` says (None: never
    packed)."""
    packed = rows is not None and rows.remove_padding
    if section.get(keys.flag):
        limit = int(section[keys.limit])
        why = f"{prefix}.{keys.flag} is on: micro-batches hold {prefix}.{keys.limit} tokens"
        section.skip((keys.micro, f"{keys.micro}_per_gpu"), why)
        return BatchSplit(limit, f"{prefix}.{keys.limit}", remove_padding=packed)
    section.skip(keys.limit, f"{prefix}.{keys.flag} is False: token budgets act with dynamic sizes")
    sharing = {
        "remove_padding": packed,
        "share_prompts": rows is not None and rows.share_prompts,
        "attention": None if rows is None else rows.attention,
    }
    per_gpu = section.get(f"{keys.micro}_per_gpu")
    if per_gpu:
        return BatchSplit(micro_rows=int(per_gpu), **sharing)
    return BatchSplit(global_rows=int(section[keys.micro]), **sharing)


def role_mesh_sizes(section: KeyReads, fsdp: KeyReads, prefix: str) -> RoleMesh:
    """The mesh sizes of the role section at `prefix` with its ``fsdp_config`` `fsdp`."""
    return RoleMesh(
        sequence_parallel=int(section.get("ulysses_sequence_parallel_size") or 1),
        tensor_parallel=int(fsdp.get("tensor_parallel_size") or 1),
        fsdp_size=fsdp.get("fsdp_size", -1),
        key=prefix,
        expert_parallel=int(fsdp.get("expert_parallel_size") or 1),
    )


def offloads(fsdp: KeyReads, prefix: str, optimizer: bool = True) -> Offloads:
    """The offloads of the ``fsdp_config`` section `fsdp` at `prefix` (the parameters' only,
    unless `optimizer`)."""
    return Offloads(
        params=bool(fsdp.get("param_offload", False)),
        optimizer=bool(fsdp.get("optimizer_offload", False)) if optimizer else False,
        key=prefix,
    )


def update_settings(section: KeyReads, prefix: str, rows: Packing) -> UpdateSettings:
    """The PPO update of the trained role section at `prefix` (actor or critic)."""
    shuffle_seed = None
    if section.get("shuffle"):
        seed = section.get("data_loader_seed")
        shuffle_seed = 0 if seed is None else int(seed)
    else:
        section.skip(
            "data_loader_seed", f"{prefix}.shuffle is False: mini-batches keep their order"
        )
    scale_factor = None
    if section.get("loss_agg_mode") == SEQ_MEAN_TOKEN_SUM_NORM:
        scale_factor = section.get("loss_scale_factor")
    else:
        section.skip(
            "loss_scale_factor", f"the divisor of loss_agg_mode={SEQ_MEAN_TOKEN_SUM_NORM} only"
        )
    return UpdateSettings(
        split=batch_split(section, prefix, PPO_UPDATE_KEYS, rows),
        mini_rows=int(section.ppo_mini_batch_size) * rows.group_size,
        epochs=int(section.ppo_epochs),
        grad_clip=float(section.grad_clip),
        loss_scale_factor=scale_factor,
        shuffle_seed=shuffle_seed,
        optimizer=optimizer_settings(section.optim, f"{prefix}.optim"),
    )


def actor_settings(config: KeyReads, policy: Packing) -> ActorSettings:
    """The actor of ``actor_rollout_ref`` (LoRA adapters initialised from ``data.seed``), its
    rows laid out as the `policy` model's."""
    arr = config[ARR]
    actor, fsdp = arr.actor, arr.actor.fsdp_config
    seed = config.data.get("seed") if lora_rank(arr.model) > 0 else None
    return ActorSettings(
        model=model_settings(arr.model, fsdp, lora_seed=0 if seed is None else int(seed)),
        mesh=role_mesh_sizes(actor, fsdp, ACTOR),
        offload=offloads(fsdp, f"{ACTOR}.fsdp_config"),
        log_probs=batch_split(arr.rollout, ROLLOUT, LOG_PROB_KEYS, policy),
        update=update_settings(actor, ACTOR, policy),
        temperature=float(arr.rollout.temperature),
        log_prob_impl=log_prob_impl(arr, "actor"),
        router_replay=str(actor.router_replay.mode),
    )


def reference_settings(config: KeyReads, policy: Packing) -> ReferenceSettings:
    """The reference policy of ``actor_rollout_ref``: with LoRA the actor's base model, on the
    actor's mesh (its own model, mesh and offload keys are then not read); its rows laid out as
    the `policy` model's."""
    arr = config[ARR]
    ref, fsdp = arr.ref, arr.ref.fsdp_config
    own = lora_rank(arr.model) == 0
    if not own:
        why = "with LoRA the reference is the actor's base model, on the actor's mesh and offload"
        ref.skip(("fsdp_config", "ulysses_sequence_parallel_size"), why)
    return ReferenceSettings(
        model=model_settings(arr.model, fsdp) if own else None,
        mesh=role_mesh_sizes(ref, fsdp, REF) if own else None,
        offload=offloads(fsdp, f"{REF}.fsdp_config", optimizer=False) if own else None,
        log_probs=batch_split(ref, REF, LOG_PROB_KEYS, policy),
        temperature=float(arr.rollout.temperature),
        log_prob_impl=log_prob_impl(arr, "ref"),
    )


def critic_settings(config: KeyReads, group_size: int) -> CriticSettings:
    """The critic of the ``critic`` section, `group_size` answers per prompt."""
    critic, fsdp = config.critic, config.critic.model.fsdp_config
    rows = packing(critic.model, group_size)
    return CriticSettings(
        model=model_settings(critic.model, fsdp, kind="value", section="critic.model"),
        mesh=role_mesh_sizes(critic, fsdp, "critic"),
        offload=offloads(fsdp, "critic.model.fsdp_config"),
        values=batch_split(critic, "critic", VALUE_KEYS, rows),
        update=update_settings(critic, "critic", rows),
        cliprange_value=float(critic.cliprange_value),
        loss_agg_mode=critic.loss_agg_mode,
    )


def reward_model_settings(config: KeyReads) -> RewardModelSettings:
    """The reward model of the ``reward_model`` section (its rows never packed)."""
    rm = config.reward_model
    fsdp = rm.model.fsdp_config
    return RewardModelSettings(
        model=model_settings(rm.model, fsdp, kind="reward", section="reward_model.model"),
        offload=offloads(fsdp, "reward_model.model.fsdp_config", optimizer=False),
        scores=batch_split(rm, "reward_model", SCORE_KEYS),
        input_tokenizer=rm.model.get("input_tokenizer"),
        max_length=rm.get("max_length"),
    )
