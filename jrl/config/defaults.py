"""Every configuration key with its default: verl's PPO trainer config, same names and meaning.

Values come from verl's configuration document where it gives one, otherwise from verl's own
defaults. A null default still has a type (`placeholder(int)`), so a wrong override fails.
`${...}` strings follow other keys (see `jrl.config.interpolation`).

The key tree of the configuration document, section by section in the document's order, so
that it can be read against it; the rollout section (`jrl.config.rollout_defaults`), verl's
profilers (`jrl.config.profilers`) and Megatron's sections (`jrl.config.megatron`) live beside it.
"""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict, FieldReference
from ml_collections.config_dict import placeholder

from jrl.config.interpolation import link
from jrl.config.megatron import megatron_section
from jrl.config.profilers import global_profiler, role_profiler, tool_free_profiler
from jrl.config.rollout_defaults import log_prob_keys, rollout_section
from jrl.config.tree import ACTOR, MODEL, REF, section


def either(default: Any, *types: type) -> FieldReference:
    """A key that accepts any of `types` (e.g. one file or a list of files)."""
    return FieldReference(default, field_type=types)


def data_files(train: str, val: str) -> dict[str, Any]:
    """The `data` keys naming the train and validation files (one or a list) and capping their
    rows (-1: all)."""
    return dict(
        train_files=either(train, str, list),
        val_files=either(val, str, list),
        train_max_samples=-1,
        val_max_samples=-1,
    )


def lora_keys() -> dict[str, Any]:
    """The LoRA keys of a `model` section: rank (0: no LoRA), alpha and the adapted modules."""
    return dict(lora_rank=0, lora_alpha=16, target_modules=either("all-linear", str, list))


def custom_reward_function() -> ConfigDict:
    """The `custom_reward_function` section: a scoring function loaded from a file, and (jrl's
    keys) how it is contained: seconds per call, worker processes, what a fault does."""
    return section(
        path=placeholder(str),
        name="compute_score",
        reward_kwargs=section(),
        timeout=60.0,
        num_workers=placeholder(int),
        on_error="zero",
    )


def ray_kwargs() -> ConfigDict:
    """The `ray_kwargs` section (verl's Ray options; ``runtime_env.py_executable`` is current
    verl's, which its example scripts set)."""
    return section(
        ray_init=section(
            num_cpus=placeholder(int), runtime_env=section(py_executable=placeholder(str))
        ),
        timeline_json_file=placeholder(str),
    )


def _data() -> ConfigDict:
    return section(
        tokenizer=placeholder(str),
        use_shm=False,
        **data_files("~/data/rlhf/gsm8k/train.parquet", "~/data/rlhf/gsm8k/test.parquet"),
        prompt_key="prompt",
        reward_fn_key="data_source",
        max_prompt_length=512,
        max_response_length=512,
        train_batch_size=1024,
        gen_batch_size=placeholder(int),
        val_batch_size=placeholder(int),
        tool_config_path=placeholder(str),
        return_raw_input_ids=False,
        return_raw_chat=False,
        return_full_prompt=False,
        shuffle=True,
        seed=42,
        dataloader_num_workers=8,
        image_patch_size=14,
        validation_shuffle=False,
        filter_overlong_prompts=False,
        filter_overlong_prompts_workers=1,
        truncation="error",
        image_key="images",
        video_key="videos",
        trust_remote_code=True,
        custom_cls=section(path=placeholder(str), name=placeholder(str)),
        return_multi_modal_inputs=True,
        sampler=section(class_path=placeholder(str), class_name=placeholder(str)),
        datagen=section(path=placeholder(str), name=placeholder(str)),
        apply_chat_template_kwargs=section(),
        cache_dir="~/.cache/jrl/rlhf",
    )


def _model() -> ConfigDict:
    return section(
        path="~/models/deepseek-llm-7b-chat",
        hf_config_path=placeholder(str),
        tokenizer_path=placeholder(str),
        use_shm=False,
        external_lib=placeholder(str),
        override_config=section(
            attn_implementation="flash_attention_2",
            model_config=section(),
            moe_config=section(freeze_moe_router=False),
        ),
        enable_gradient_checkpointing=False,
        enable_activation_offload=False,
        trust_remote_code=False,
        use_remove_padding=False,
        custom_chat_template=placeholder(str),
        **lora_keys(),
        exclude_modules=placeholder(str),
        lora_adapter_path=placeholder(str),
        use_liger=False,
        use_fused_kernels=False,
        fused_kernel_options=section(impl_backend="torch"),
        tiled_mlp=section(enabled=False, num_shards=4),
        mtp=section(enable=False),
    )


def _optim(lr: float) -> ConfigDict:
    return section(
        optimizer="AdamW",
        optimizer_impl="torch.optim",
        lr=lr,
        lr_warmup_steps=-1,
        lr_warmup_steps_ratio=0.0,
        min_lr_ratio=0.0,
        num_cycles=0.5,
        lr_scheduler_type="constant",
        total_training_steps=-1,
        weight_decay=0.01,
        betas=[0.9, 0.999],
        clip_grad=1.0,
        warmup_style=placeholder(str),
        override_optimizer_config=placeholder(dict),
    )


def _fsdp(role: str, **changes: Any) -> ConfigDict:
    """The ``fsdp_config`` of the role whose section (with its ``megatron``) is at `role`."""
    fields = dict(
        wrap_policy=section(min_num_params=0),
        param_offload=False,
        optimizer_offload=False,
        offload_policy=False,
        reshard_after_forward=True,
        fsdp_size=-1,
        # jrl's own: devices that split each parameter tensor-parallel (the mesh's `tensor`
        # axis, `jrl.parallel.TRAINING_RULES`: heads, MLP and vocabulary); 1 turns it off. It
        # follows Megatron's tensor parallel size, which means the same (`jrl.config.megatron`).
        tensor_parallel_size=f"${{{role}.megatron.tensor_model_parallel_size}}",
        # jrl's own, verl's engines' name: devices that split a mixture of experts' experts (the
        # mesh's `data` axis, `jrl.models.moe.parallel_experts`); it follows Megatron's expert
        # model parallel size.
        expert_parallel_size=f"${{{role}.megatron.expert_model_parallel_size}}",
        forward_prefetch=False,
        model_dtype="fp32",
        use_orig_params=False,
        seed=42,
        full_determinism=False,
        ulysses_sequence_parallel_size=1,
        entropy_from_logits_with_chunking=False,
        use_torch_compile=True,
        entropy_checkpointing=False,
        forward_only=False,
        strategy="fsdp",
        dtype="bfloat16",
    )
    return section(**{**fields, **changes})


def _checkpoint(**current: Any) -> ConfigDict:
    """A role's `checkpoint` section; `current`: current verl's keys of that role's."""
    return section(
        save_contents=["model", "optimizer", "extra"],
        load_contents="${.save_contents}",
        async_save=False,
        **current,
    )


def _router_replay(mode: str = "disabled") -> ConfigDict:
    return section(mode=mode, record_file=placeholder(str), replay_file=placeholder(str))


def _rollout_is_keys() -> dict[str, Any]:
    """The rollout importance-sampling keys of `actor` and `algorithm` (off by default)."""
    return dict(
        rollout_is=False,
        rollout_is_threshold=placeholder(float),
        rollout_is_threshold_lower=placeholder(float),
        rollout_is_level="token",
        rollout_is_mode="truncate",
        rollout_is_veto_threshold=placeholder(float),
    )


def _actor() -> ConfigDict:
    return section(
        strategy="fsdp",
        rollout_n="${actor_rollout_ref.rollout.n}",
        ppo_mini_batch_size=256,
        ppo_micro_batch_size=placeholder(int),
        ppo_micro_batch_size_per_gpu=8,
        use_dynamic_bsz=False,
        ppo_max_token_len_per_gpu=16384,
        use_rollout_log_probs=False,  # current verl's (its fully-async recipe sets it)
        grad_clip=1.0,
        clip_ratio=0.2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        clip_ratio_c=3.0,
        tau_pos=1.0,
        tau_neg=1.05,
        freeze_vision_tower=False,
        policy_loss=section(
            loss_mode="vanilla",
            clip_cov_ratio=0.0002,
            clip_cov_lb=1.0,
            clip_cov_ub=5.0,
            kl_cov_ratio=0.0002,
            ppo_kl_coef=0.1,
        ),
        loss_agg_mode="token-mean",
        loss_scale_factor=placeholder(float),
        entropy_coeff=0.0,
        calculate_entropy=False,
        use_kl_loss=False,
        use_prefix_grouper=False,
        **_rollout_is_keys(),
        use_torch_compile=True,
        kl_loss_coef=0.001,
        kl_loss_type="low_var_kl",
        ppo_epochs=1,
        data_loader_seed=placeholder(int),
        shuffle=False,
        ulysses_sequence_parallel_size=1,
        optim=_optim(lr=1e-6),
        fsdp_config=_fsdp(ACTOR),
        megatron=megatron_section(ACTOR),
        checkpoint=_checkpoint(strict=True),
        use_fused_kernels=f"${{{MODEL}.use_fused_kernels}}",
        # current verl spells the mode under its engine (megatron.router_replay.mode) too
        router_replay=_router_replay(mode=f"${{{ACTOR}.megatron.router_replay.mode}}"),
        profiler=role_profiler(),
        entropy_from_logits_with_chunking=False,
        entropy_checkpointing=False,
        use_remove_padding=f"${{{MODEL}.use_remove_padding}}",
        calculate_sum_pi_squared=False,
        sum_pi_squared_checkpointing=False,
    )


def _ref() -> ConfigDict:
    return section(
        strategy=f"${{{ACTOR}.strategy}}",
        rollout_n="${actor_rollout_ref.rollout.n}",
        use_torch_compile=f"${{{ACTOR}.use_torch_compile}}",
        fsdp_config=_fsdp(REF, forward_only=True),
        megatron=megatron_section(REF),
        **log_prob_keys(),
        ulysses_sequence_parallel_size=f"${{{ACTOR}.ulysses_sequence_parallel_size}}",
        entropy_from_logits_with_chunking=False,
        entropy_checkpointing=False,
        router_replay=_router_replay(),
        profiler=role_profiler(),
        model=placeholder(dict),
    )


def _critic() -> ConfigDict:
    return section(
        enable=placeholder(bool),
        strategy="fsdp",
        rollout_n="${actor_rollout_ref.rollout.n}",
        optim=_optim(lr=1e-5),
        model=section(
            path=f"${{{MODEL}.path}}",
            tokenizer_path=f"${{{MODEL}.path}}",
            override_config=section(),
            external_lib=f"${{{MODEL}.external_lib}}",
            trust_remote_code=f"${{{MODEL}.trust_remote_code}}",
            use_shm=False,
            enable_gradient_checkpointing=True,
            enable_activation_offload=False,
            use_remove_padding=False,
            **lora_keys(),
            tiled_mlp=section(enabled=False, num_shards=4),
            fsdp_config=_fsdp("critic"),
        ),
        megatron=megatron_section("critic"),
        ppo_mini_batch_size=f"${{{ACTOR}.ppo_mini_batch_size}}",
        ppo_micro_batch_size=placeholder(int),
        ppo_micro_batch_size_per_gpu=placeholder(int),
        use_dynamic_bsz=f"${{{ACTOR}.use_dynamic_bsz}}",
        ppo_max_token_len_per_gpu=32768,
        forward_max_token_len_per_gpu="${.ppo_max_token_len_per_gpu}",
        ppo_epochs=f"${{{ACTOR}.ppo_epochs}}",
        shuffle=f"${{{ACTOR}.shuffle}}",
        data_loader_seed=42,
        cliprange_value=0.5,
        loss_agg_mode=f"${{{ACTOR}.loss_agg_mode}}",
        forward_micro_batch_size="${.ppo_micro_batch_size}",
        forward_micro_batch_size_per_gpu="${.ppo_micro_batch_size_per_gpu}",
        ulysses_sequence_parallel_size=1,
        grad_clip=1.0,
        checkpoint=_checkpoint(),
        profiler=role_profiler(),
    )


def _reward_model() -> ConfigDict:
    return section(
        enable=False,
        enable_resource_pool=False,
        n_gpus_per_node=8,
        nnodes=0,
        strategy="fsdp",
        profiler=tool_free_profiler(False, False, []),
        model=section(
            input_tokenizer=f"${{{MODEL}.path}}",
            path="~/models/Anomy-RM-v0.1",
            external_lib=f"${{{MODEL}.external_lib}}",
            trust_remote_code=False,
            override_config=section(),
            use_shm=False,
            use_remove_padding=False,
            use_fused_kernels=f"${{{MODEL}.use_fused_kernels}}",
            fsdp_config=_fsdp("reward_model", min_num_params=0, forward_only=True),
        ),
        megatron=megatron_section("reward_model"),
        micro_batch_size=placeholder(int),
        micro_batch_size_per_gpu=16,
        max_length=placeholder(int),
        use_dynamic_bsz="${critic.use_dynamic_bsz}",
        forward_max_token_len_per_gpu="${critic.forward_max_token_len_per_gpu}",
        reward_manager="naive",
        overlong_buffer=section(enable=False, len=0, penalty_factor=1.0, log=False),
        reward_loop_source="register",
        reward_loop_module_path=placeholder(str),
        reward_loop_class_name=placeholder(str),
        launch_reward_fn_async=False,
        sandbox_fusion=section(url=placeholder(str), max_concurrent=64, memory_limit_mb=1024),
        ulysses_sequence_parallel_size=1,
        use_reward_loop=True,
        num_workers=1,
        rollout=section(
            name="${actor_rollout_ref.rollout.name}",
            dtype="bfloat16",
            gpu_memory_utilization=0.5,
            tensor_model_parallel_size=2,
            prompt_length=2048,
            response_length=2048,
        ),
        reward_kwargs=section(),
    )


def _algorithm() -> ConfigDict:
    return section(
        gamma=1.0,
        lam=1.0,
        adv_estimator="gae",
        norm_adv_by_std_in_grpo=True,
        use_kl_in_reward=False,
        kl_penalty="kl",
        kl_ctrl=section(type="fixed", kl_coef=0.005, horizon=10000, target_kl=0.1),
        use_pf_ppo=False,
        pf_ppo=section(reweight_method="pow", weight_pow=2.0),
        **_rollout_is_keys(),
        rollout_correction=section(
            rollout_is=placeholder(str),
            rollout_is_threshold=either(2.0, float, str),  # current verl: also "lower_upper"
            rollout_is_batch_normalize=False,
            rollout_rs=placeholder(str),
            rollout_rs_threshold=placeholder((float, str)),
            bypass_mode=False,
            loss_type="ppo_clip",
        ),
        filter_groups=section(
            enable=False,
            metric=placeholder(str),
            max_num_gen_batches=0,
            max_inflight_gen_batches=1,  # current verl's: generation batches pending at once
        ),
    )


def _trainer() -> ConfigDict:
    return section(
        balance_batch=True,
        total_epochs=30,
        total_training_steps=placeholder(int),
        project_name="verl_examples",
        experiment_name="gsm8k",
        logger=["console", "wandb"],
        log_val_generations=0,
        rollout_data_dir=placeholder(str),
        validation_data_dir=placeholder(str),
        nnodes=1,
        n_gpus_per_node=8,
        save_freq=-1,
        esi_redundant_time=0,
        resume_mode="auto",
        resume_from_path=placeholder(str),
        val_before_train=True,
        val_only=False,
        test_freq=2,
        critic_warmup=0,
        default_hdfs_dir=placeholder(str),
        remove_previous_ckpt_in_save=False,
        del_local_ckpt_after_load=False,
        default_local_dir="checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        max_actor_ckpt_to_keep=placeholder(int),
        max_critic_ckpt_to_keep=placeholder(int),
        ray_wait_register_center_timeout=300,
        device="cuda",
        use_legacy_worker_impl="auto",
    )


def default_config() -> ConfigDict:
    """A fresh, locked config holding every key with its default (interpolations live)."""
    return link(default_templates()).lock()


def default_templates() -> ConfigDict:
    """Every key with its default, interpolations still as their ``${...}`` template strings."""
    return section(
        data=_data(),
        actor_rollout_ref=section(
            hybrid_engine=True,
            nccl_timeout=600,
            model=_model(),
            actor=_actor(),
            ref=_ref(),
            rollout=rollout_section(),
        ),
        critic=_critic(),
        # verl's one-step-off and fully-async recipes: the rollout's own devices per host and
        # the fully-async trainer's options (read with actor_rollout_ref.hybrid_engine=False).
        rollout=section(
            nnodes=1, n_gpus_per_node=8, total_rollout_steps=placeholder(int), test_freq=-1
        ),
        async_training=section(
            mode="one_step_off",  # jrl's own (verl picks its recipe by program): or fully_async
            staleness_threshold=0.1,
            trigger_parameter_sync_step=4,
            require_batches=1,
            partial_rollout=True,
            use_trainer_do_validate=False,
        ),
        reward_model=_reward_model(),
        reward_manager=section(
            source="register",
            name="${reward_model.reward_manager}",
            module=section(path=placeholder(str), name="custom_reward_manager"),
        ),
        custom_reward_function=custom_reward_function(),
        algorithm=_algorithm(),
        trainer=_trainer(),
        global_profiler=global_profiler(),
        transfer_queue=section(enable=False),
        ray_kwargs=ray_kwargs(),
    )
