"""GRPO on the digits task: 8 answers per prompt, group-normalised rewards, no critic.

The experiment of configs/digits_ppo.py (data, model, trainer) with GRPO in place of the GAE
critic: 16 prompts x 8 answers per step (the same 128 answers as PPO). On 2 CPU cores, about
20 seconds (compilation included; a repeated run starts faster):

    python -m jrl.train --config=configs/digits_grpo.py

Greedy accuracy on 256 held-out prompts: `val-core/jrl/digits/reward/mean@1`, also in
`checkpoints/jrl/digits_grpo/metrics.jsonl`.
"""

from pathlib import Path

from ml_collections import ConfigDict

from jrl.config import load_config_file

PPO_CARD = Path(__file__).with_name("digits_ppo.py")


def get_config(preset: str | None = None) -> ConfigDict:
    """The experiment (it already runs on a laptop CPU, so there are no presets)."""
    config, _ = load_config_file(str(PPO_CARD) if preset is None else f"{PPO_CARD}:{preset}")

    # Data: 16 prompts per step.
    config.data.train_batch_size = 16

    # Actor, rollout: 8 answers per prompt; 2 mini-batches of 8 prompts (64 answers).
    config.actor_rollout_ref.rollout.n = 8
    config.actor_rollout_ref.actor.ppo_mini_batch_size = 8

    # Critic: none; the group mean and std of the rewards is the baseline.
    config.critic.enable = False

    # Algorithm: GRPO advantages, (r - mean) / (std + 1e-6) within each prompt's group.
    config.algorithm.adv_estimator = "grpo"
    config.algorithm.norm_adv_by_std_in_grpo = True

    config.trainer.experiment_name = "digits_grpo"
    return config
