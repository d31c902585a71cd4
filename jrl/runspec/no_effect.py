"""Why a key has no effect where the resolver's own record does not say it (`jrl.runspec.effects`
asks this module last): `UNREAD`, the keys no resolver reads (torch's, Ray's, Megatron's, and
features that jrl's models lack), by pattern; and `IDLE_HERE`, keys that a resolver reads but
that this host, or the engine that generates here, leaves idle."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import jax
from ml_collections import ConfigDict

from jrl.models.decoder import OFFLOAD_BACKENDS
from jrl.rollout.engines import ENGINES
from jrl.rollout.limits import free_device_bytes
from jrl.runspec.models import OWN_DECODER

ARR = "actor_rollout_ref"
ROLLOUT = f"{ARR}.rollout"
FSDP = "torch FSDP's scheduling: jrl shards every parameter by its logical axes with XLA"
ENTROPY = "torch's entropy memory options: jrl's log-prob/entropy kernel follows use_fused_kernels"
ROUTES_IN_BATCH = "verl's files of recorded routes: jrl carries the routes in the batch"
TEXT_ONLY = "multi-modal inputs: jrl's model families are text-only"
WEIGHT_TRANSFER = "verl's weight transfer between Ray workers: jrl hands weights over in process"
RAY = "Ray's placement: jrl runs every role in one process per host, on the trainer's devices"
REWARD_LOOP = "verl's asynchronous reward workers: jrl scores in process (the same scores)"
WRAPPING = "torch FSDP wrapping: jrl shards by logical axes"
FSDP_SCHEDULING = ("offload_policy", "reshard_after_forward", "forward_prefetch", "use_orig_params")
REWARD_LOOP_KEYS = ("launch_reward_fn_async", "use_reward_loop", "reward_loop_*", "num_workers")
WEIGHT_TRANSFER_KEYS = ("checkpoint_engine.*", "update_weights_bucket_megabytes")

# Keys that no resolver reads, by pattern (``*`` matches one part or more): first match wins.
UNREAD = {
    "data.tokenizer": "verl reads the tokenizer from actor_rollout_ref.model.path",
    "data.val_batch_size": "jrl generates the whole validation set in one call (verl's default)",
    "data.dataloader_num_workers": "torch DataLoader workers: jrl reads rows in process",
    "data.filter_overlong_prompts_workers": "jrl filters long prompts in process",
    **dict.fromkeys(("data.image_patch_size", "data.video_key"), TEXT_ONLY),
    "data.return_multi_modal_inputs": TEXT_ONLY,
    "async_training.use_trainer_do_validate": "jrl validates on the rollout's devices",
    "rollout.test_freq": "jrl validates every trainer.test_freq steps",
    f"{ARR}.nccl_timeout": "NCCL's timeout: jrl's collectives are XLA's",
    f"{ARR}.actor.freeze_vision_tower": TEXT_ONLY,
    f"{ARR}.actor.use_remove_padding": "jrl packs rows as model.use_remove_padding says",
    f"{ARR}.actor.calculate_entropy": "jrl always computes the entropy (actor/entropy)",
    f"{ARR}.actor.use_rollout_log_probs": (
        "current verl's workers read it nowhere; algorithm.rollout_correction.bypass_mode makes "
        "the rollout's log-probs the old ones"
    ),
    f"{ARR}.ref.fsdp_config.optimizer_offload": "the reference has no optimizer",
    "reward_model.model.fsdp_config.optimizer_offload": "the reward model has no optimizer",
    "critic.model.tokenizer_path": "the critic reads the actor's tokens (model.path's)",
    f"{ROLLOUT}.mode": "verl's rollout servers: jrl's sampler runs in the trainer",
    f"{ROLLOUT}.prompt_length": "jrl's rollout takes prompts as data.max_prompt_length",
    **{f"{ROLLOUT}.{key}": WEIGHT_TRANSFER for key in WEIGHT_TRANSFER_KEYS},
    "*.rollout_n": "verl's copy of actor_rollout_ref.rollout.n, which jrl reads",
    "*.strategy": "a torch training backend: jrl trains with JAX on its own mesh",
    "*.use_torch_compile": "torch.compile: XLA compiles every jrl program",
    "*.use_liger": "Liger's torch kernels: jrl's fused kernels are use_fused_kernels",
    "*.tiled_mlp.*": "torch's tiled MLP: jrl cuts activations by gradient checkpointing",
    "*.use_shm": "copying files to /dev/shm first: jrl reads them where they are",
    **dict.fromkeys(("*.fsdp_config.wrap_policy.*", "*.fsdp_config.min_num_params"), WRAPPING),
    **{f"*.fsdp_config.{key}": FSDP for key in FSDP_SCHEDULING},
    "*.fsdp_config.seed": "the torch engine's seed: jrl's random keys come from data.seed",
    "*.fsdp_config.full_determinism": "torch's deterministic algorithms switch",
    "*.fsdp_config.forward_only": "set by verl's engine for roles without an optimizer",
    "*.fsdp_config.ulysses_sequence_parallel_size": (
        "the engine's copy of the role's ulysses_sequence_parallel_size, which jrl reads"
    ),
    f"{ARR}.ref.router_replay.*": "the reference policy routes its tokens itself",
    "*.megatron.*_offload": (
        "Megatron's offload: jrl's is the role's fsdp_config.param_offload and optimizer_offload"
    ),
    "*.megatron.*dist_checkpointing*": (
        "Megatron-Core's copy of the model's weights: jrl reads the HF weights at model.path"
    ),
    "*.megatron.*": (
        "a Megatron-Core engine option: jrl trains with JAX (of the megatron keys, "
        "tensor_model_parallel_size and expert_model_parallel_size act, as the role's "
        "fsdp_config.tensor_parallel_size and expert_parallel_size)"
    ),
    **dict.fromkeys(("*.entropy_from_logits_with_chunking", "*.entropy_checkpointing"), ENTROPY),
    **{f"*.router_replay.{key}": ROUTES_IN_BATCH for key in ("record_file", "replay_file")},
    "*.optim.clip_grad": "Megatron's clipping: verl's FSDP roles clip at grad_clip",
    "*.optim.optimizer_impl": "the torch module of verl's optimizer: jrl's are optax's",
    "*.optim.total_training_steps": "set from the run's total steps (as verl sets it)",
    "*.checkpoint.async_save": "jrl always writes checkpoints in the background",
    "*.checkpoint.strict": "Megatron-Bridge's check of its HF weight export: jrl exports itself",
    "ray_kwargs.*": "Ray's options: jrl runs without Ray",
    "transfer_queue.*": "verl's Ray transfer queue: jrl runs without Ray",
    "trainer.use_legacy_worker_impl": "chooses between verl's Ray worker classes",
    **{f"reward_model.{key}": RAY for key in ("enable_resource_pool", "n_gpus_per_node", "nnodes")},
    **{f"reward_model.{key}": REWARD_LOOP for key in REWARD_LOOP_KEYS},
}

Applies = Callable[[ConfigDict, str], bool]  # (config, the engine that generates) -> idle


class Idle(NamedTuple):
    """Keys matching `pattern` that a resolver reads have no effect, for `reason`, where
    `applies` (to the run's config and the engine that generates on this host)."""

    pattern: str
    reason: str
    applies: Applies


def _no_host_offload(config: ConfigDict, engine: str) -> bool:
    """The backend has no device memory apart from the host's (`OFFLOAD_BACKENDS`: not CPU)."""
    return jax.default_backend() not in OFFLOAD_BACKENDS


def _no_memory_report(config: ConfigDict, engine: str) -> bool:
    """The JAX sampler generates and the device reports no memory to take a share of (CPU)."""
    return engine == "jax" and free_device_bytes(jax.local_devices()[0]) is None


def _tokenizer_without_code(config: ConfigDict, engine: str) -> bool:
    """The actor's tokenizer is a local folder whose tokenizer_config.json names no code of its
    own (no ``auto_map``): remote code is never asked for."""
    model = config[f"{ARR}.model"]
    folder = Path(str(model.get("tokenizer_path") or model.path)).expanduser()
    settings = folder / "tokenizer_config.json"
    return settings.is_file() and "auto_map" not in json.loads(settings.read_text())


IDLE_HERE = (
    Idle(
        "*.enable_activation_offload",
        "on CPU device memory is host memory: the layers are only rematerialised",
        _no_host_offload,
    ),
    Idle(
        f"{ROLLOUT}.gpu_memory_utilization",
        "the CPU reports no device memory: the JAX sampler's KV cache follows max_num_seqs and "
        "max_num_batched_tokens",
        _no_memory_report,
    ),
    Idle(
        "data.trust_remote_code",
        "the tokenizer (actor_rollout_ref.model.tokenizer_path or path) has no code of its own: "
        "its tokenizer_config.json has no auto_map",
        _tokenizer_without_code,
    ),
    Idle(
        "trainer.ray_wait_register_center_timeout",
        "one process: there are no other processes to wait for",
        lambda config, engine: jax.process_count() == 1,
    ),
    Idle(f"{ARR}.model.trust_remote_code", OWN_DECODER, lambda config, engine: engine == "jax"),
    *(
        Idle(
            f"{ROLLOUT}.{key}",
            f"{engine.label}'s option: {engine.label} does not generate in this run",
            lambda config, generating, name=engine.name: generating != name,
        )
        for engine in ENGINES.values()
        for key in engine.only_keys
    ),
)
