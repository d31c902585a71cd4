"""Offline evaluation of generated responses: verl's evaluation config, with its defaults.

First sample responses for the test prompts (here 5 per prompt), then score them:

    python -m jrl.generate data.path=~/data/gsm8k/test.parquet data.n_samples=5 \
        data.output_path=/tmp/gsm8k_gen.parquet model.path=MODEL rollout.name=jax
    python -m jrl.evaluate --config=configs/eval.py data.path=/tmp/gsm8k_gen.parquet

Scoring runs on the CPU in seconds for GSM8K's 1,319 test prompts. The result is one JSON line:
`test_score/<data_source>` (mean score) and, with several responses per prompt,
`pass@k/<data_source>` (unbiased pass@k). Without `custom_reward_function.path` each data source
is scored by its built-in rule (GSM8K: the number after "####" must match).
"""

from ml_collections import ConfigDict

from jrl.config import evaluation_config


def get_config() -> ConfigDict:
    """The evaluation (verl's keys and defaults)."""
    config = evaluation_config()

    # Data: the generated parquet, a list of responses per row.
    data = config.data
    data.path = "/tmp/math_Qwen2-7B-Instruct.parquet"
    data.prompt_key = "prompt"
    data.response_key = "responses"
    data.data_source_key = "data_source"
    data.reward_model_key = "reward_model"

    # Reward: the built-in scorer of each data source unless a file is given.
    config.custom_reward_function.path = None
    config.custom_reward_function.name = "compute_score"
    return config
