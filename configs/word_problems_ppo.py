"""PPO with a GAE critic on one-step word problems: a real pretrained model learns on a laptop.

The task (`jrl.data.gsm8k`, generator `one_step`): "Max has 2 stamps and gets 4 more. How many
stamps does Max have? Answer with the number only, after '#### '.", scored by verl's GSM8K rule in
its flexible mode (reward 1 when the last number of the answer is right; data_source
jrl/word_problems). SmolLM2-135M-Instruct (fetched from its PyPI package) answers about 40-50% of
the held-out problems right before training, and a quarter of its samples at temperature 0.7;
RL teaches it to stop at the answer and to get it right more often. 2,048 problems to train on,
128 held out.
PPO: 16 prompts per step, one answer each, a critic (value head on the same model) gives GAE
advantages. On 2 idle CPU cores, about 33 s per step once compiled (50-60 s in a 15-step run
while another job shared the cores; validation steps about 110 s there). In that run the
critic's loss fell from 0.66 to 0.18 and the training reward rose from 0.0 to 0.25-0.44, but the
held-out greedy accuracy went 0.41, 0.29, 0.37, 0.45 at steps 0, 4, 8, 12: no clear gain yet
(the GRPO card shows one):

    python -m jrl.train --config=configs/word_problems_ppo.py

Greedy accuracy on the held-out problems: `val-core/openai/gsm8k/reward/mean@1`, also in
`checkpoints/jrl/word_problems_ppo/metrics.jsonl`. The data and model are built on first use
under ~/.cache/jrl ($JRL_CACHE). configs/word_problems_grpo.py is the same experiment with GRPO.
"""

from ml_collections import ConfigDict

from jrl.assets import word_problems_paths
from jrl.config import ConfigError, default_config


def get_config(preset: str | None = None) -> ConfigDict:
    """The experiment (it already runs on a laptop CPU; configs/word_problems_grpo.py has the
    quickstart preset)."""
    if preset is not None:
        raise ConfigError(
            f"configs/word_problems_ppo.py has no presets (got {preset!r}); "
            "configs/word_problems_grpo.py:quickstart is the short run"
        )
    config = default_config()
    paths = word_problems_paths()

    # Data: 16 prompts per step (about 60 tokens with the chat template), answers of at most 32.
    config.data.train_files = paths["train_files"]
    config.data.val_files = paths["val_files"]
    config.data.train_batch_size = 16
    config.data.max_prompt_length = 64
    config.data.max_response_length = 32
    config.data.truncation = "left"

    # Model: SmolLM2-135M-Instruct; packed rows (no compute on padding); XLA's attention (the
    # flash kernels need a GPU or TPU).
    model = config.actor_rollout_ref.model
    model.path = paths["model_path"]
    model.use_remove_padding = True
    model.override_config.attn_implementation = "sdpa"

    # Actor, rollout, reference: one update of the whole batch per step, float32 on the CPU;
    # sampling at temperature 0.7 (at 1.0 this small model hardly ever keeps the format).
    actor = config.actor_rollout_ref.actor
    actor.ppo_mini_batch_size = 16
    actor.ppo_micro_batch_size_per_gpu = 16
    actor.optim.lr = 1e-5
    actor.use_kl_loss = False
    actor.fsdp_config.dtype = "float32"
    rollout = config.actor_rollout_ref.rollout
    rollout.name = "jax"
    rollout.dtype = "float32"
    rollout.n = 1
    rollout.temperature = 0.7
    rollout.tensor_model_parallel_size = 1
    rollout.log_prob_micro_batch_size_per_gpu = 16
    config.actor_rollout_ref.ref.fsdp_config.dtype = "float32"
    config.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu = 16

    # Critic: a value head on the same model (critic.model.path follows the actor's path).
    config.critic.ppo_micro_batch_size_per_gpu = 16
    config.critic.optim.lr = 1e-5
    config.critic.model.use_remove_padding = True
    config.critic.model.fsdp_config.dtype = "float32"

    # Reward: verl's GSM8K rule in its flexible mode (jrl/word_problems), no reward model.
    config.reward_model.enable = False

    # Algorithm: GAE advantages from the critic, no KL to a reference.
    config.algorithm.adv_estimator = "gae"
    config.algorithm.gamma = 1.0
    config.algorithm.lam = 1.0
    config.algorithm.use_kl_in_reward = False

    # Trainer: one CPU device, 24 steps, greedy validation before training and every 4 steps.
    trainer = config.trainer
    trainer.device = "cpu"
    trainer.nnodes = 1
    trainer.n_gpus_per_node = 1
    trainer.total_training_steps = 24
    trainer.test_freq = 4
    trainer.val_before_train = True
    trainer.logger = ["console", "file"]
    trainer.project_name = "jrl"
    trainer.experiment_name = "word_problems_ppo"
    return config
