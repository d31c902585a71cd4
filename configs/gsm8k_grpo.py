"""GRPO on GSM8K: 5 answers per prompt, group-normalised rewards, KL loss to the reference.

Full run: one node of 8 GPUs (80 GB each), deepseek-llm-7b-chat, vLLM rollout, no critic.
7 steps per epoch, 30 epochs = 210 steps; each step samples 5,120 answers, so expect roughly
5x the rollout time of configs/gsm8k_ppo.py (not yet measured with jrl):

    python -m jrl.train --config=configs/gsm8k_grpo.py

Data as in configs/gsm8k_ppo.py. Laptop presets (one CPU device, float32, `jax` sampler, 3 steps,
groups of 2 or 4 answers):

    python -m jrl.train --config=configs/gsm8k_grpo.py:tiny        # tiny random model, ~minutes
    python -m jrl.train --config=configs/gsm8k_grpo.py:quickstart  # SmolLM2-135M-Instruct
"""

from ml_collections import ConfigDict

from jrl.config import apply_preset, default_config


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

    # Actor, rollout, reference: 5 answers per prompt; KL loss (low_var_kl) to the frozen reference.
    actor = config.actor_rollout_ref.actor
    actor.ppo_mini_batch_size = 256
    actor.ppo_micro_batch_size_per_gpu = 8
    actor.optim.lr = 1e-6
    actor.use_kl_loss = True
    actor.kl_loss_coef = 0.001
    actor.kl_loss_type = "low_var_kl"
    actor.entropy_coeff = 0.0
    rollout = config.actor_rollout_ref.rollout
    rollout.name = "vllm"
    rollout.n = 5
    rollout.tensor_model_parallel_size = 2
    rollout.gpu_memory_utilization = 0.5
    rollout.log_prob_micro_batch_size_per_gpu = 16
    config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu = 16

    # Critic: none; the group mean (and std) of the rewards is the baseline.

    # Reward: the rule-based GSM8K score ('#### answer' must match), no reward model.
    config.reward_model.enable = False

    # Algorithm: GRPO advantages, (r - mean) / (std + 1e-6) within each prompt's group.
    config.algorithm.adv_estimator = "grpo"
    config.algorithm.norm_adv_by_std_in_grpo = True
    config.algorithm.use_kl_in_reward = False

    # Trainer: validate before training and every 2 steps; checkpoints under checkpoints/.
    config.trainer.nnodes = 1
    config.trainer.n_gpus_per_node = 8
    config.trainer.total_epochs = 30
    config.trainer.test_freq = 2
    config.trainer.project_name = "verl_examples"
    config.trainer.experiment_name = "gsm8k_grpo"
    return apply_preset(config, preset)
