"""GRPO on GSM8K: 5 answers per prompt, group-normalised rewards, KL loss to the reference.

The experiment of configs/gsm8k_ppo.py (data, model, batch sizes, trainer) with GRPO in place of
the GAE critic. Full run: one node of 8 GPUs (80 GB each), deepseek-llm-7b-chat, vLLM rollout.
7 steps per epoch, 30 epochs = 210 steps; each step samples 5,120 answers, so expect roughly
5x the rollout time of the PPO card (not yet measured with jrl):

    python -m jrl.train --config=configs/gsm8k_grpo.py

Laptop presets (one CPU device, float32, `jax` sampler, 3 steps, groups of 2 or 4 answers):

    python -m jrl.train --config=configs/gsm8k_grpo.py:tiny        # tiny random model, ~1 minute
    python -m jrl.train --config=configs/gsm8k_grpo.py:quickstart  # SmolLM2-135M-Instruct, ~7 min
"""

from pathlib import Path

from ml_collections import ConfigDict

from jrl.config import load_config_file
from jrl.runspec import apply_preset

PPO_CARD = Path(__file__).with_name("gsm8k_ppo.py")


def get_config(preset: str | None = None) -> ConfigDict:
    """The experiment; `preset` ('tiny', 'quickstart') shrinks it to one CPU."""
    config, _ = load_config_file(str(PPO_CARD))

    # Actor, rollout, reference: 5 answers per prompt; KL loss (low_var_kl) to the frozen reference.
    config.actor_rollout_ref.rollout.n = 5
    config.actor_rollout_ref.actor.use_kl_loss = True
    config.actor_rollout_ref.actor.kl_loss_coef = 0.001
    config.actor_rollout_ref.actor.kl_loss_type = "low_var_kl"

    # Critic: none; the group mean (and std) of the rewards is the baseline.
    config.critic.enable = False

    # Algorithm: GRPO advantages, (r - mean) / (std + 1e-6) within each prompt's group.
    config.algorithm.adv_estimator = "grpo"
    config.algorithm.norm_adv_by_std_in_grpo = True

    config.trainer.experiment_name = "gsm8k_grpo"
    return apply_preset(config, preset)
