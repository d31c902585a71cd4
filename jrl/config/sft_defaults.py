"""Every key of supervised fine-tuning (``python -m jrl.sft``) with its default: verl's SFT trainer
config, same names and meaning, and the cross-key checks run before anything is built.

Values come from verl's configuration document where it gives one (the ``optim`` and ``model``
sections), otherwise from verl's own SFT defaults. ``model.fsdp_config.dtype`` (compute dtype,
bfloat16 as verl's mixed precision) is jrl's addition, as in the PPO tree.
"""

from __future__ import annotations

from ml_collections import ConfigDict
from ml_collections.config_dict import placeholder

from jrl.config.defaults import data_files, lora_keys, section
from jrl.config.interpolation import link


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
        warmup_steps_ratio=placeholder(float),  # verl v0.6.0's name of lr_warmup_steps_ratio
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
    return link(sft_templates()).lock()


def sft_templates() -> ConfigDict:
    """Every SFT key with its default, interpolations still as their ``${...}`` template strings."""
    return section(
        data=_data(),
        model=_model(),
        optim=_optim(),
        ulysses_sequence_parallel_size=1,
        use_remove_padding=False,
        trainer=_trainer(),
    )
