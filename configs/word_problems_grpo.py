"""GRPO on one-step word problems: 4 answers per prompt, group-normalised rewards, KL loss.

The experiment of configs/word_problems_ppo.py (task, SmolLM2-135M-Instruct, trainer) with GRPO
in place of the GAE critic: 4 prompts x 4 answers per step (the same 16 answers as PPO). On 2 CPU
cores, about 12-14 seconds per step once compiled (bypass mode: no old-log-prob pass; the 4
answers of a prompt share its tokens in the packed forwards); the held-out greedy accuracy starts
near 0.45:

    python -m jrl.train --config=configs/word_problems_grpo.py             # 24 steps
    python -m jrl.train --config=configs/word_problems_grpo.py:quickstart  # 6 steps, < 10 min

The quickstart validates on 64 held-out problems before and after its 6 steps and ends with a
one-line summary and the plots. `python bench/learning.py --model smollm2` runs this card over
several seeds.
"""

from pathlib import Path

from ml_collections import ConfigDict

from jrl.config import ConfigError, load_config_file

PPO_CARD = Path(__file__).with_name("word_problems_ppo.py")


def get_config(preset: str | None = None) -> ConfigDict:
    """The experiment; `preset` 'quickstart' is its 6-step run."""
    config, _ = load_config_file(str(PPO_CARD))

    # Data: 4 prompts per step.
    config.data.train_batch_size = 4

    # Actor, rollout, reference: 4 answers per prompt; KL loss (low_var_kl) to the reference.
    config.actor_rollout_ref.rollout.n = 4
    actor = config.actor_rollout_ref.actor
    actor.ppo_mini_batch_size = 4
    actor.use_kl_loss = True
    actor.kl_loss_coef = 0.001
    actor.kl_loss_type = "low_var_kl"

    # The rollout's log-probs are the old ones (current verl's bypass mode): one mini-batch for
    # one epoch is on-policy, so the actor's old-log-prob pass would only recompute them.
    config.actor_rollout_ref.rollout.calculate_log_probs = True
    config.algorithm.rollout_correction.bypass_mode = True

    # Critic: none; the group mean and std of the rewards is the baseline.
    config.critic.enable = False

    # Algorithm: GRPO advantages, (r - mean) / (std + 1e-6) within each prompt's group.
    config.algorithm.adv_estimator = "grpo"
    config.algorithm.norm_adv_by_std_in_grpo = True

    config.trainer.experiment_name = "word_problems_grpo"
    if preset is None:
        return config
    if preset != "quickstart":
        raise ConfigError(f"unknown preset {preset!r}; valid presets: quickstart")
    # Quickstart: 6 steps, validated on 64 held-out problems before and after.
    config.trainer.total_training_steps = 6
    config.trainer.test_freq = 6
    config.data.val_max_samples = 64
    config.trainer.experiment_name = "word_problems_grpo_quickstart"
    return config
