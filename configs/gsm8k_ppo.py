"""PPO with a GAE critic on GSM8K: verl's documented FSDP example, with its values.

Full run: one node of 8 GPUs (80 GB each), deepseek-llm-7b-chat as actor and critic, vLLM rollout.
7,473 training prompts / 1,024 per step = 7 steps per epoch, 30 epochs = 210 steps; expect hours
per epoch on 8 H100s (not yet measured with jrl):

    python -m jrl.train --config=configs/gsm8k_ppo.py

The data files are GSM8K in verl's parquet layout (`prompt` chat messages, `data_source`
'openai/gsm8k', `reward_model.ground_truth`). Any key can be changed on the command line, e.g.
`actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct trainer.n_gpus_per_node=1`.

Laptop presets (one CPU device, float32, built-in `jax` sampler, 3 training steps):

    python -m jrl.train --config=configs/gsm8k_ppo.py:tiny        # tiny random model, ~minutes
    python -m jrl.train --config=configs/gsm8k_ppo.py:quickstart  # SmolLM2-135M-Instruct
"""

from ml_collections import ConfigDict

from jrl.config import default_config
from jrl.runspec import apply_preset


def get_config(preset: str | None = None) -> ConfigDict:
    """The experiment; `preset` ('tiny', 'quickstart') shrinks it to one CPU."""
    config = default_config()

    # Data: GSM8K prompts, 1,024 per step, prompts and answers of up to 512 tokens each.
    config.data.train_files = "~/data/rlhf/gsm8k/train.parquet"
    config.data.val_files = "~/data/rlhf/gsm8k/test.parquet"
    config.data.train_batch_size = 1024
    config.data.max_prompt_length = 512
    config.data.max_response_length = 512

    # Model: a chat model from the Hugging Face hub or a local folder.
    config.actor_rollout_ref.model.path = "~/models/deepseek-llm-7b-chat"

    # Actor, rollout, reference: one answer per prompt, 4 PPO mini-batches of 256 prompts.
    actor = config.actor_rollout_ref.actor
    actor.ppo_mini_batch_size = 256
    actor.ppo_micro_batch_size_per_gpu = 8
    actor.optim.lr = 1e-6
    actor.use_kl_loss = False
    rollout = config.actor_rollout_ref.rollout
    rollout.name = "vllm"
    rollout.n = 1
    rollout.tensor_model_parallel_size = 2
    rollout.gpu_memory_utilization = 0.5
    rollout.log_prob_micro_batch_size_per_gpu = 16

    # Critic: a value head on the actor's model (critic.model.path follows the actor's path).
    config.critic.ppo_micro_batch_size_per_gpu = 8
    config.critic.optim.lr = 1e-5

    # Reward: the rule-based GSM8K score ('#### answer' must match), no reward model.
    config.reward_model.enable = False

    # Algorithm: GAE advantages from the critic; KL to the reference is not used.
    config.algorithm.adv_estimator = "gae"
    config.algorithm.gamma = 1.0
    config.algorithm.lam = 1.0
    config.algorithm.use_kl_in_reward = False

    # Trainer: validate before training and every 2 steps; checkpoints under checkpoints/.
    config.trainer.nnodes = 1
    config.trainer.n_gpus_per_node = 8
    config.trainer.total_epochs = 30
    config.trainer.test_freq = 2
    config.trainer.project_name = "verl_examples"
    config.trainer.experiment_name = "gsm8k"
    return apply_preset(config, preset)
