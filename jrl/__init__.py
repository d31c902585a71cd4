"""jrl: verl's RL post-training (PPO, GRPO, ...) re-built in JAX/Flax."""

__version__ = "0.1.0"
