"""PPO with a GAE critic on the digits task: RL teaches a tiny random model to name a digit.

The task (`jrl.data.digits`): the prompt is four digits and "=", e.g. "3718=", the answer its
first digit; reward 1 for a right first answer token, else 0. The model is a 2-layer random-init
Qwen2-style decoder over 12 tokens (one per character): its sampled answers start right about one
time in twelve, its greedy ones (a constant token) hardly ever.
PPO: one answer per prompt, 128 prompts per step, a critic (value head on the same tiny model)
gives GAE advantages. On 2 CPU cores, about 30 seconds (compilation included; a repeated run
starts faster):

    python -m jrl.train --config=configs/digits_ppo.py

Greedy accuracy on 256 held-out prompts is validated before training and every 10 steps
(`val-core/jrl/digits/reward/mean@1`, also in `checkpoints/jrl/digits_ppo/metrics.jsonl`).
`python bench/learning.py` runs this card and configs/digits_grpo.py over several seeds and plots
the curves. The data and model are built on first use under ~/.cache/jrl/digits ($JRL_CACHE).
"""

from ml_collections import ConfigDict

from jrl.assets import digits_paths
from jrl.config import ConfigError, default_config


def get_config(preset: str | None = None) -> ConfigDict:
    """The experiment (it already runs on a laptop CPU, so there are no presets)."""
    if preset is not None:
        raise ConfigError(
            f"the digits cards (configs/digits_ppo.py, configs/digits_grpo.py) have no presets "
            f"(got {preset!r}): they already run on a laptop CPU; change their scale with "
            "overrides such as trainer.total_training_steps=20"
        )
    config = default_config()
    paths = digits_paths()

    # Data: 4,096 training prompts of 5 tokens, 128 per step; answers of at most 2 tokens.
    config.data.train_files = paths["train_files"]
    config.data.val_files = paths["val_files"]
    config.data.train_batch_size = 128
    config.data.max_prompt_length = 8
    config.data.max_response_length = 2

    # Model: the task's tiny random-init decoder.
    config.actor_rollout_ref.model.path = paths["model_path"]

    # Actor, rollout: one answer per prompt, 2 PPO mini-batches per step, float32 on the CPU.
    actor = config.actor_rollout_ref.actor
    actor.ppo_mini_batch_size = 64
    actor.ppo_micro_batch_size_per_gpu = 64
    actor.optim.lr = 1e-3
    actor.use_kl_loss = False
    actor.fsdp_config.dtype = "float32"
    rollout = config.actor_rollout_ref.rollout
    rollout.name = "jax"
    rollout.dtype = "float32"
    rollout.n = 1
    rollout.tensor_model_parallel_size = 1
    rollout.log_prob_micro_batch_size_per_gpu = 128
    config.actor_rollout_ref.ref.fsdp_config.dtype = "float32"
    config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu = 128

    # Critic: a value head on the same tiny model (critic.model.path follows the actor's path).
    config.critic.ppo_micro_batch_size_per_gpu = 64
    config.critic.optim.lr = 1e-3
    config.critic.model.fsdp_config.dtype = "float32"

    # Reward: the rule score of jrl/digits (jrl.reward.digits), no reward model.
    config.reward_model.enable = False

    # Algorithm: GAE advantages from the critic, no KL to a reference.
    config.algorithm.adv_estimator = "gae"
    config.algorithm.gamma = 1.0
    config.algorithm.lam = 1.0
    config.algorithm.use_kl_in_reward = False

    # Trainer: one CPU device, 60 steps, greedy validation before training and every 10 steps.
    trainer = config.trainer
    trainer.device = "cpu"
    trainer.nnodes = 1
    trainer.n_gpus_per_node = 1
    trainer.total_training_steps = 60
    trainer.test_freq = 10
    trainer.val_before_train = True
    trainer.logger = ["console", "file"]
    trainer.project_name = "jrl"
    trainer.experiment_name = "digits_ppo"
    return config
