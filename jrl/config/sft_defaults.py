"""Every key of supervised fine-tuning (``python -m jrl.sft``) with its default: verl's SFT trainer
config, same names and meaning, and the cross-key checks run before anything is built.

Values come from verl's configuration document where it gives one (the ``optim`` and ``model``
sections), otherwise from verl's own SFT defaults. ``model.fsdp_config.dtype`` (compute dtype,
bfloat16 as verl's mixed precision) is jrl's addition, as in the PPO tree.
"""

from __future__ import annotations

from collections.abc import Iterator

from ml_collections import ConfigDict
from ml_collections.config_dict import placeholder

from jrl.config.defaults import data_files, lora_keys, section
from jrl.config.errors import ConfigError
from jrl.config.interpolation import link
from jrl.config.validate import CHECKPOINT_ITEMS, RESUME_MODES

SFT_TRUNCATIONS = ("error", "left", "right")
LR_SCHEDULERS = ("cosine", "wsd")
MODEL_DTYPES = ("fp32", "float32", "bf16", "bfloat16")


def _data() -> ConfigDict:
    return section(
        train_batch_size=256,
        micro_batch_size=placeholder(int),
        micro_batch_size_per_gpu=4,
        **data_files("~/data/gsm8k/train.parquet", "~/data/gsm8k/test.parquet"),
        prompt_key="question",
        response_key="answer",
        prompt_dict_keys=placeholder(list),
        response_dict_keys=placeholder(list),
        multiturn=section(
            enable=False,
            messages_key="messages",
            tools_key="tools",
            enable_thinking_key="enable_thinking",
        ),
        max_length=1024,
        truncation="error",
        balance_dp_token=False,
        chat_template=placeholder(str),
        custom_cls=section(path=placeholder(str), name=placeholder(str)),
        use_shm=False,
        apply_chat_template_kwargs=section(),
        cache_dir="~/.cache/jrl/sft",
    )


def _model() -> ConfigDict:
    return section(
        partial_pretrain="~/models/gemma-1.1-7b-it",
        use_shm=False,
        fsdp_config=section(
            model_dtype="fp32",
            wrap_policy=section(min_num_params=0),
            cpu_offload=False,
            offload_params=False,
            dtype="bfloat16",
        ),
        external_lib=placeholder(str),
        enable_gradient_checkpointing=False,
        trust_remote_code=False,
        **lora_keys(),
        exclude_modules=placeholder(str),
        use_liger=False,
        strategy="fsdp2",
    )


def _optim() -> ConfigDict:
    return section(
        optimizer="AdamW",
        optimizer_impl="torch.optim",
        lr=1e-5,
        betas=[0.9, 0.95],
        weight_decay=0.01,
        lr_warmup_steps_ratio=0.1,
        clip_grad=1.0,
        lr_scheduler="cosine",
        override_optimizer_config=placeholder(dict),
    )


def _trainer() -> ConfigDict:
    return section(
        default_local_dir="checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        default_hdfs_dir=placeholder(str),
        project_name="gsm8k-sft",
        experiment_name="test",
        total_epochs=4,
        total_training_steps=placeholder(int),
        logger=["console", "wandb"],
        seed=1,
        save_freq=-1,
        test_freq=-1,
        nnodes=1,
        n_gpus_per_node=8,
        max_ckpt_to_keep=placeholder(int),
        resume_mode="auto",
        resume_from_path=placeholder(str),
        checkpoint=section(
            save_contents=["model", "optimizer", "extra"],
            load_contents="${.save_contents}",
        ),
        device="cuda",
    )


def sft_config() -> ConfigDict:
    """A fresh, locked config holding every SFT key with its default (interpolations live)."""
    config = section(
        data=_data(),
        model=_model(),
        optim=_optim(),
        ulysses_sequence_parallel_size=1,
        use_remove_padding=False,
        trainer=_trainer(),
    )
    return link(config).lock()


def _micro_rows(config: ConfigDict, world: int) -> Iterator[str]:
    data = config.data
    per_gpu, deprecated = data.micro_batch_size_per_gpu, data.micro_batch_size
    if (per_gpu is None) == (deprecated is None):
        yield (
            "set exactly one of data.micro_batch_size_per_gpu and data.micro_batch_size "
            "(deprecated, global); e.g. data.micro_batch_size_per_gpu=4 data.micro_batch_size=null"
        )
        return
    micro = per_gpu if per_gpu is not None else deprecated // world
    if micro <= 0:
        yield f"the micro-batch size per device must be positive (got {micro})"
        return
    batch = data.train_batch_size
    if batch <= 0 or batch % (world * micro):
        yield (
            f"data.train_batch_size ({batch}) must be a positive multiple of the devices "
            f"(trainer.nnodes * trainer.n_gpus_per_node = {world}) times "
            f"data.micro_batch_size_per_gpu ({micro}) = {world * micro}; change one of them"
        )


def _choices(config: ConfigDict) -> Iterator[str]:
    rules = [
        ("data.truncation", SFT_TRUNCATIONS),
        ("optim.lr_scheduler", LR_SCHEDULERS),
        ("model.fsdp_config.model_dtype", MODEL_DTYPES),
        ("trainer.resume_mode", RESUME_MODES),
    ]
    for key, allowed in rules:
        if config[key] not in allowed:
            yield f"{key}={config[key]!r} is not supported; use one of {', '.join(allowed)}"
    for key in ("save_contents", "load_contents"):
        items = config.trainer.checkpoint[key]
        items = [items] if isinstance(items, str) else list(items or [])
        unknown = [item for item in items if item not in CHECKPOINT_ITEMS]
        if unknown:
            yield (
                f"trainer.checkpoint.{key}: unknown {unknown}; use items from "
                f"{', '.join(CHECKPOINT_ITEMS)}"
            )
    if config.trainer.resume_mode == "resume_path" and not config.trainer.resume_from_path:
        yield (
            "trainer.resume_mode=resume_path needs trainer.resume_from_path=<.../global_step_N> "
            "(or use trainer.resume_mode=auto)"
        )
    if config.data.max_length < 2:
        yield f"data.max_length ({config.data.max_length}) must be at least 2"


def validate_sft(config: ConfigDict) -> None:
    """Raise ConfigError listing every broken rule."""
    trainer = config.trainer
    world = trainer.nnodes * trainer.n_gpus_per_node
    problems = list(_choices(config))
    if world <= 0:
        problems.append(
            f"trainer.nnodes * trainer.n_gpus_per_node = {trainer.nnodes}*"
            f"{trainer.n_gpus_per_node} must be positive"
        )
    else:
        problems += _micro_rows(config, world)
    if problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))
