"""GRPO with a tool: a tiny random model learns a task that it can only solve by calling a tool.

The task (`jrl.data.lookup`): every prompt is "?", and each row's secret digit is known only to
the ``lookup`` tool. Reward 1.0 for writing the secret after the tool's answer, 0.1 for a call
followed by a wrong answer, 0 without a call (`jrl.reward.lookup`). The model is a 2-layer
random-init decoder over 14 tokens, one of which is the whole tool call (Hermes format). The
rollout is multi-turn (verl's ``rollout.multi_turn`` keys): the tool agent loop parses the call,
runs the tool and appends its answer as a masked turn; the model then answers.

GRPO: 16 prompts x 8 answers per step; the experiment of configs/digits_grpo.py otherwise. On 2
CPU cores, about a minute:

    python -m jrl.train --config=configs/lookup_tool_grpo.py

Greedy accuracy on 256 held-out rows: `val-core/jrl/lookup/acc/mean@1` (tool calls:
`val-aux/jrl/lookup/called/mean@1`), also in `checkpoints/jrl/lookup_tool_grpo/metrics.jsonl`.
"""

from pathlib import Path

from ml_collections import ConfigDict

from jrl.assets import lookup_paths
from jrl.config import load_config_file

GRPO_CARD = Path(__file__).with_name("digits_grpo.py")


def get_config(preset: str | None = None) -> ConfigDict:
    """The experiment (it already runs on a laptop CPU, so there are no presets)."""
    config, _ = load_config_file(str(GRPO_CARD) if preset is None else f"{GRPO_CARD}:{preset}")
    paths = lookup_paths()

    # Data: the lookup rows (prompt "?"), the task's tiny model and tokenizer. A response is the
    # call, the tool's turn and the answer: [CALL, EOS, @, 7, 7, EOS].
    config.data.train_files = paths["train_files"]
    config.data.val_files = paths["val_files"]
    config.data.max_prompt_length = 4
    config.data.max_response_length = 8
    config.actor_rollout_ref.model.path = paths["model_path"]

    # Rollout: verl's multi-turn keys; the rows name the tool agent (agent_name), the tool comes
    # from the task's tool config (verl's YAML format).
    multi_turn = config.actor_rollout_ref.rollout.multi_turn
    multi_turn.enable = True
    multi_turn.max_assistant_turns = 2
    multi_turn.tool_config_path = paths["tool_config_path"]
    multi_turn.format = "hermes"

    config.trainer.total_training_steps = 30
    config.trainer.experiment_name = "lookup_tool_grpo"
    return config
