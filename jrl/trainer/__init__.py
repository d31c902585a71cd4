"""The trainers, by job: `loop` (the one fit loop), `ppo` and `sft` (the step each supplies),
`roles` (the models a step uses), `update` (how a role is trained) and `io` (checkpoints,
loggers, metrics)."""
