"""The keys that have no effect in a run, each with why: keys of torch, Ray or an engine that the
run does not use, keys of a part of the run that is switched off (a critic under GRPO, token
budgets without dynamic batch sizes), options of a choice the run did not make, and keys idle on
this host. `jrl.runspec.effects` turns the table into the start-up notice and ``--explain``."""

from __future__ import annotations

from jrl.config.megatron import MEGATRON_ROLES
from jrl.rollout.engines import ENGINES
from jrl.runspec.no_effect_rules import (
    ACTOR,
    ENTROPY,
    FSDP,
    MEGATRON,
    MOE,
    NAMED_LOGGERS,
    NO_CRITIC,
    NO_REFERENCE,
    NO_REWARD_MODEL,
    OWN_DECODER,
    RAY,
    REF,
    REWARD_LOOP,
    RM_MODEL_KEYS,
    ROLLOUT,
    SHM,
    TEXT_ONLY,
    TORCH_BACKEND,
    TORCH_COMPILE,
    WEIGHT_TRANSFER,
    NoEffect,
    estimator_entries,
    greedy_validation,
    jax_sampler,
    local_data,
    lora_entries,
    lora_on,
    loss_entries,
    no_host_offload,
    no_memory_report,
    not_dapo,
    not_generating,
    off,
    optim_entries,
    single_process,
    token_budgets,
    tokenizer_without_code,
    unnamed_run,
)
from jrl.runspec.shape import estimator_needs_critic, uses_critic, uses_reference

NO_EFFECT = (
    NoEffect("data.tokenizer", "verl reads the tokenizer from actor_rollout_ref.model.path"),
    NoEffect("actor_rollout_ref.hybrid_engine", "jrl always colocates the roles (hybrid engine)"),
    NoEffect("actor_rollout_ref.nccl_timeout", "NCCL's timeout: jrl's collectives are XLA's"),
    NoEffect("*.strategy", TORCH_BACKEND),
    NoEffect("*.use_torch_compile", TORCH_COMPILE),
    NoEffect("*.use_liger", "Liger's torch kernels: jrl's fused kernels are use_fused_kernels"),
    NoEffect("*.tiled_mlp.*", "torch's tiled MLP: jrl cuts activations by gradient checkpointing"),
    NoEffect("*.use_shm", SHM),
    NoEffect("*.fsdp_config.wrap_policy.*", "torch FSDP wrapping: jrl shards by logical axes"),
    NoEffect("*.fsdp_config.min_num_params", "torch FSDP wrapping: jrl shards by logical axes"),
    *(
        NoEffect(f"*.fsdp_config.{key}", FSDP)
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
    NoEffect(f"{REF}.fsdp_config.optimizer_offload", "the reference has no optimizer"),
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
        MEGATRON,
        unless=tuple(f"{role}.megatron.tensor_model_parallel_size" for role in MEGATRON_ROLES),
    ),
    NoEffect("*.entropy_from_logits_with_chunking", ENTROPY),
    NoEffect("*.entropy_checkpointing", ENTROPY),
    NoEffect("*.moe_config.freeze_moe_router", MOE),
    NoEffect("*.router_replay.*", MOE),
    NoEffect(f"{ROLLOUT}.enable_rollout_routing_replay", MOE),
    NoEffect("*.optim.clip_grad", "Megatron's clipping: verl's FSDP roles clip at grad_clip"),
    NoEffect("*.optim.optimizer_impl", "the torch module of verl's optimizer: jrl's are optax's"),
    NoEffect("*.optim.total_training_steps", "set from the run's total steps (as verl sets it)"),
    NoEffect("*.checkpoint.async_save", "jrl always writes checkpoints in the background"),
    *(
        NoEffect(
            f"{role}.data_loader_seed",
            f"{role}.shuffle is False: the mini-batches keep their order",
            off(f"{role}.shuffle"),
        )
        for role in (ACTOR, "critic")
    ),
    NoEffect(
        f"{ACTOR}.loss_scale_factor",
        "the divisor of loss_agg_mode=seq-mean-token-sum-norm only",
        lambda config, engine: config[f"{ACTOR}.loss_agg_mode"] != "seq-mean-token-sum-norm",
    ),
    NoEffect("actor_rollout_ref.model.trust_remote_code", OWN_DECODER, jax_sampler),
    NoEffect("critic.model.trust_remote_code", OWN_DECODER),
    NoEffect(
        "data.trust_remote_code",
        "the tokenizer (actor_rollout_ref.model.tokenizer_path or path) has no code of its own: "
        "its tokenizer_config.json has no auto_map",
        tokenizer_without_code,
    ),
    NoEffect(
        "*.enable_activation_offload",
        "on CPU device memory is host memory: the layers are only rematerialised",
        no_host_offload,
    ),
    NoEffect(
        f"{ROLLOUT}.gpu_memory_utilization",
        "the CPU reports no device memory: the JAX sampler's KV cache follows max_num_seqs and "
        "max_num_batched_tokens",
        no_memory_report,
    ),
    NoEffect("data.image_key", f"{TEXT_ONLY} (rows with images under it are refused)"),
    NoEffect(
        "data.cache_dir",
        "where remote data files are copied: every data file of this run is local",
        local_data,
    ),
    NoEffect(
        "data.validation_shuffle",
        "validation is greedy and generates the whole set in one call: the order of its rows "
        "changes no result",
        greedy_validation,
    ),
    *(
        NoEffect(
            f"trainer.{key}",
            f"names the run for {', '.join(NAMED_LOGGERS)} (none is in trainer.logger) and for "
            "trainer.default_local_dir (set apart from it)",
            unnamed_run,
        )
        for key in ("project_name", "experiment_name")
    ),
    NoEffect(
        "trainer.ray_wait_register_center_timeout",
        "one process: there are no other processes to wait for",
        single_process,
    ),
    *(
        NoEffect(f"{role}.rollout_n", "verl's copy of actor_rollout_ref.rollout.n, which jrl reads")
        for role in (ACTOR, REF, "critic")
    ),
    NoEffect(f"{ACTOR}.use_remove_padding", "jrl packs rows as model.use_remove_padding says"),
    NoEffect(f"{ACTOR}.calculate_entropy", "jrl always computes the entropy (actor/entropy)"),
    NoEffect(f"{ACTOR}.freeze_vision_tower", TEXT_ONLY),
    *(NoEffect(f"data.{key}", TEXT_ONLY) for key in ("image_patch_size", "video_key")),
    NoEffect("data.return_multi_modal_inputs", TEXT_ONLY),
    NoEffect(
        "data.val_batch_size",
        "jrl generates the whole validation set in one call (verl's default); the sampler "
        "batches it by its slots",
    ),
    NoEffect("data.dataloader_num_workers", "torch DataLoader workers: jrl reads rows in process"),
    NoEffect("data.filter_overlong_prompts_workers", "jrl filters long prompts in process"),
    NoEffect("critic.model.tokenizer_path", "the critic reads the actor's tokens (model.path's)"),
    NoEffect(f"{ROLLOUT}.mode", "verl's rollout servers: jrl's sampler runs in the trainer"),
    NoEffect(f"{ROLLOUT}.prompt_length", "jrl's rollout takes prompts as data.max_prompt_length"),
    NoEffect(f"{ROLLOUT}.checkpoint_engine.*", WEIGHT_TRANSFER),
    NoEffect(f"{ROLLOUT}.update_weights_bucket_megabytes", WEIGHT_TRANSFER),
    NoEffect("ray_kwargs.*", "Ray's options: jrl runs without Ray"),
    NoEffect("transfer_queue.*", "verl's Ray transfer queue: jrl runs without Ray"),
    NoEffect("trainer.use_legacy_worker_impl", "chooses between verl's Ray worker classes"),
    *(
        NoEffect(f"reward_model.{key}", RAY)
        for key in ("enable_resource_pool", "n_gpus_per_node", "nnodes")
    ),
    NoEffect("reward_model.launch_reward_fn_async", REWARD_LOOP),
    NoEffect("reward_model.use_reward_loop", REWARD_LOOP),
    NoEffect("reward_model.reward_loop_*", REWARD_LOOP),
    NoEffect("reward_model.num_workers", REWARD_LOOP),
    NoEffect(
        "algorithm.filter_groups.*", "read by verl's DAPO recipe only, not by the PPO trainer"
    ),
    *(
        NoEffect(
            f"{ROLLOUT}.{key}",
            f"{engine.label}'s option: {engine.label} does not generate in this run",
            not_generating(engine),
        )
        for engine in ENGINES.values()
        for key in engine.only_keys
    ),
    # Parts of the run that are switched off.
    NoEffect(
        "critic.*",
        NO_CRITIC,
        lambda config, engine: not uses_critic(config),
        unless=("critic.enable",),
        given_only=True,
    ),
    NoEffect(
        "trainer.max_critic_ckpt_to_keep",
        NO_CRITIC,
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
        NO_CRITIC,
        lambda config, engine: not uses_critic(config),
        given_only=True,
    ),
    *(
        NoEffect(
            f"{REF}.fsdp_config.{key}",
            "with LoRA the reference is the actor's base model: on the actor's mesh, under the "
            "actor's param_offload",
            lora_on("actor_rollout_ref.model"),
        )
        for key in ("fsdp_size", "param_offload")
    ),
    NoEffect(
        f"{REF}.*",
        NO_REFERENCE,
        lambda config, engine: not uses_reference(config),
        given_only=True,
    ),
    *(
        NoEffect(f"reward_model.{key}", NO_REWARD_MODEL, off("reward_model.enable"))
        for key in RM_MODEL_KEYS
    ),
    NoEffect(f"{ACTOR}.kl_loss_*", f"{ACTOR}.use_kl_loss is False", off(f"{ACTOR}.use_kl_loss")),
    NoEffect(
        "algorithm.kl_penalty",
        "algorithm.use_kl_in_reward is False",
        off("algorithm.use_kl_in_reward"),
    ),
    NoEffect(
        "algorithm.kl_ctrl.*",
        "algorithm.use_kl_in_reward is False",
        off("algorithm.use_kl_in_reward"),
    ),
    *lora_entries(),
    NoEffect(
        "actor_rollout_ref.model.fused_kernel_options.*",
        "actor_rollout_ref.model.use_fused_kernels is False",
        off("actor_rollout_ref.model.use_fused_kernels"),
    ),
    *token_budgets(),
    *optim_entries(),
    *loss_entries(),
    *estimator_entries(),
    NoEffect(
        "reward_model.overlong_buffer.*",
        "the dapo reward manager's option (reward_manager.name / reward_model.reward_manager)",
        not_dapo,
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
