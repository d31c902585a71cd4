"""Optimizers and learning-rate schedules of the RL roles and of SFT, built from typed settings.

`settings` holds the names, defaults and frozen settings (no optax: the resolver reads it without
jax), `schedule` the learning rate per scheduler step, `optimizers` the optax transformations.
This package imports nothing itself, so reading the settings loads no optax.
"""
