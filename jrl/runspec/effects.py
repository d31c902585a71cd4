"""What every key does here: the one registry behind the start-up notice of keys that have no
effect in this run and ``python -m jrl.train --explain``.

A key acts in the module its section names (`HOMES`, longest prefix wins) unless `NO_EFFECT`
lists it for this run: keys of torch, Ray or an engine that this run does not use, and keys of a
part of the run that is switched off (a critic under GRPO, token budgets without dynamic batch
sizes). Keys of features jrl does not implement are config errors instead
(`jrl.runspec.unsupported`). The notice names only keys the user set to a value other than the
default; untouched defaults say nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from ml_collections import ConfigDict

from jrl.algos.estimator import ADV_ESTIMATORS
from jrl.algos.estimator import OPTIONS as ESTIMATOR_OPTIONS
from jrl.algos.policy_loss import OPTIONS as LOSS_OPTIONS
from jrl.algos.policy_loss import POLICY_LOSS_TERMS
from jrl.config.defaults import default_config
from jrl.config.interpolation import resolve
from jrl.config.loading import load_card
from jrl.config.megatron import MEGATRON_ROLES
from jrl.config.moved import follows, key_matches, leaves, moved_settings, value_at
from jrl.config.overrides import parse_command_line, split_key
from jrl.models.decoder import OFFLOAD_BACKENDS
from jrl.rollout.engines import ENGINES, Engine
from jrl.rollout.limits import free_device_bytes
from jrl.runspec.algorithm import ACTOR_LOSS_KEYS, POLICY_LOSS_KEYS
from jrl.runspec.loading import load_config
from jrl.runspec.models import LORA_OPTIONS, lora_rank
from jrl.runspec.optim import scheduler_kind, warmup_steps
from jrl.runspec.reward import manager_name
from jrl.runspec.shape import estimator_needs_critic, uses_critic, uses_reference
from jrl.runspec.spec import resolve_run
from jrl.runspec.unsupported import unsupported_reason

_ROLLOUT = "actor_rollout_ref.rollout"
_ACTOR = "actor_rollout_ref.actor"
_REF = "actor_rollout_ref.ref"

Applies = Callable[[ConfigDict, str], bool]  # (config, generating engine) -> the entry applies


def _always(config: ConfigDict, engine: str) -> bool:
    return True


def _jax_sampler(config: ConfigDict, engine: str) -> bool:
    return engine == "jax"


def _not_generating(engine: Engine) -> Applies:
    """Applies while another engine than `engine` generates (`jrl.rollout.engines.serving`)."""
    return lambda config, generating: generating != engine.name


def _off(key: str) -> Applies:
    """Applies while the bool `key` is off."""
    return lambda config, engine: not config[key]


@dataclasses.dataclass(frozen=True)
class NoEffect:
    """Keys matching `pattern` (dotted, ``*`` matches any part) but not listed in `unless` have
    no effect, for `reason`, in a run whose config and generating rollout `engine` (jax or vllm,
    `jrl.rollout.build.serving_engine`) `applies` to (`given_only`: see `no_effect_reason`)."""

    pattern: str
    reason: str
    applies: Applies = _always
    unless: tuple[str, ...] = ()
    given_only: bool = False

    def matches(self, key: str, config: ConfigDict, engine: str) -> bool:
        named = key_matches(self.pattern, key) and key not in self.unless
        return named and self.applies(config, engine)


_TORCH_BACKEND = "a torch training backend: jrl trains with JAX on its own mesh"
_TORCH_COMPILE = "torch.compile: XLA compiles every jrl program"
_FSDP = "torch FSDP's scheduling: jrl shards every parameter by its logical axes with XLA"
_ENTROPY = "torch's entropy memory options: jrl's log-prob/entropy kernel follows use_fused_kernels"
_MOE = "jrl has no mixture-of-experts model family"
_TEXT_ONLY = "multi-modal inputs: jrl's model families are text-only"
_SHM = "copying files to /dev/shm first: jrl reads them where they are"
_WEIGHT_TRANSFER = "verl's weight transfer between Ray workers: jrl hands weights over in process"
_RAY = "Ray's placement: jrl runs every role in one process per host, on the trainer's devices"
_REWARD_LOOP = "verl's asynchronous reward workers: jrl scores in process (the same scores)"
_NO_CRITIC = (
    "no critic in this run (critic.enable, or an estimator that reads the critic's values such "
    "as gae, starts one)"
)
_NO_REFERENCE = "no reference model in this run (actor.use_kl_loss or algorithm.use_kl_in_reward)"
_NO_REWARD_MODEL = "reward_model.enable is False"
_STATIC_BATCHES = "token budgets apply with dynamic batch sizes only"
_ADAMW = "verl 0.6.0's FSDP roles build AdamW whatever optim.optimizer names, and so does jrl"
_OWN_DECODER = (
    "jrl builds its own decoder from config.json, so no repository code runs (the tokenizer "
    "follows data.trust_remote_code)"
)
_MEGATRON = (
    "a Megatron-Core engine option: jrl trains with JAX (of the megatron keys, "
    "tensor_model_parallel_size acts, as the role's fsdp_config.tensor_parallel_size)"
)
_RM_MODEL_KEYS = (
    "model.*",
    "megatron.*",
    "micro_batch_size*",
    "max_length",
    "use_dynamic_bsz",
    "forward_max_token_len_per_gpu",
    "ulysses_sequence_parallel_size",
)


def _not_dapo(config: ConfigDict, engine: str) -> bool:
    return manager_name(config)[1] != "dapo"


def _lora_on(model: str) -> Applies:
    return lambda config, engine: lora_rank(config[model]) > 0


def _lora_off(model: str) -> Applies:
    on = _lora_on(model)
    return lambda config, engine: not on(config, engine)


def _no_custom_reward_manager(config: ConfigDict, engine: str) -> bool:
    """No reward manager of the user's (``reward_manager.source=importlib``), which is handed
    the whole batch, in this run."""
    return config.reward_manager.source != "importlib"


def _raw_chat_unread(config: ConfigDict, engine: str) -> bool:
    """Neither a reward model that re-templates the prompt's messages (``input_tokenizer``)
    nor a custom reward manager reads ``raw_prompt``."""
    rm = config.reward_model
    retemplates = rm.enable and rm.model.get("input_tokenizer") is not None
    return _no_custom_reward_manager(config, engine) and not retemplates


_UNREAD_FIELD = "the batch carries it, but only a custom reward manager (importlib) would read it"


def _policy_loss_ignores(option: str) -> Applies:
    """Applies while the run's policy loss does not read `option` (its descriptor says; one that
    follows verl's calling convention may read any). Bypass mode's loss needs loss_mode vanilla
    and reads what vanilla reads."""

    def applies(config: ConfigDict, engine: str) -> bool:
        loss = POLICY_LOSS_TERMS.find(config[f"{_ACTOR}.policy_loss.loss_mode"])
        return loss is not None and not loss.reads(option)

    return applies


def _estimator_ignores(option: str) -> Applies:
    """Applies while the run's advantage estimator does not read ``algorithm.<option>`` (its
    descriptor says; one registered with verl's plain decorator may read any)."""

    def applies(config: ConfigDict, engine: str) -> bool:
        estimator = ADV_ESTIMATORS.find(config.algorithm.adv_estimator)
        return estimator is not None and not estimator.reads(option)

    return applies


def _estimator_entries() -> tuple[NoEffect, ...]:
    """The estimators' options (`EstimatorOptions`) while the run's estimator ignores them."""
    entries = []
    for option in ESTIMATOR_OPTIONS:
        readers = [n for n in ADV_ESTIMATORS.names() if ADV_ESTIMATORS.get(n).reads(option)]
        reason = f"the advantage estimator ignores it: only {', '.join(readers)} read it"
        entries.append(NoEffect(f"algorithm.{option}", reason, _estimator_ignores(option)))
    return tuple(entries)


def _constant_schedule(role: str) -> Applies:
    """Applies while `role`'s learning rate is constant (`scheduler_kind`)."""
    return lambda config, engine: scheduler_kind(config[f"{role}.optim"]) == "constant"


def _warmup_steps_given(role: str) -> Applies:
    """Applies while `role`'s ``lr_warmup_steps`` sets the warm-up (`warmup_steps`)."""
    return lambda config, engine: warmup_steps(config[f"{role}.optim"]) is not None


def _greedy_validation(config: ConfigDict, engine: str) -> bool:
    val = config[f"{_ROLLOUT}.val_kwargs"]
    return not val.do_sample or val.temperature == 0


def _no_host_offload(config: ConfigDict, engine: str) -> bool:
    """Applies where the backend has no device memory apart from the host's (the decoder's
    rule, `jrl.models.decoder.OFFLOAD_BACKENDS`: CPU)."""
    import jax

    return jax.default_backend() not in OFFLOAD_BACKENDS


def _no_memory_report(config: ConfigDict, engine: str) -> bool:
    """Applies where the JAX sampler generates and the device reports no memory to take a share
    of (the sampler's rule, `jrl.rollout.limits.free_device_bytes`: CPU)."""
    import jax

    return engine == "jax" and free_device_bytes(jax.local_devices()[0]) is None


def _local_data(config: ConfigDict, engine: str) -> bool:
    """Applies while every data file is a local path (or ``file://``)."""
    files = [config.data.train_files, config.data.val_files]
    paths = [f for group in files for f in ([group] if isinstance(group, str) else group or [])]
    return all("://" not in p or p.startswith("file://") for p in paths)


_NAMED_LOGGERS = ("wandb", "mlflow", "swanlab")


def _unnamed_run(config: ConfigDict, engine: str) -> bool:
    """Applies while no logger names the run and the checkpoint folder does not follow the
    project and experiment names (`follows`: it was set apart from them)."""
    loggers = config.trainer.logger
    named = set([loggers] if isinstance(loggers, str) else loggers) & set(_NAMED_LOGGERS)
    return not named and not follows(config, "trainer.default_local_dir")


def _tokenizer_without_code(config: ConfigDict, engine: str) -> bool:
    """Applies while the actor's tokenizer is a local folder whose tokenizer_config.json names
    no code of its own (no ``auto_map``): remote code is never asked for."""
    model = config.actor_rollout_ref.model
    folder = Path(str(model.get("tokenizer_path") or model.path)).expanduser()
    settings = folder / "tokenizer_config.json"
    return settings.is_file() and "auto_map" not in json.loads(settings.read_text())


def _single_process(config: ConfigDict, engine: str) -> bool:
    import jax

    return jax.process_count() == 1


def _lora_entries() -> tuple[NoEffect, ...]:
    """The LoRA options (`LORA_OPTIONS`) of each model section that has them, while its
    ``lora_rank`` is 0."""
    defaults = default_config()
    return tuple(
        NoEffect(f"{model}.{key}", f"{model}.lora_rank is 0", _lora_off(model))
        for model in ("actor_rollout_ref.model", "critic.model")
        for key in LORA_OPTIONS
        if key in defaults[model]
    )


def _optim_entries() -> tuple[NoEffect, ...]:
    """The cosine schedule's options under a constant one, the warm-up ratio when a step count
    is given (verl's rule: lr_warmup_steps >= 0 wins), and the optimizer's name (verl 0.6.0's
    FSDP roles build torch's AdamW whatever it says; jrl's Adam is that AdamW too)."""
    entries = []
    for role in (_ACTOR, "critic"):
        for key in ("min_lr_ratio", "num_cycles"):
            reason = "the learning rate is constant: min_lr_ratio and num_cycles shape cosine's"
            entries.append(NoEffect(f"{role}.optim.{key}", reason, _constant_schedule(role)))
        entries.append(
            NoEffect(
                f"{role}.optim.lr_warmup_steps_ratio",
                f"{role}.optim.lr_warmup_steps >= 0 sets the warm-up instead",
                _warmup_steps_given(role),
            )
        )
        entries.append(NoEffect(f"{role}.optim.optimizer", _ADAMW))
    return tuple(entries)


def _loss_entries() -> tuple[NoEffect, ...]:
    """Options of choices the run did not make: of policy losses other than the run's, of
    sampled validation, of the rollout's log-probs, of batch fields for a reward model or
    manager the run does not have, of validating before training."""
    entries = [
        NoEffect(
            f"{_ACTOR}.clip_ratio",
            "actor.clip_ratio_low and clip_ratio_high are both set: clip_ratio is their fallback",
            lambda config, engine: (
                config[f"{_ACTOR}.clip_ratio_low"] is not None
                and config[f"{_ACTOR}.clip_ratio_high"] is not None
            ),
        ),
        NoEffect(
            f"{_ROLLOUT}.val_kwargs.top_*",
            "validation is greedy: val_kwargs.do_sample is False or val_kwargs.temperature is 0",
            _greedy_validation,
        ),
        NoEffect(
            f"{_ROLLOUT}.val_kwargs.temperature",
            "val_kwargs.do_sample is False (greedy validation)",
            lambda config, engine: not config[f"{_ROLLOUT}.val_kwargs.do_sample"],
        ),
        NoEffect(
            f"{_ROLLOUT}.val_kwargs.do_sample",
            "val_kwargs.temperature is 0: validation is greedy either way",
            lambda config, engine: config[f"{_ROLLOUT}.val_kwargs.temperature"] == 0,
        ),
        NoEffect(
            f"{_ROLLOUT}.logprobs_mode",
            "the rollout returns no log-probs (rollout.calculate_log_probs is False)",
            _off(f"{_ROLLOUT}.calculate_log_probs"),
        ),
        NoEffect("data.return_raw_input_ids", _UNREAD_FIELD, _no_custom_reward_manager),
        NoEffect("data.return_full_prompt", _UNREAD_FIELD, _no_custom_reward_manager),
        NoEffect(
            "data.return_raw_chat",
            "only a reward model with input_tokenizer, or a custom reward manager, reads the "
            "prompt's messages",
            _raw_chat_unread,
        ),
        NoEffect(
            "trainer.val_only",
            "trainer.val_before_train is False (val_only stops after that validation)",
            _off("trainer.val_before_train"),
        ),
    ]
    losses = [POLICY_LOSS_TERMS.get(name) for name in POLICY_LOSS_TERMS.names()]
    for section, keys in ((_ACTOR, ACTOR_LOSS_KEYS), (f"{_ACTOR}.policy_loss", POLICY_LOSS_KEYS)):
        for key in (key for key in keys if key in LOSS_OPTIONS):
            readers = [loss.name for loss in losses if loss.reads(key)]
            reason = f"the policy loss ignores it: only {', '.join(readers)} read it"
            entries.append(NoEffect(f"{section}.{key}", reason, _policy_loss_ignores(key)))
    return tuple(entries)


def _token_budgets() -> tuple[NoEffect, ...]:
    """Each role's token budget, which only dynamic batch sizes use."""
    budgets = {
        f"{_ACTOR}.ppo_max_token_len_per_gpu": f"{_ACTOR}.use_dynamic_bsz",
        f"{_REF}.log_prob_max_token_len_per_gpu": f"{_REF}.log_prob_use_dynamic_bsz",
        f"{_ROLLOUT}.log_prob_max_token_len_per_gpu": f"{_ROLLOUT}.log_prob_use_dynamic_bsz",
        "critic.ppo_max_token_len_per_gpu": "critic.use_dynamic_bsz",
        "critic.forward_max_token_len_per_gpu": "critic.use_dynamic_bsz",
        "reward_model.forward_max_token_len_per_gpu": "reward_model.use_dynamic_bsz",
    }
    return tuple(NoEffect(key, _STATIC_BATCHES, _off(switch)) for key, switch in budgets.items())


NO_EFFECT = (
    NoEffect("data.tokenizer", "verl reads the tokenizer from actor_rollout_ref.model.path"),
    NoEffect("actor_rollout_ref.hybrid_engine", "jrl always colocates the roles (hybrid engine)"),
    NoEffect("actor_rollout_ref.nccl_timeout", "NCCL's timeout: jrl's collectives are XLA's"),
    NoEffect("*.strategy", _TORCH_BACKEND),
    NoEffect("*.use_torch_compile", _TORCH_COMPILE),
    NoEffect("*.use_liger", "Liger's torch kernels: jrl's fused kernels are use_fused_kernels"),
    NoEffect("*.tiled_mlp.*", "torch's tiled MLP: jrl cuts activations by gradient checkpointing"),
    NoEffect("*.use_shm", _SHM),
    NoEffect("*.fsdp_config.wrap_policy.*", "torch FSDP wrapping: jrl shards by logical axes"),
    NoEffect("*.fsdp_config.min_num_params", "torch FSDP wrapping: jrl shards by logical axes"),
    *(
        NoEffect(f"*.fsdp_config.{key}", _FSDP)
        for key in (
            "offload_policy",
            "reshard_after_forward",
            "forward_prefetch",
            "use_orig_params",
        )
    ),
    NoEffect(
        "*.fsdp_config.seed", "the torch engine's seed: jrl's random keys come from data.seed"
    ),
    NoEffect("*.fsdp_config.full_determinism", "torch's deterministic algorithms switch"),
    NoEffect("*.fsdp_config.forward_only", "set by verl's engine for roles without an optimizer"),
    NoEffect(
        "*.fsdp_config.ulysses_sequence_parallel_size",
        "the engine's copy of the role's ulysses_sequence_parallel_size, which jrl reads",
    ),
    NoEffect(f"{_REF}.fsdp_config.optimizer_offload", "the reference has no optimizer"),
    NoEffect(
        "reward_model.model.fsdp_config.optimizer_offload", "the reward model has no optimizer"
    ),
    NoEffect(
        "*.megatron.*_offload",
        "Megatron's offload: jrl's is the role's fsdp_config.param_offload and optimizer_offload",
    ),
    NoEffect(
        "*.megatron.*dist_checkpointing*",
        "Megatron-Core's copy of the model's weights: jrl reads the HF weights at model.path",
    ),
    NoEffect(
        "*.megatron.*",
        _MEGATRON,
        unless=tuple(f"{role}.megatron.tensor_model_parallel_size" for role in MEGATRON_ROLES),
    ),
    NoEffect("*.entropy_from_logits_with_chunking", _ENTROPY),
    NoEffect("*.entropy_checkpointing", _ENTROPY),
    NoEffect("*.moe_config.freeze_moe_router", _MOE),
    NoEffect("*.router_replay.*", _MOE),
    NoEffect(f"{_ROLLOUT}.enable_rollout_routing_replay", _MOE),
    NoEffect("*.optim.clip_grad", "Megatron's clipping: verl's FSDP roles clip at grad_clip"),
    NoEffect("*.optim.optimizer_impl", "the torch module of verl's optimizer: jrl's are optax's"),
    NoEffect("*.optim.total_training_steps", "set from the run's total steps (as verl sets it)"),
    NoEffect("*.checkpoint.async_save", "jrl always writes checkpoints in the background"),
    *(
        NoEffect(
            f"{role}.data_loader_seed",
            f"{role}.shuffle is False: the mini-batches keep their order",
            _off(f"{role}.shuffle"),
        )
        for role in (_ACTOR, "critic")
    ),
    NoEffect(
        f"{_ACTOR}.loss_scale_factor",
        "the divisor of loss_agg_mode=seq-mean-token-sum-norm only",
        lambda config, engine: config[f"{_ACTOR}.loss_agg_mode"] != "seq-mean-token-sum-norm",
    ),
    NoEffect("actor_rollout_ref.model.trust_remote_code", _OWN_DECODER, _jax_sampler),
    NoEffect("critic.model.trust_remote_code", _OWN_DECODER),
    NoEffect(
        "data.trust_remote_code",
        "the tokenizer (actor_rollout_ref.model.tokenizer_path or path) has no code of its own: "
        "its tokenizer_config.json has no auto_map",
        _tokenizer_without_code,
    ),
    NoEffect(
        "*.enable_activation_offload",
        "on CPU device memory is host memory: the layers are only rematerialised",
        _no_host_offload,
    ),
    NoEffect(
        f"{_ROLLOUT}.gpu_memory_utilization",
        "the CPU reports no device memory: the JAX sampler's KV cache follows max_num_seqs and "
        "max_num_batched_tokens",
        _no_memory_report,
    ),
    NoEffect("data.image_key", f"{_TEXT_ONLY} (rows with images under it are refused)"),
    NoEffect(
        "data.cache_dir",
        "where remote data files are copied: every data file of this run is local",
        _local_data,
    ),
    NoEffect(
        "data.validation_shuffle",
        "validation is greedy and generates the whole set in one call: the order of its rows "
        "changes no result",
        _greedy_validation,
    ),
    *(
        NoEffect(
            f"trainer.{key}",
            f"names the run for {', '.join(_NAMED_LOGGERS)} (none is in trainer.logger) and for "
            "trainer.default_local_dir (set apart from it)",
            _unnamed_run,
        )
        for key in ("project_name", "experiment_name")
    ),
    NoEffect(
        "trainer.ray_wait_register_center_timeout",
        "one process: there are no other processes to wait for",
        _single_process,
    ),
    *(
        NoEffect(f"{role}.rollout_n", "verl's copy of actor_rollout_ref.rollout.n, which jrl reads")
        for role in (_ACTOR, _REF, "critic")
    ),
    NoEffect(f"{_ACTOR}.use_remove_padding", "jrl packs rows as model.use_remove_padding says"),
    NoEffect(f"{_ACTOR}.calculate_entropy", "jrl always computes the entropy (actor/entropy)"),
    NoEffect(f"{_ACTOR}.freeze_vision_tower", _TEXT_ONLY),
    *(NoEffect(f"data.{key}", _TEXT_ONLY) for key in ("image_patch_size", "video_key")),
    NoEffect("data.return_multi_modal_inputs", _TEXT_ONLY),
    NoEffect(
        "data.val_batch_size",
        "jrl generates the whole validation set in one call (verl's default); the sampler "
        "batches it by its slots",
    ),
    NoEffect("data.dataloader_num_workers", "torch DataLoader workers: jrl reads rows in process"),
    NoEffect("data.filter_overlong_prompts_workers", "jrl filters long prompts in process"),
    NoEffect("critic.model.tokenizer_path", "the critic reads the actor's tokens (model.path's)"),
    NoEffect(f"{_ROLLOUT}.mode", "verl's rollout servers: jrl's sampler runs in the trainer"),
    NoEffect(f"{_ROLLOUT}.prompt_length", "jrl's rollout takes prompts as data.max_prompt_length"),
    NoEffect(f"{_ROLLOUT}.checkpoint_engine.*", _WEIGHT_TRANSFER),
    NoEffect(f"{_ROLLOUT}.update_weights_bucket_megabytes", _WEIGHT_TRANSFER),
    NoEffect("ray_kwargs.*", "Ray's options: jrl runs without Ray"),
    NoEffect("transfer_queue.*", "verl's Ray transfer queue: jrl runs without Ray"),
    NoEffect("trainer.use_legacy_worker_impl", "chooses between verl's Ray worker classes"),
    *(
        NoEffect(f"reward_model.{key}", _RAY)
        for key in ("enable_resource_pool", "n_gpus_per_node", "nnodes")
    ),
    NoEffect("reward_model.launch_reward_fn_async", _REWARD_LOOP),
    NoEffect("reward_model.use_reward_loop", _REWARD_LOOP),
    NoEffect("reward_model.reward_loop_*", _REWARD_LOOP),
    NoEffect("reward_model.num_workers", _REWARD_LOOP),
    NoEffect(
        "algorithm.filter_groups.*", "read by verl's DAPO recipe only, not by the PPO trainer"
    ),
    *(
        NoEffect(
            f"{_ROLLOUT}.{key}",
            f"{engine.label}'s option: {engine.label} does not generate in this run",
            _not_generating(engine),
        )
        for engine in ENGINES.values()
        for key in engine.only_keys
    ),
    # Parts of the run that are switched off.
    NoEffect(
        "critic.*",
        _NO_CRITIC,
        lambda config, engine: not uses_critic(config),
        unless=("critic.enable",),
        given_only=True,
    ),
    NoEffect(
        "trainer.max_critic_ckpt_to_keep",
        _NO_CRITIC,
        lambda config, engine: not uses_critic(config),
        given_only=True,
    ),
    NoEffect(
        "critic.enable",
        "the advantage estimator (e.g. gae) reads the critic's values, so it starts the critic "
        "whatever critic.enable says (False is an error)",
        lambda config, engine: estimator_needs_critic(config),
    ),
    NoEffect(
        "trainer.critic_warmup",
        _NO_CRITIC,
        lambda config, engine: not uses_critic(config),
        given_only=True,
    ),
    *(
        NoEffect(
            f"{_REF}.fsdp_config.{key}",
            "with LoRA the reference is the actor's base model: on the actor's mesh, under the "
            "actor's param_offload",
            _lora_on("actor_rollout_ref.model"),
        )
        for key in ("fsdp_size", "param_offload")
    ),
    NoEffect(
        f"{_REF}.*",
        _NO_REFERENCE,
        lambda config, engine: not uses_reference(config),
        given_only=True,
    ),
    *(
        NoEffect(f"reward_model.{key}", _NO_REWARD_MODEL, _off("reward_model.enable"))
        for key in _RM_MODEL_KEYS
    ),
    NoEffect(
        f"{_ACTOR}.kl_loss_*", f"{_ACTOR}.use_kl_loss is False", _off(f"{_ACTOR}.use_kl_loss")
    ),
    NoEffect(
        "algorithm.kl_penalty",
        "algorithm.use_kl_in_reward is False",
        _off("algorithm.use_kl_in_reward"),
    ),
    NoEffect(
        "algorithm.kl_ctrl.*",
        "algorithm.use_kl_in_reward is False",
        _off("algorithm.use_kl_in_reward"),
    ),
    *_lora_entries(),
    NoEffect(
        "actor_rollout_ref.model.fused_kernel_options.*",
        "actor_rollout_ref.model.use_fused_kernels is False",
        _off("actor_rollout_ref.model.use_fused_kernels"),
    ),
    *_token_budgets(),
    *_optim_entries(),
    *_loss_entries(),
    *_estimator_entries(),
    NoEffect(
        "reward_model.overlong_buffer.*",
        "the dapo reward manager's option (reward_manager.name / reward_model.reward_manager)",
        _not_dapo,
    ),
    NoEffect(
        "reward_manager.module.*",
        "reward_manager.source is not importlib",
        lambda config, engine: config.reward_manager.source != "importlib",
    ),
    NoEffect(
        "custom_reward_function.name",
        "custom_reward_function.path is not set",
        lambda config, engine: not config.custom_reward_function.path,
    ),
    NoEffect(
        "trainer.resume_from_path",
        "trainer.resume_mode is not resume_path",
        lambda config, engine: config.trainer.resume_mode != "resume_path",
    ),
)

HOMES = {
    "data": "jrl.data (datasets, prompts, batching)",
    "actor_rollout_ref.model": "jrl.runspec.models.ModelSettings (model loading, LoRA, remat)",
    "actor_rollout_ref.actor": "jrl.trainer.roles.actor (policy update)",
    "actor_rollout_ref.actor.optim": "jrl.optim (optimizer, schedule)",
    "actor_rollout_ref.actor.policy_loss": "jrl.algos.policy_loss",
    "actor_rollout_ref.actor.fsdp_config": "jrl.parallel (mesh, offload)",
    **{
        f"{role}.megatron.tensor_model_parallel_size": "jrl.parallel (the role's tensor axis)"
        for role in MEGATRON_ROLES
    },
    "actor_rollout_ref.ref": "jrl.trainer.roles.reference",
    "actor_rollout_ref.rollout": "jrl.rollout (engine, sampling, limits)",
    "critic": "jrl.trainer.roles.critic",
    "critic.optim": "jrl.optim (optimizer, schedule)",
    "reward_model": "jrl.trainer.roles.reward_model, jrl.reward (reward managers)",
    "custom_reward_function": "jrl.reward (custom reward function)",
    "algorithm": "jrl.algos (advantages, KL, rollout correction)",
    "trainer": "jrl.trainer.loop (steps, validation, checkpoints, logging)",
}


def home(key: str) -> str:
    """The module where `key` acts (its longest listed section prefix)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = HOMES.get(".".join(parts[:n]))
        if found:
            return found
    return "jrl (top level)"


def no_effect_reason(
    key: str, config: ConfigDict, engine: str, given: Collection[str] | None = None
) -> str | None:
    """Why `key` has no effect in the run of `config` whose rollout `engine` generates, or None
    when it acts. Entries about switched-off roles (`NoEffect.given_only`) count only for keys
    in `given` (the command line's; None: every key): a card keeps every role's settings, as
    verl's configs do, and says nothing of them."""

    def counts(entry: NoEffect) -> bool:
        if not entry.given_only or given is None:
            return True
        return any(key == g or key.startswith(f"{g}.") for g in given)

    entries = (e for e in NO_EFFECT if e.matches(key, config, engine) and counts(e))
    return next((e.reason for e in entries), None)


def command_line_keys(argv: Sequence[str]) -> frozenset[str]:
    """The keys a command line sets or resets (``+``, ``++`` and ``~`` dropped)."""
    return frozenset(split_key(key)[1] for key, _ in parse_command_line(argv).overrides)


def ignored_settings(
    config: ConfigDict, engine: str, given: Collection[str] = ()
) -> dict[str, list]:
    """{reason: [(key, value), ...]} of the keys set away from their defaults that have no
    effect in the run of `config` whose rollout `engine` generates (keys that only follow
    another setting are left out; switched-off roles' keys only when in `given`)."""
    found: dict[str, list] = {}
    reason = functools.partial(no_effect_reason, config=config, engine=engine, given=given)
    for key, value in moved_settings(config, lambda key: reason(key) is not None):
        found.setdefault(reason(key), []).append((key, value))
    return found


def no_effect_notice(config: ConfigDict, engine: str, given: Collection[str] = ()) -> str | None:
    """The start-up notice (one line per reason) of `ignored_settings`, or None."""
    found = ignored_settings(config, engine, given)
    if not found:
        return None
    lines = ["jrl: these settings have no effect in this run:"]
    for reason, pairs in found.items():
        keys = ", ".join(f"{k}={v!r}" for k, v in pairs)
        lines.append(f"  {keys} ({reason})")
    return "\n".join(lines)


def explain(argv: Sequence[str], engine: Callable[[ConfigDict], str]) -> str:
    """The resolved config of a command line, one key a line: value, source (default / card /
    override), where it acts (or why it has no effect) with the rollout engine that
    `engine(config)` says generates, and the RunSpec field(s) it became (``-> rollout``)."""
    spec = parse_command_line(argv).spec
    config = load_config(argv)[0]
    generating = engine(config)
    fields = resolve_run(config).key_fields
    defaults = resolve(default_config())
    card = resolve(load_card(spec)[0]) if spec else defaults
    overridden = command_line_keys(argv)
    lines = []
    for key, value in leaves(config):
        if any(key == o or key.startswith(f"{o}.") for o in overridden):
            source = "override"
        elif value_at(card, key) != value_at(defaults, key):
            source = "card"
        else:
            source = "default"
        unsupported = unsupported_reason(key, config)
        reason = no_effect_reason(key, config, generating)
        if unsupported:
            where = f"not supported away from its default: {unsupported}"
        else:
            where = f"no effect: {reason}" if reason else home(key)
        became = fields_of(key, fields)
        lines.append(f"{key} = {value!r}  [{source}]  {where}{became}")
    return "\n".join(lines)


def fields_of(key: str, fields: Mapping[str, tuple[str, ...]]) -> str:
    """`` -> f1, f2``: the RunSpec fields `key` (or a section holding it, read whole) became;
    empty when the resolver did not read it."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        found = fields.get(".".join(parts[:n]))
        if found is not None:
            return f"  -> {', '.join(found)}" if found else ""
    return ""
