"""Training loops: the PPO family (``PPOTrainer``) and its roles, metrics and loggers."""
