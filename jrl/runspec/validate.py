"""Every check of a config that can be made without loading anything (verl's cross-key rules,
allowed values, jrl's own limits), for RL (`validate`) and SFT (`validate_sft`): run when the
config is loaded, before any weight is read or anything is compiled. Each problem names the key
and the fix; all problems are reported at once."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ml_collections import ConfigDict

from jrl.algos.estimator import ADV_ESTIMATORS
from jrl.algos.kl import KL_CONTROLLERS, KL_ESTIMATORS
from jrl.algos.policy_loss import POLICY_LOSS_TERMS
from jrl.config.errors import ConfigError
from jrl.models.config import ATTN_IMPLEMENTATIONS
from jrl.models.dtypes import DTYPES
from jrl.parallel.devices import BACKENDS
from jrl.rollout.engines import ENGINES
from jrl.runspec.dynamic_sampling import dynamic_sampling_problems
from jrl.runspec.models import lora_problems, lora_rank
from jrl.runspec.optim import optimizer_problems, sft_optimizer_problems
from jrl.runspec.placement import placement_problems
from jrl.runspec.reward import reward_manager_problems
from jrl.runspec.rollout import rollout_problems
from jrl.runspec.rollout_correction_checks import rollout_correction_problems
from jrl.runspec.router_replay import router_replay_problems
from jrl.runspec.run import CHECKPOINT_ITEMS
from jrl.runspec.shape import estimator_needs_critic, n_gpus, uses_critic, uses_reference
from jrl.runspec.unsupported import unsupported_settings

LOSS_AGG_MODES = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
TRUNCATIONS = ("error", "left", "right", "middle")
RESUME_MODES = ("auto", "disable", "resume_path")
# `jrl_kernels.logprob_entropy` implementation of each ``fused_kernel_options.impl_backend``:
# triton -> the Pallas kernel of the backend (auto: Pallas TPU / GPU where it runs, else chunked),
# torch -> the chunked XLA loop (portable).
FUSED_KERNEL_IMPLS = {"triton": "auto", "torch": "chunked"}
SFT_TRUNCATIONS = ("error", "left", "right")
SFT_STRATEGIES = ("fsdp", "fsdp2")
_GPUS = "trainer.nnodes * trainer.n_gpus_per_node"
_N = "actor_rollout_ref.rollout.n"


def _positive(value: int | None) -> bool:
    return value is not None and value > 0


def _not_one_of(key: str, value: object, allowed: Sequence[str], note: str = "") -> str:
    return f"{key}={value!r} is not supported{note}; use one of {', '.join(allowed)}"


def _choices(config: ConfigDict) -> Iterator[str]:
    rules = [
        ("actor_rollout_ref.actor.loss_agg_mode", LOSS_AGG_MODES, ""),
        ("algorithm.adv_estimator", tuple(ADV_ESTIMATORS.names()), ""),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", tuple(POLICY_LOSS_TERMS.names()), ""),
        ("actor_rollout_ref.rollout.name", tuple(ENGINES), ""),
        ("data.truncation", TRUNCATIONS, ""),
        ("trainer.resume_mode", RESUME_MODES, ""),
        ("trainer.device", tuple(BACKENDS), ""),
    ]
    if uses_critic(config):
        rules.append(("critic.loss_agg_mode", LOSS_AGG_MODES, ""))
    if uses_critic(config) or config.reward_model.enable:  # where verl picks a worker class by it
        rules.append(("trainer.use_legacy_worker_impl", ("auto", "enable", "disable"), ""))
    arr = config.actor_rollout_ref
    if any(section.get("use_fused_kernels") for section in (arr.model, arr.actor, arr.ref)):
        backends = tuple(FUSED_KERNEL_IMPLS)
        note = " (triton: the Pallas kernel, torch: chunked XLA)"
        rules.append(("actor_rollout_ref.model.fused_kernel_options.impl_backend", backends, note))
    for key, allowed, note in rules:
        if config[key] not in allowed:
            yield _not_one_of(key, config[key], allowed, note)
    yield from _attention_choices(config)
    rollout = config.actor_rollout_ref.rollout
    if rollout.val_kwargs.do_sample and not rollout.temperature > 0:
        yield (
            "actor_rollout_ref.rollout.val_kwargs.do_sample=True needs "
            f"actor_rollout_ref.rollout.temperature > 0 (it is {rollout.temperature}); raise the "
            "temperature or set actor_rollout_ref.rollout.val_kwargs.do_sample=false"
        )


def _attention_choices(config: ConfigDict) -> Iterator[str]:
    """Each model's ``override_config.attn_implementation`` names a kernel jrl has."""
    for prefix in ("actor_rollout_ref.model", "critic.model", "reward_model.model"):
        override = config[prefix].get("override_config") or {}
        attention = override.get("attn_implementation")
        if attention is not None and attention not in ATTN_IMPLEMENTATIONS:
            key = f"{prefix}.override_config.attn_implementation"
            yield _not_one_of(key, attention, ATTN_IMPLEMENTATIONS)


def _one_of(config: ConfigDict, prefix: str, name: str, ranks: int) -> Iterator[str]:
    """verl's rule: exactly one of `{name}` (deprecated, global: split over the `ranks`
    data-parallel ranks) and `{name}_per_gpu`, giving at least one row per rank."""
    total, per_gpu = config[f"{prefix}.{name}"], config[f"{prefix}.{name}_per_gpu"]
    if (total is None) == (per_gpu is None):
        yield (
            f"set exactly one of {prefix}.{name}_per_gpu and {prefix}.{name} (deprecated); "
            f"{'neither is set' if total is None else 'both are set'}: e.g. "
            f"{prefix}.{name}_per_gpu=8 {prefix}.{name}=null"
        )
    elif (per_gpu if per_gpu is not None else total // ranks) < 1:
        given = f"{name}_per_gpu={per_gpu}" if per_gpu is not None else f"{name}={total}"
        yield (
            f"{prefix}.{given} gives fewer than one row per data-parallel rank ({ranks}: "
            f"{_GPUS} over the model-parallel size); raise it"
        )


def _parallel_sizes(section: ConfigDict) -> tuple[int | None, int]:
    """(sequence-parallel size as given, tensor-parallel size) of a role section: the latter from
    its (or its model's) ``fsdp_config``, 1 when unset."""
    fsdp = section.get("fsdp_config") or section.get("model", {}).get("fsdp_config") or {}
    return section.get("ulysses_sequence_parallel_size"), fsdp.get("tensor_parallel_size") or 1


def _data_ranks(config: ConfigDict, role: str, gpus: int) -> int:
    """The data-parallel ranks of the role section `role`: the devices over its sequence- and
    tensor-parallel sizes (at least 1; an uneven split is reported by `_updates`)."""
    sp, tp = _parallel_sizes(config[role])
    return max(1, gpus // max(1, (sp or 1) * tp))


def _updates(config: ConfigDict, prefix: str, gpus: int) -> Iterator[str]:
    """Mini/micro-batch rules of a trained role (actor or critic) under `prefix`."""
    role = config[prefix]
    n, batch = config.actor_rollout_ref.rollout.n, config.data.train_batch_size
    mini, (sp, tp) = role.ppo_mini_batch_size, _parallel_sizes(role)
    if not role.use_dynamic_bsz:
        yield from _one_of(
            config, prefix, "ppo_micro_batch_size", _data_ranks(config, prefix, gpus)
        )
        total = role.ppo_micro_batch_size
        if total and _positive(mini) and mini % total:
            yield (  # verl checks the deprecated global size before normalising it
                f"{prefix}.ppo_mini_batch_size ({mini}) must be divisible by "
                f"{prefix}.ppo_micro_batch_size ({total}); change one of them"
            )
    if not _positive(mini) or not _positive(sp) or not _positive(tp):
        yield (
            f"{prefix}.ppo_mini_batch_size, .ulysses_sequence_parallel_size and the "
            "fsdp_config's tensor_parallel_size must be > 0"
        )
        return
    if batch < mini:
        yield (
            f"data.train_batch_size ({batch}) must be >= {prefix}.ppo_mini_batch_size ({mini}); "
            f"lower {prefix}.ppo_mini_batch_size or raise data.train_batch_size"
        )
    elif batch % mini:
        yield (
            f"data.train_batch_size ({batch}) must be a multiple of {prefix}.ppo_mini_batch_size "
            f"({mini}) so that all mini-batches have the same size; change one of them"
        )
    if gpus % (sp * tp):
        yield (
            f"{prefix}.ulysses_sequence_parallel_size times its fsdp_config.tensor_parallel_size "
            f"({sp * tp}) must divide {_GPUS} ({gpus}); change the model-parallel sizes or the "
            "device count"
        )
        return
    ranks = gpus // (sp * tp)
    per_rank = mini * n // ranks
    how = f"{prefix}.ppo_mini_batch_size * {_N} // ({_GPUS} // model parallel size)"
    if per_rank <= 0:
        yield f"{how} = {mini}*{n}//{ranks} is 0; raise {prefix}.ppo_mini_batch_size to >= {ranks}"
        return
    if mini * n % ranks:
        yield (
            f"{prefix}.ppo_mini_batch_size * {_N} = {mini}*{n} rows do not split evenly over the "
            f"{ranks} data-parallel ranks ({_GPUS} // model parallel size); make it a multiple "
            f"of {ranks}"
        )
        return
    if role.use_dynamic_bsz:  # micro-batches by token budget: the micro-batch keys are unused
        return
    micro_key, micro = f"{prefix}.ppo_micro_batch_size_per_gpu", role.ppo_micro_batch_size_per_gpu
    if micro is None and role.ppo_micro_batch_size is not None:
        micro_key = f"{prefix}.ppo_micro_batch_size // {ranks} ranks"
        micro = role.ppo_micro_batch_size // ranks
    if micro is not None and (micro <= 0 or per_rank % micro):
        yield (
            f"{how} = {per_rank} must be a positive multiple of {micro_key} ({micro}); "
            f"pick a micro-batch size that divides {per_rank}"
        )


def _batches(config: ConfigDict, gpus: int) -> Iterator[str]:
    actor_rollout_ref = config.actor_rollout_ref
    n, batch = actor_rollout_ref.rollout.n, config.data.train_batch_size
    if not _positive(batch) or not _positive(n):
        yield f"data.train_batch_size ({batch}) and {_N} ({n}) must be > 0"
        return
    if not actor_rollout_ref.actor.use_dynamic_bsz and batch * n % gpus:
        yield (
            f"data.train_batch_size * {_N} = {batch}*{n} = {batch * n} must be divisible by "
            f"{_GPUS} = {gpus}; change data.train_batch_size or the device count"
        )
    yield from _updates(config, "actor_rollout_ref.actor", gpus)
    if uses_critic(config):
        yield from _updates(config, "critic", gpus)
    # (section, the role whose mesh runs its pass): the rollout's log-probs are the actor's
    roles = [("actor_rollout_ref.rollout", "actor_rollout_ref.actor")]
    if uses_reference(config):
        roles.append(("actor_rollout_ref.ref", "actor_rollout_ref.ref"))
    for prefix, role in roles:
        if not config[f"{prefix}.log_prob_use_dynamic_bsz"]:
            ranks = _data_ranks(config, role, gpus)
            yield from _one_of(config, prefix, "log_prob_micro_batch_size", ranks)
    if uses_critic(config) and not config.critic.use_dynamic_bsz:
        ranks = _data_ranks(config, "critic", gpus)
        yield from _one_of(config, "critic", "forward_micro_batch_size", ranks)
    if config.reward_model.enable and not config.reward_model.use_dynamic_bsz:
        ranks = _data_ranks(config, "reward_model", gpus)
        yield from _one_of(config, "reward_model", "micro_batch_size", ranks)
    yield from _token_budgets(config)


def _token_budgets(config: ConfigDict) -> Iterator[str]:
    """With dynamic batch sizes, every token budget holds a whole padded sequence: the
    per-device budget times the role's sequence-parallel size, as verl's passes use it."""
    data = config.data
    padded = (
        data.max_prompt_length + data.max_response_length,
        "data.max_prompt_length + data.max_response_length",
    )
    arr = "actor_rollout_ref"
    actor_sp = f"{arr}.actor.ulysses_sequence_parallel_size"
    checks = [
        (f"{arr}.actor.use_dynamic_bsz", f"{arr}.actor.ppo_max_token_len_per_gpu", actor_sp, padded)
    ]
    prefix = f"{arr}.rollout.log_prob_"  # the actor's log-prob pass
    checks.append((f"{prefix}use_dynamic_bsz", f"{prefix}max_token_len_per_gpu", actor_sp, padded))
    if uses_reference(config):
        prefix, ref_sp = f"{arr}.ref.log_prob_", f"{arr}.ref.ulysses_sequence_parallel_size"
        checks.append(
            (f"{prefix}use_dynamic_bsz", f"{prefix}max_token_len_per_gpu", ref_sp, padded)
        )
    if uses_critic(config):
        for key in ("ppo_max_token_len_per_gpu", "forward_max_token_len_per_gpu"):
            sp = "critic.ulysses_sequence_parallel_size"
            checks.append(("critic.use_dynamic_bsz", f"critic.{key}", sp, padded))
    if config.reward_model.enable:
        rm = config.reward_model
        length = (rm.max_length, "reward_model.max_length") if rm.max_length else padded
        sp = "reward_model.ulysses_sequence_parallel_size"
        checks.append(
            (
                "reward_model.use_dynamic_bsz",
                "reward_model.forward_max_token_len_per_gpu",
                sp,
                length,
            )
        )
    for flag, key, sp_key, (needed, source) in checks:
        sp = config[sp_key] or 1
        if config[flag] and not (config[key] is not None and config[key] * sp >= needed):
            times = f" times {sp_key}={sp}" if sp > 1 else ""
            yield (
                f"{key}={config[key]}{times} must be >= the padded sequence length {needed} "
                f"({source}) when {flag}=True; raise {key} to at least {-(-needed // sp)}"
            )


def _devices(config: ConfigDict, num_devices: int | None) -> Iterator[str]:
    gpus, trainer = n_gpus(config), config.trainer
    if gpus <= 0:
        yield f"{_GPUS} = {trainer.nnodes}*{trainer.n_gpus_per_node} must be positive"
    elif num_devices is not None and gpus > num_devices:
        yield (
            f"{_GPUS} = {trainer.nnodes}*{trainer.n_gpus_per_node} = {gpus} devices, but only "
            f"{num_devices} are visible; set trainer.n_gpus_per_node (and trainer.nnodes) to match"
        )


def _checkpoints(config: ConfigDict, sections: list[str]) -> Iterator[str]:
    """Item names of each section's ``checkpoint.save_contents``/``load_contents``, and
    ``trainer.resume_from_path``."""
    for prefix in sections:
        for key in ("save_contents", "load_contents"):
            items = config[f"{prefix}.checkpoint.{key}"]
            items = [items] if isinstance(items, str) else list(items or [])
            unknown = [item for item in items if item not in CHECKPOINT_ITEMS]
            if unknown:
                yield (
                    f"{prefix}.checkpoint.{key}: unknown {unknown}; use items from "
                    f"{', '.join(CHECKPOINT_ITEMS)}"
                )
    trainer = config.trainer
    if trainer.resume_mode == "resume_path" and not trainer.resume_from_path:
        yield (
            "trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N> "
            "(or use trainer.resume_mode=auto)"
        )


def _response_length(config: ConfigDict) -> Iterator[str]:
    """The rollout generates ``rollout.response_length`` tokens (verl), at most the
    ``data.max_response_length`` that the batches and token budgets are sized for."""
    length, most = config.actor_rollout_ref.rollout.response_length, config.data.max_response_length
    if not 1 <= length <= most:
        yield (
            f"actor_rollout_ref.rollout.response_length={length} must be in [1, "
            f"data.max_response_length={most}]; lower it or raise data.max_response_length"
        )


def _lora_reference(config: ConfigDict) -> Iterator[str]:
    """With LoRA the reference is the actor's base model: same weights, so the same mesh."""
    arr = config.actor_rollout_ref
    if not (uses_reference(config) and lora_rank(arr.model) > 0):
        return
    actor_sp, ref_sp = (
        arr.actor.ulysses_sequence_parallel_size,
        arr.ref.ulysses_sequence_parallel_size,
    )
    if ref_sp != actor_sp:
        yield (
            "with actor_rollout_ref.model.lora_rank > 0 the reference shares the actor's weights "
            f"and mesh: set actor_rollout_ref.ref.ulysses_sequence_parallel_size={actor_sp} (the "
            f"actor's), not {ref_sp}"
        )


def _memory_options(model_cfg: ConfigDict, prefix: str) -> Iterator[str]:
    """Activation offload moves what remat keeps, so it needs remat in the same section."""
    remat = model_cfg.get("enable_gradient_checkpointing", False)
    if model_cfg.get("enable_activation_offload", False) and not remat:
        yield (
            f"{prefix}.enable_activation_offload=True needs "
            f"{prefix}.enable_gradient_checkpointing=True: only the layers' rematerialised "
            "inputs are offloaded"
        )


def _optimizers(config: ConfigDict, sections: list[str]) -> Iterator[str]:
    """The optimizers and schedules of the trained roles (`jrl.runspec.optim`)."""
    for prefix in sections:
        yield from optimizer_problems(config[f"{prefix}.optim"], f"{prefix}.optim")


def _kl(config: ConfigDict) -> Iterator[str]:
    """The KL estimators in use (`jrl.algos.kl.KL_ESTIMATORS`, each optionally with a '+'
    suffix) and, with KL in the reward, the controller type."""
    algorithm, actor = config.algorithm, config.actor_rollout_ref.actor
    keys = ["algorithm.kl_penalty"] if algorithm.use_kl_in_reward else []
    keys += ["actor_rollout_ref.actor.kl_loss_type"] if actor.use_kl_loss else []
    estimators = f"{', '.join(KL_ESTIMATORS)} (each optionally with a '+' suffix)"
    for key in keys:
        name = str(config[key]).removesuffix("+")
        if name == "full":
            yield (
                f"{key}={config[key]!r} needs the full distributions over the vocabulary, which "
                f"jrl does not keep (it keeps the sampled tokens' log-probs); use one of "
                f"{estimators}"
            )
        elif name not in KL_ESTIMATORS:
            yield f"{key}={config[key]!r} is not supported; use one of {estimators}"
    if algorithm.use_kl_in_reward and algorithm.kl_ctrl.type not in KL_CONTROLLERS:
        yield _not_one_of("algorithm.kl_ctrl.type", algorithm.kl_ctrl.type, KL_CONTROLLERS)


def _losses(config: ConfigDict) -> Iterator[str]:
    """The actor's ``loss_scale_factor`` (the divisor of seq-mean-token-sum-norm: positive, or
    null for the response length) and the estimator's need of a critic (gae's)."""
    factor = config.actor_rollout_ref.actor.get("loss_scale_factor")
    if factor is not None and not factor > 0:
        yield (
            f"actor_rollout_ref.actor.loss_scale_factor={factor!r} must be positive, or null "
            "for the padded response length"
        )
    if estimator_needs_critic(config) and config.critic.enable is False:
        yield (
            f"algorithm.adv_estimator={config.algorithm.adv_estimator!r} needs the critic's "
            "values, but critic.enable=False: set critic.enable=True (or null) or choose an "
            "estimator without a critic (e.g. grpo)"
        )


def _custom_dataset(config: ConfigDict) -> Iterator[str]:
    """``data.custom_cls``: a path and a class name, both or neither."""
    path, name = config.data.custom_cls.path, config.data.custom_cls.name
    if bool(path) != bool(name):
        missing = "name" if path else "path"
        yield f"data.custom_cls.{missing} is not set; a custom dataset needs both path and name"


def _dtypes(config: ConfigDict) -> Iterator[str]:
    """Dtypes (`jrl.models.dtypes.DTYPES`) of the roles in use and of the rollout."""
    sections = ["actor_rollout_ref.actor.fsdp_config"]
    sections += ["actor_rollout_ref.ref.fsdp_config"] if uses_reference(config) else []
    sections += ["critic.model.fsdp_config"] if uses_critic(config) else []
    sections += ["reward_model.model.fsdp_config"] if config.reward_model.enable else []
    keys = [f"{section}.{name}" for section in sections for name in ("dtype", "model_dtype")]
    for key in [*keys, "actor_rollout_ref.rollout.dtype"]:
        if config[key] not in DTYPES:
            yield _not_one_of(key, config[key], tuple(DTYPES))


def validate(config: ConfigDict, num_devices: int | None = None) -> None:
    """Raise ConfigError listing every broken rule; `num_devices` is the visible device count."""
    sections = ["actor_rollout_ref.actor"] + (["critic"] if uses_critic(config) else [])
    problems = [*_choices(config), *_devices(config, num_devices), *_checkpoints(config, sections)]
    problems += [*unsupported_settings(config), *_optimizers(config, sections)]
    problems += lora_problems(config.actor_rollout_ref.model, "actor_rollout_ref.model")
    problems += _lora_reference(config)
    problems += [*_kl(config), *_losses(config), *reward_manager_problems(config), *_dtypes(config)]
    problems += _custom_dataset(config)
    problems += _response_length(config)
    problems += rollout_correction_problems(config)
    problems += dynamic_sampling_problems(config)
    problems += router_replay_problems(config)
    problems += rollout_problems(config)
    problems += placement_problems(config, num_devices)
    problems += _memory_options(config.actor_rollout_ref.model, "actor_rollout_ref.model")
    if uses_critic(config):
        problems += _memory_options(config.critic.model, "critic.model")
    if n_gpus(config) > 0:
        problems += _batches(config, n_gpus(config))
    if problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))


def _micro_rows(config: ConfigDict, world: int, sequence_parallel: int) -> Iterator[str]:
    """verl's SFT batch rule: the batch splits over the data-parallel ranks (the devices over
    ``ulysses_sequence_parallel_size``) in whole micro-batches of ``micro_batch_size_per_gpu``
    rows (verl's SFT trainer reads no other; only without it does jrl split the deprecated global
    ``micro_batch_size`` over the ranks)."""
    data = config.data
    per_gpu, deprecated = data.micro_batch_size_per_gpu, data.micro_batch_size
    if per_gpu is None and deprecated is None:
        yield "set data.micro_batch_size_per_gpu (rows per device in a micro-batch), e.g. 4"
        return
    ranks = world // sequence_parallel
    micro = per_gpu if per_gpu is not None else deprecated // ranks
    if micro <= 0:
        yield f"the micro-batch size per device must be positive (got {micro})"
        return
    batch = data.train_batch_size
    if batch <= 0 or batch % (ranks * micro):
        over = f" / ulysses_sequence_parallel_size {sequence_parallel}" if ranks < world else ""
        yield (
            f"data.train_batch_size ({batch}) must be a positive multiple of the data-parallel "
            f"ranks (trainer.nnodes * trainer.n_gpus_per_node = {world}{over}) times "
            f"data.micro_batch_size_per_gpu ({micro}) = {ranks * micro}; change one of them"
        )


def _sft_sequence_parallel(config: ConfigDict, world: int) -> Iterator[str]:
    """``ulysses_sequence_parallel_size`` divides the devices and, as verl asserts, runs on
    packed rows (``use_remove_padding``)."""
    size = config.ulysses_sequence_parallel_size
    if size < 1 or world % size:
        yield (
            f"ulysses_sequence_parallel_size ({size}) must divide the devices "
            f"(trainer.nnodes * trainer.n_gpus_per_node = {world})"
        )
    elif size > 1 and not config.use_remove_padding:
        yield (
            f"ulysses_sequence_parallel_size={size} needs use_remove_padding=True (verl splits "
            "packed rows only)"
        )


def _sft_choices(config: ConfigDict) -> Iterator[str]:
    rules = [
        ("data.truncation", SFT_TRUNCATIONS),
        ("model.strategy", SFT_STRATEGIES),
        ("model.fsdp_config.model_dtype", tuple(DTYPES)),
        ("trainer.resume_mode", RESUME_MODES),
    ]
    for key, allowed in rules:
        if config[key] not in allowed:
            yield f"{key}={config[key]!r} is not supported; use one of {', '.join(allowed)}"
    yield from sft_optimizer_problems(config.optim)
    yield from lora_problems(config.model, "model")
    yield from _checkpoints(config, ["trainer"])
    if config.data.max_length < 2:
        yield f"data.max_length ({config.data.max_length}) must be at least 2"
    yield from _memory_options(config.model, "model")


def validate_sft(config: ConfigDict) -> None:
    """Raise ConfigError listing every broken rule of an SFT config (`jrl.config.sft_config`)."""
    trainer = config.trainer
    world = trainer.nnodes * trainer.n_gpus_per_node
    problems = list(_sft_choices(config))
    if world <= 0:
        problems.append(
            f"trainer.nnodes * trainer.n_gpus_per_node = {trainer.nnodes}*"
            f"{trainer.n_gpus_per_node} must be positive"
        )
    else:
        split = list(_sft_sequence_parallel(config, world))
        sequence_parallel = 1 if split else config.ulysses_sequence_parallel_size
        problems += split + list(_micro_rows(config, world, sequence_parallel))
    if problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))
