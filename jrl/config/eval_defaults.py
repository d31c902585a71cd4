"""Every key of offline generation (``python -m jrl.generate``) and evaluation
(``python -m jrl.evaluate``) with its default: verl's generation and evaluation configs, same
names and meaning (their cross-key checks: `jrl.runspec.eval_checks`).

The evaluation keys and values are those of verl's configuration document. jrl adds
``custom_reward_function.reward_kwargs`` (as in the PPO tree) and ``pass_at_k`` (which k to report
and the score a response needs to count as correct); generation adds ``data.truncation``,
``model.trust_remote_code`` and ``rollout.seed``.
"""

from __future__ import annotations

from ml_collections import ConfigDict
from ml_collections.config_dict import placeholder

from jrl.config.defaults import custom_reward_function, ray_kwargs, section


def generation_config() -> ConfigDict:
    """A fresh, locked config holding every generation key with its default."""
    config = section(
        trainer=section(nnodes=1, n_gpus_per_node=8, device="cuda"),
        data=section(
            path="~/data/rlhf/math/test.parquet",
            prompt_key="prompt",
            n_samples=5,
            output_path="/opt/tiger/math_Qwen2-7B-Instruct.parquet",
            batch_size=128,
            truncation="error",
        ),
        model=section(
            path="~/models/Qwen2-7B-Instruct",
            external_lib=placeholder(str),
            trust_remote_code=False,
        ),
        rollout=section(
            name="vllm",
            mode="sync",
            temperature=1.0,
            top_k=50,
            top_p=0.7,
            prompt_length=1536,
            response_length=512,
            dtype="bfloat16",
            gpu_memory_utilization=0.5,
            ignore_eos=False,
            enforce_eager=True,
            free_cache_engine=True,
            load_format="dummy_dtensor",
            tensor_model_parallel_size=1,
            max_num_batched_tokens=8192,
            max_model_len=placeholder(int),
            max_num_seqs=1024,
            log_prob_micro_batch_size=placeholder(int),
            log_prob_micro_batch_size_per_gpu=8,
            do_sample=True,
            disable_log_stats=True,
            enable_chunked_prefill=True,
            n=1,
            calculate_log_probs=False,
            seed=0,
        ),
        ray_kwargs=ray_kwargs(),
    )
    return config.lock()


def evaluation_config() -> ConfigDict:
    """A fresh, locked config holding every evaluation key with its default."""
    config = section(
        data=section(
            path="/tmp/math_Qwen2-7B-Instruct.parquet",
            prompt_key="prompt",
            response_key="responses",
            data_source_key="data_source",
            reward_model_key="reward_model",
        ),
        custom_reward_function=custom_reward_function(),
        pass_at_k=section(k=placeholder(list), threshold=1.0),
        ray_kwargs=ray_kwargs(),
    )
    return config.lock()
