"""The rules behind the no-effect notice (`jrl.runspec.no_effect.NO_EFFECT`): the `NoEffect`
entry type, the reasons, the predicates that say when an entry applies to a run (the config and
the rollout engine that generates), and the entries built from the mechanisms' own tables
(LoRA options, optimizer schedules, policy-loss and estimator options, token budgets)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import jax
from ml_collections import ConfigDict

from jrl.algos.estimator import ADV_ESTIMATORS
from jrl.algos.estimator import OPTIONS as ESTIMATOR_OPTIONS
from jrl.algos.policy_loss import OPTIONS as LOSS_OPTIONS
from jrl.algos.policy_loss import POLICY_LOSS_TERMS
from jrl.config.defaults import default_config
from jrl.config.moved import follows, key_matches
from jrl.models.decoder import OFFLOAD_BACKENDS
from jrl.rollout.engines import Engine
from jrl.rollout.limits import free_device_bytes
from jrl.runspec.algorithm import ACTOR_LOSS_KEYS, POLICY_LOSS_KEYS
from jrl.runspec.models import LORA_OPTIONS, lora_rank
from jrl.runspec.optim import scheduler_kind, warmup_steps
from jrl.runspec.reward import manager_name

ROLLOUT = "actor_rollout_ref.rollout"
ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"

Applies = Callable[[ConfigDict, str], bool]  # (config, generating engine) -> the entry applies


def always(config: ConfigDict, engine: str) -> bool:
    return True


def jax_sampler(config: ConfigDict, engine: str) -> bool:
    return engine == "jax"


def not_generating(engine: Engine) -> Applies:
    """Applies while another engine than `engine` generates (`jrl.rollout.engines.serving`)."""
    return lambda config, generating: generating != engine.name


def off(key: str) -> Applies:
    """Applies while the bool `key` is off."""
    return lambda config, engine: not config[key]


@dataclasses.dataclass(frozen=True)
class NoEffect:
    """Keys matching `pattern` (dotted, ``*`` matches any part) but not listed in `unless` have
    no effect, for `reason`, in a run whose config and generating rollout `engine` (jax or vllm,
    `jrl.rollout.build.serving_engine`) `applies` to (`given_only`: see `no_effect_reason`)."""

    pattern: str
    reason: str
    applies: Applies = always
    unless: tuple[str, ...] = ()
    given_only: bool = False

    def matches(self, key: str, config: ConfigDict, engine: str) -> bool:
        named = key_matches(self.pattern, key) and key not in self.unless
        return named and self.applies(config, engine)


TORCH_BACKEND = "a torch training backend: jrl trains with JAX on its own mesh"
TORCH_COMPILE = "torch.compile: XLA compiles every jrl program"
FSDP = "torch FSDP's scheduling: jrl shards every parameter by its logical axes with XLA"
ENTROPY = "torch's entropy memory options: jrl's log-prob/entropy kernel follows use_fused_kernels"
MOE = "jrl has no mixture-of-experts model family"
TEXT_ONLY = "multi-modal inputs: jrl's model families are text-only"
SHM = "copying files to /dev/shm first: jrl reads them where they are"
WEIGHT_TRANSFER = "verl's weight transfer between Ray workers: jrl hands weights over in process"
RAY = "Ray's placement: jrl runs every role in one process per host, on the trainer's devices"
REWARD_LOOP = "verl's asynchronous reward workers: jrl scores in process (the same scores)"
NO_CRITIC = (
    "no critic in this run (critic.enable, or an estimator that reads the critic's values such "
    "as gae, starts one)"
)
NO_REFERENCE = "no reference model in this run (actor.use_kl_loss or algorithm.use_kl_in_reward)"
NO_REWARD_MODEL = "reward_model.enable is False"
STATIC_BATCHES = "token budgets apply with dynamic batch sizes only"
ADAMW = "verl 0.6.0's FSDP roles build AdamW whatever optim.optimizer names, and so does jrl"
OWN_DECODER = (
    "jrl builds its own decoder from config.json, so no repository code runs (the tokenizer "
    "follows data.trust_remote_code)"
)
MEGATRON = (
    "a Megatron-Core engine option: jrl trains with JAX (of the megatron keys, "
    "tensor_model_parallel_size acts, as the role's fsdp_config.tensor_parallel_size)"
)
RM_MODEL_KEYS = (
    "model.*",
    "megatron.*",
    "micro_batch_size*",
    "max_length",
    "use_dynamic_bsz",
    "forward_max_token_len_per_gpu",
    "ulysses_sequence_parallel_size",
)


def not_dapo(config: ConfigDict, engine: str) -> bool:
    return manager_name(config)[1] != "dapo"


def lora_on(model: str) -> Applies:
    return lambda config, engine: lora_rank(config[model]) > 0


def lora_off(model: str) -> Applies:
    on = lora_on(model)
    return lambda config, engine: not on(config, engine)


def no_custom_reward_manager(config: ConfigDict, engine: str) -> bool:
    """No reward manager of the user's (``reward_manager.source=importlib``), which is handed
    the whole batch, in this run."""
    return config.reward_manager.source != "importlib"


def raw_chat_unread(config: ConfigDict, engine: str) -> bool:
    """Neither a reward model that re-templates the prompt's messages (``input_tokenizer``)
    nor a custom reward manager reads ``raw_prompt``."""
    rm = config.reward_model
    retemplates = rm.enable and rm.model.get("input_tokenizer") is not None
    return no_custom_reward_manager(config, engine) and not retemplates


UNREAD_FIELD = "the batch carries it, but only a custom reward manager (importlib) would read it"


def policy_loss_ignores(option: str) -> Applies:
    """Applies while the run's policy loss does not read `option` (its descriptor says; one that
    follows verl's calling convention may read any). Bypass mode's loss needs loss_mode vanilla
    and reads what vanilla reads."""

    def applies(config: ConfigDict, engine: str) -> bool:
        loss = POLICY_LOSS_TERMS.find(config[f"{ACTOR}.policy_loss.loss_mode"])
        return loss is not None and not loss.reads(option)

    return applies


def estimator_ignores(option: str) -> Applies:
    """Applies while the run's advantage estimator does not read ``algorithm.<option>`` (its
    descriptor says; one registered with verl's plain decorator may read any)."""

    def applies(config: ConfigDict, engine: str) -> bool:
        estimator = ADV_ESTIMATORS.find(config.algorithm.adv_estimator)
        return estimator is not None and not estimator.reads(option)

    return applies


def estimator_entries() -> tuple[NoEffect, ...]:
    """The estimators' options (`EstimatorOptions`) while the run's estimator ignores them."""
    entries = []
    for option in ESTIMATOR_OPTIONS:
        readers = [n for n in ADV_ESTIMATORS.names() if ADV_ESTIMATORS.get(n).reads(option)]
        reason = f"the advantage estimator ignores it: only {', '.join(readers)} read it"
        entries.append(NoEffect(f"algorithm.{option}", reason, estimator_ignores(option)))
    return tuple(entries)


def constant_schedule(role: str) -> Applies:
    """Applies while `role`'s learning rate is constant (`scheduler_kind`)."""
    return lambda config, engine: scheduler_kind(config[f"{role}.optim"]) == "constant"


def warmup_steps_given(role: str) -> Applies:
    """Applies while `role`'s ``lr_warmup_steps`` sets the warm-up (`warmup_steps`)."""
    return lambda config, engine: warmup_steps(config[f"{role}.optim"]) is not None


def greedy_validation(config: ConfigDict, engine: str) -> bool:
    val = config[f"{ROLLOUT}.val_kwargs"]
    return not val.do_sample or val.temperature == 0


def no_host_offload(config: ConfigDict, engine: str) -> bool:
    """Applies where the backend has no device memory apart from the host's (the decoder's
    rule, `jrl.models.decoder.OFFLOAD_BACKENDS`: CPU)."""
    return jax.default_backend() not in OFFLOAD_BACKENDS


def no_memory_report(config: ConfigDict, engine: str) -> bool:
    """Applies where the JAX sampler generates and the device reports no memory to take a share
    of (the sampler's rule, `jrl.rollout.limits.free_device_bytes`: CPU)."""
    return engine == "jax" and free_device_bytes(jax.local_devices()[0]) is None


def local_data(config: ConfigDict, engine: str) -> bool:
    """Applies while every data file is a local path (or ``file://``)."""
    files = [config.data.train_files, config.data.val_files]
    paths = [f for group in files for f in ([group] if isinstance(group, str) else group or [])]
    return all("://" not in p or p.startswith("file://") for p in paths)


NAMED_LOGGERS = ("wandb", "mlflow", "swanlab")


def unnamed_run(config: ConfigDict, engine: str) -> bool:
    """Applies while no logger names the run and the checkpoint folder does not follow the
    project and experiment names (`follows`: it was set apart from them)."""
    loggers = config.trainer.logger
    named = set([loggers] if isinstance(loggers, str) else loggers) & set(NAMED_LOGGERS)
    return not named and not follows(config, "trainer.default_local_dir")


def tokenizer_without_code(config: ConfigDict, engine: str) -> bool:
    """Applies while the actor's tokenizer is a local folder whose tokenizer_config.json names
    no code of its own (no ``auto_map``): remote code is never asked for."""
    model = config.actor_rollout_ref.model
    folder = Path(str(model.get("tokenizer_path") or model.path)).expanduser()
    settings = folder / "tokenizer_config.json"
    return settings.is_file() and "auto_map" not in json.loads(settings.read_text())


def single_process(config: ConfigDict, engine: str) -> bool:
    return jax.process_count() == 1


def lora_entries() -> tuple[NoEffect, ...]:
    """The LoRA options (`LORA_OPTIONS`) of each model section that has them, while its
    ``lora_rank`` is 0."""
    defaults = default_config()
    return tuple(
        NoEffect(f"{model}.{key}", f"{model}.lora_rank is 0", lora_off(model))
        for model in ("actor_rollout_ref.model", "critic.model")
        for key in LORA_OPTIONS
        if key in defaults[model]
    )


def optim_entries() -> tuple[NoEffect, ...]:
    """The cosine schedule's options under a constant one, the warm-up ratio when a step count
    is given (verl's rule: lr_warmup_steps >= 0 wins), and the optimizer's name (verl 0.6.0's
    FSDP roles build torch's AdamW whatever it says; jrl's Adam is that AdamW too)."""
    entries = []
    for role in (ACTOR, "critic"):
        for key in ("min_lr_ratio", "num_cycles"):
            reason = "the learning rate is constant: min_lr_ratio and num_cycles shape cosine's"
            entries.append(NoEffect(f"{role}.optim.{key}", reason, constant_schedule(role)))
        entries.append(
            NoEffect(
                f"{role}.optim.lr_warmup_steps_ratio",
                f"{role}.optim.lr_warmup_steps >= 0 sets the warm-up instead",
                warmup_steps_given(role),
            )
        )
        entries.append(NoEffect(f"{role}.optim.optimizer", ADAMW))
    return tuple(entries)


def loss_entries() -> tuple[NoEffect, ...]:
    """Options of choices the run did not make: of policy losses other than the run's, of
    sampled validation, of the rollout's log-probs, of batch fields for a reward model or
    manager the run does not have, of validating before training."""
    entries = [
        NoEffect(
            f"{ACTOR}.clip_ratio",
            "actor.clip_ratio_low and clip_ratio_high are both set: clip_ratio is their fallback",
            lambda config, engine: (
                config[f"{ACTOR}.clip_ratio_low"] is not None
                and config[f"{ACTOR}.clip_ratio_high"] is not None
            ),
        ),
        NoEffect(
            f"{ROLLOUT}.val_kwargs.top_*",
            "validation is greedy: val_kwargs.do_sample is False or val_kwargs.temperature is 0",
            greedy_validation,
        ),
        NoEffect(
            f"{ROLLOUT}.val_kwargs.temperature",
            "val_kwargs.do_sample is False (greedy validation)",
            lambda config, engine: not config[f"{ROLLOUT}.val_kwargs.do_sample"],
        ),
        NoEffect(
            f"{ROLLOUT}.val_kwargs.do_sample",
            "val_kwargs.temperature is 0: validation is greedy either way",
            lambda config, engine: config[f"{ROLLOUT}.val_kwargs.temperature"] == 0,
        ),
        NoEffect(
            f"{ROLLOUT}.logprobs_mode",
            "the rollout returns no log-probs (rollout.calculate_log_probs is False)",
            off(f"{ROLLOUT}.calculate_log_probs"),
        ),
        NoEffect("data.return_raw_input_ids", UNREAD_FIELD, no_custom_reward_manager),
        NoEffect("data.return_full_prompt", UNREAD_FIELD, no_custom_reward_manager),
        NoEffect(
            "data.return_raw_chat",
            "only a reward model with input_tokenizer, or a custom reward manager, reads the "
            "prompt's messages",
            raw_chat_unread,
        ),
        NoEffect(
            "trainer.val_only",
            "trainer.val_before_train is False (val_only stops after that validation)",
            off("trainer.val_before_train"),
        ),
    ]
    losses = [POLICY_LOSS_TERMS.get(name) for name in POLICY_LOSS_TERMS.names()]
    for section, keys in ((ACTOR, ACTOR_LOSS_KEYS), (f"{ACTOR}.policy_loss", POLICY_LOSS_KEYS)):
        for key in (key for key in keys if key in LOSS_OPTIONS):
            readers = [loss.name for loss in losses if loss.reads(key)]
            reason = f"the policy loss ignores it: only {', '.join(readers)} read it"
            entries.append(NoEffect(f"{section}.{key}", reason, policy_loss_ignores(key)))
    return tuple(entries)


def token_budgets() -> tuple[NoEffect, ...]:
    """Each role's token budget, which only dynamic batch sizes use."""
    budgets = {
        f"{ACTOR}.ppo_max_token_len_per_gpu": f"{ACTOR}.use_dynamic_bsz",
        f"{REF}.log_prob_max_token_len_per_gpu": f"{REF}.log_prob_use_dynamic_bsz",
        f"{ROLLOUT}.log_prob_max_token_len_per_gpu": f"{ROLLOUT}.log_prob_use_dynamic_bsz",
        "critic.ppo_max_token_len_per_gpu": "critic.use_dynamic_bsz",
        "critic.forward_max_token_len_per_gpu": "critic.use_dynamic_bsz",
        "reward_model.forward_max_token_len_per_gpu": "reward_model.use_dynamic_bsz",
    }
    return tuple(NoEffect(key, STATIC_BATCHES, off(switch)) for key, switch in budgets.items())
