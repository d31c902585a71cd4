"""The ``actor_rollout_ref.rollout`` section of verl's PPO trainer config with its defaults
(part of `jrl.config.defaults`' key tree)."""

from __future__ import annotations

from typing import Any

from ml_collections import ConfigDict
from ml_collections.config_dict import placeholder

from jrl.config.profilers import tool_free_profiler
from jrl.config.tree import ACTOR, MODEL, section


def log_prob_keys() -> dict[str, Any]:
    """The micro-batching keys of a log-prob pass (`ref`, `rollout`), following the actor's."""
    return dict(
        log_prob_micro_batch_size=placeholder(int),
        log_prob_micro_batch_size_per_gpu=16,
        log_prob_use_dynamic_bsz=f"${{{ACTOR}.use_dynamic_bsz}}",
        log_prob_max_token_len_per_gpu=f"${{{ACTOR}.ppo_max_token_len_per_gpu}}",
    )


def rollout_section() -> ConfigDict:
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
        **log_prob_keys(),
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
            function_tool_path=placeholder(str),
            max_user_turns=placeholder(int),
            max_parallel_calls=1,
            max_tool_response_length=256,
            tool_response_truncate_side="middle",
            interaction_config_path=placeholder(str),
            use_inference_chat_template=False,
            tokenization_sanity_check_mode="strict",
            format="hermes",
            num_repeat_rollouts=placeholder(int),
            tool_timeout=60.0,
        ),
        agent=section(
            num_workers=8,
            # jrl's own: how later turns meet the engine: "rounds" (one call per round) or
            # "slots" (each into the running batch as soon as it is asked, where the engine can).
            scheduling="rounds",
            # jrl's own, with rounds: groups of rows whose later rounds take turns (one decodes
            # while the others' tools run); 1: each round waits for every row.
            row_groups=1,
            default_agent_loop="single_turn_agent",
            agent_loop_config_path=placeholder(str),
            custom_async_server=section(path=placeholder(str), name=placeholder(str)),
        ),
        checkpoint_engine=section(
            backend="naive", update_weights_bucket_megabytes=2048, engine_kwargs=section()
        ),
        update_weights_bucket_megabytes=512,
        profiler=tool_free_profiler(
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
