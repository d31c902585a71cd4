"""Every configuration key with its default: verl's PPO trainer config, same names and meaning.

Values come from verl's configuration document where it gives one, otherwise from verl's own
defaults. A null default still has a type (`placeholder(int)`), so a wrong override fails.
`${...}` strings follow other keys (see `jrl.config.interpolation`).

It is one long module on purpose: the whole key tree of the configuration document in one
place, section by section in the document's order, so that it can be read against it.
"""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict, FieldReference
from ml_collections.config_dict import placeholder

from jrl.config.interpolation import link
from jrl.config.megatron import megatron_section
from jrl.config.tree import section

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
MODEL = "actor_rollout_ref.model"


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
    """The `custom_reward_function` section: a scoring function loaded from a file."""
    return section(path=placeholder(str), name="compute_score", reward_kwargs=section())


def ray_kwargs() -> ConfigDict:
    """The `ray_kwargs` section (verl's Ray options)."""
    return section(ray_init=section(num_cpus=placeholder(int)), timeline_json_file=placeholder(str))


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


def _checkpoint() -> ConfigDict:
    return section(
        save_contents=["model", "optimizer", "extra"],
        load_contents="${.save_contents}",
        async_save=False,
    )


def _router_replay() -> ConfigDict:
    return section(mode="disabled", record_file=placeholder(str), replay_file=placeholder(str))


def _profiler() -> ConfigDict:
    """A role's profiler (verl's ProfilerConfig); tool and folder follow ``global_profiler``."""
    return section(
        tool="${global_profiler.tool}",
        enable=False,
        all_ranks=False,
        ranks=[],
        save_path="${global_profiler.save_path}",
        tool_config=section(
            nsys=section(discrete="${global_profiler.global_tool_config.nsys.discrete}"),
            npu=section(contents=[], level="level1", analysis=True, discrete=False),
            torch=section(step_start=0, step_end=placeholder(int)),
            torch_memory=section(
                trace_alloc_max_entries=(
                    "${global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries}"
                ),
                stack_depth="${global_profiler.global_tool_config.torch_memory.stack_depth}",
            ),
        ),
    )


def _tool_free_profiler(enable: Any, all_ranks: Any, ranks: Any) -> ConfigDict:
    """A profiler whose tool options are the actor's (``tool_config`` null): the rollout's
    (every switch the actor's) and the reward model's."""
    return section(
        tool="${global_profiler.tool}",
        enable=enable,
        all_ranks=all_ranks,
        ranks=ranks,
        save_path="${global_profiler.save_path}",
        tool_config=placeholder(dict),
    )


def _nsight_options(**extra: Any) -> ConfigDict:
    options = {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true"}
    return section(**options, **{"cuda-graph-trace": "graph"}, **extra)


def _global_profiler() -> ConfigDict:
    return section(
        tool=placeholder(str),
        steps=placeholder(list),
        profile_continuous_steps=False,
        save_path="outputs/profile",
        global_tool_config=section(
            nsys=section(
                discrete=False,
                controller_nsight_options=_nsight_options(),
                worker_nsight_options=_nsight_options(
                    **{
                        "capture-range": "cudaProfilerApi",
                        "capture-range-end": placeholder(str),
                        "kill": "none",
                    }
                ),
            ),
            torch_memory=section(
                trace_alloc_max_entries=100000,
                stack_depth=32,
                context="all",
                stacks="all",
                kw_args=section(),
            ),
        ),
    )


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


def _log_prob_keys() -> dict[str, Any]:
    """The micro-batching keys of a log-prob pass (`ref`, `rollout`), following the actor's."""
    return dict(
        log_prob_micro_batch_size=placeholder(int),
        log_prob_micro_batch_size_per_gpu=16,
        log_prob_use_dynamic_bsz=f"${{{ACTOR}.use_dynamic_bsz}}",
        log_prob_max_token_len_per_gpu=f"${{{ACTOR}.ppo_max_token_len_per_gpu}}",
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
        checkpoint=_checkpoint(),
        use_fused_kernels=f"${{{MODEL}.use_fused_kernels}}",
        router_replay=_router_replay(),
        profiler=_profiler(),
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
        **_log_prob_keys(),
        ulysses_sequence_parallel_size=f"${{{ACTOR}.ulysses_sequence_parallel_size}}",
        entropy_from_logits_with_chunking=False,
        entropy_checkpointing=False,
        router_replay=_router_replay(),
        profiler=_profiler(),
        model=placeholder(dict),
    )


def _rollout() -> ConfigDict:
    return section(
        name="vllm",
        mode="async",
        temperature=1.0,
        top_k=-1,
        top_p=1.0,
        prompt_length="${data.max_prompt_length}",
        response_length="${data.max_response_length}",
        dtype="bfloat16",
        gpu_memory_utilization=0.5,
        ignore_eos=False,
        enforce_eager=True,
        cudagraph_capture_sizes=placeholder(list),
        free_cache_engine=True,
        load_format="dummy_dtensor",
        tensor_model_parallel_size=2,
        data_parallel_size=1,
        expert_parallel_size=1,
        pipeline_model_parallel_size=1,
        max_num_batched_tokens=8192,
        max_model_len=placeholder(int),
        max_num_seqs=1024,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",
        scheduling_policy="fcfs",
        **_log_prob_keys(),
        disable_log_stats=True,
        do_sample=True,
        engine_kwargs=section(vllm=section(), sglang=section(), trtllm=section()),
        n=1,
        over_sample_rate=0.0,
        multi_stage_wake_up=False,
        calculate_log_probs=False,
        val_kwargs=section(top_k=-1, top_p=1.0, temperature=0.0, n=1, do_sample=False),
        multi_turn=section(
            enable=False,
            max_assistant_turns=placeholder(int),
            tool_config_path=placeholder(str),
            max_user_turns=placeholder(int),
            max_parallel_calls=1,
            max_tool_response_length=256,
            tool_response_truncate_side="middle",
            interaction_config_path=placeholder(str),
            use_inference_chat_template=False,
            tokenization_sanity_check_mode="strict",
            format="hermes",
            num_repeat_rollouts=placeholder(int),
        ),
        agent=section(
            num_workers=8,
            default_agent_loop="single_turn_agent",
            agent_loop_config_path=placeholder(str),
            custom_async_server=section(path=placeholder(str), name=placeholder(str)),
        ),
        checkpoint_engine=section(
            backend="naive", update_weights_bucket_megabytes=2048, engine_kwargs=section()
        ),
        update_weights_bucket_megabytes=512,
        profiler=_tool_free_profiler(
            f"${{{ACTOR}.profiler.enable}}",
            f"${{{ACTOR}.profiler.all_ranks}}",
            f"${{{ACTOR}.profiler.ranks}}",
        ),
        trace=section(
            backend=placeholder(str),
            token2text=False,
            max_samples_per_step_per_worker=placeholder(int),
        ),
        skip_rollout=False,
        skip_dump_dir="/tmp/rollout_dump",
        skip_tokenizer_init=True,
        enable_rollout_routing_replay=False,
        prometheus=section(
            enable=False,
            port=9090,
            file="/tmp/ray/session_latest/metrics/prometheus/prometheus.yml",
            served_model_name=f"${{{MODEL}.path}}",
        ),
        quantization=placeholder(str),
        quantization_config_file=placeholder(str),
        layered_summon=False,
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
        profiler=_profiler(),
    )


def _reward_model() -> ConfigDict:
    return section(
        enable=False,
        enable_resource_pool=False,
        n_gpus_per_node=8,
        nnodes=0,
        strategy="fsdp",
        profiler=_tool_free_profiler(False, False, []),
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
            rollout_is_threshold=2.0,
            rollout_is_batch_normalize=False,
            rollout_rs=placeholder(str),
            rollout_rs_threshold=placeholder((float, str)),
            bypass_mode=False,
            loss_type="ppo_clip",
        ),
        filter_groups=section(enable=False, metric=placeholder(str), max_num_gen_batches=0),
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
            rollout=_rollout(),
        ),
        critic=_critic(),
        reward_model=_reward_model(),
        reward_manager=section(
            source="register",
            name="${reward_model.reward_manager}",
            module=section(path=placeholder(str), name="custom_reward_manager"),
        ),
        custom_reward_function=custom_reward_function(),
        algorithm=_algorithm(),
        trainer=_trainer(),
        global_profiler=_global_profiler(),
        transfer_queue=section(enable=False),
        ray_kwargs=ray_kwargs(),
    )
