"""The names some keys take, read both by config validation and by the code that acts on them
(`jrl.trainer.update.optim`): kept here, below both."""

# ``optim.lr_scheduler_type`` of the RL roles, ``optim.lr_scheduler`` of SFT, and the RL roles'
# ``optim.optimizer`` (matched case-insensitively).
LR_SCHEDULER_TYPES = ("constant", "cosine")
SFT_LR_SCHEDULERS = ("cosine", "wsd")
RL_OPTIMIZERS = ("AdamW", "Adam")
# Rollout keys that the vllm engine hands to `vllm.LLM` unchanged when they are not null.
VLLM_PASS_THROUGH = (
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "disable_log_stats",
    "logprobs_mode",
    "scheduling_policy",
    "skip_tokenizer_init",
)
