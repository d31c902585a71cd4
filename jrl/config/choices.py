"""The names some keys take, read both by config validation and by the code that acts on them
(`jrl.trainer.update.optim`): kept here, below both."""

# ``optim.lr_scheduler_type`` of the RL roles, ``optim.lr_scheduler`` of SFT, and the RL roles'
# ``optim.optimizer`` (matched case-insensitively).
LR_SCHEDULER_TYPES = ("constant", "cosine")
SFT_LR_SCHEDULERS = ("cosine", "wsd")
RL_OPTIMIZERS = ("AdamW", "Adam")
