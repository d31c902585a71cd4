"""Files that the behaviour sweep (`key_behaviour`) hands to the keys that name one: a second
tiny model, copies of the tiny data with other rows and a second prompt column, a reward
function, a reward manager and a dataset class of the user's. Each differs from what the card
uses, so a key that reads it changes what the run does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

USER_CODE = '''"""A user's reward function, reward manager and dataset (the behaviour sweep's)."""

from jrl.data.rl_dataset import RLDataset
from jrl.reward.naive import NaiveRewardManager


def length_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """A score that depends on the answer's and the ground truth's lengths (plus `bonus` from
    reward_kwargs)."""
    return len(solution_str) % 3 + len(str(ground_truth)) + float(kwargs.get("bonus", 0))


compute_score = length_score  # the name custom_reward_function.name defaults to


def source_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """A score that depends on the row's data source (data.reward_fn_key)."""
    return float(len(data_source))


def half_length_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return float(len(solution_str) % 2)


class LengthRewardManager(NaiveRewardManager):
    """The naive manager scoring by `length_score` whatever scorer it is given."""

    def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source",
                 **kwargs):
        super().__init__(tokenizer, num_examine, length_score, reward_fn_key, **kwargs)


class HalfLengthRewardManager(LengthRewardManager):
    def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source",
                 **kwargs):
        NaiveRewardManager.__init__(
            self, tokenizer, num_examine, half_length_score, reward_fn_key, **kwargs
        )


class ReversedRows(RLDataset):
    """The data files' rows in reverse order."""

    def __init__(self, data_files, tokenizer, config, max_samples=-1, **kwargs):
        super().__init__(data_files, tokenizer, config, max_samples, **kwargs)
        self.rows.reverse()
        self.messages.reverse()
'''


def other_model(folder: Path, tiny_model: Path) -> str:
    """The tiny model's shape and vocabulary with other random weights (seed 1), and a
    tokenizer whose chat template starts with 'Question: '."""
    from jrl.data import load_tokenizer
    from jrl.models import ModelConfig, init_random, save_pretrained

    tokenizer = load_tokenizer(str(tiny_model))
    tokenizer.chat_template = "Question: " + tokenizer.chat_template
    config = ModelConfig.from_hf(json.loads((tiny_model / "config.json").read_text()))
    save_pretrained(init_random(config, seed=1), folder, tokenizer=tokenizer)
    return str(folder)


def reward_model(folder: Path, tiny_model: Path) -> str:
    """A one-label sequence-classification model of the tiny model's shape (random, seed 2)."""
    from jrl.data import load_tokenizer
    from jrl.models import ModelConfig, init_random, save_pretrained

    config = ModelConfig.from_hf(json.loads((tiny_model / "config.json").read_text()))
    model = init_random(config, kind="reward", seed=2)
    save_pretrained(model, folder, tokenizer=load_tokenizer(str(tiny_model)))
    return str(folder)


def other_rows(source: str, target: Path) -> str:
    """`source`'s rows in reverse order, with a `question` column holding the prompts rotated
    by one row."""
    table = pq.read_table(source)
    rows = table.to_pylist()[::-1]
    prompts = [row["prompt"] for row in rows]
    for row, prompt in zip(rows, prompts[1:] + prompts[:1], strict=True):
        row["question"] = prompt
    pq.write_table(pa.Table.from_pylist(rows), target)
    return str(target)


def write_fixtures(root: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(values, contexts) for the keys that name a file, written under `root` (which must be on
    `sys.path`, for model.external_lib)."""
    from jrl.assets import tiny_paths

    root.mkdir(parents=True, exist_ok=True)
    tiny = tiny_paths()
    model = other_model(root / "other_model", Path(tiny["model_path"]))
    train = other_rows(tiny["train_files"], root / "train.parquet")
    val = other_rows(tiny["val_files"], root / "val.parquet")
    code = root / "user_code.py"
    code.write_text(USER_CODE)
    (root / "user_plugin.py").write_text('"""A module of the user\'s (model.external_lib)."""\n')
    copies = {"data.train_files": train, "data.val_files": val}
    values = {
        "actor_rollout_ref.model.path": model,
        "actor_rollout_ref.model.tokenizer_path": model,
        "critic.model.path": model,
        **copies,
        "data.prompt_key": "question",
        **{f"{m}.external_lib": "user_plugin" for m in ("actor_rollout_ref.model", "critic.model")},
        "data.reward_fn_key": "ability",  # 'math' rows: the math scorer instead of gsm8k's
        "custom_reward_function.path": str(code),
        "custom_reward_function.name": "half_length_score",
        "custom_reward_function.reward_kwargs": {"bonus": 1},
        "reward_manager.module.path": str(code),
        "reward_manager.module.name": "HalfLengthRewardManager",
        "data.custom_cls.path": str(code),
        "data.custom_cls.name": "ReversedRows",
    }
    scorer = {"custom_reward_function.path": str(code)}
    manager = {
        "reward_manager.source": "importlib",
        "reward_manager.module.path": str(code),
        "reward_manager.module.name": "LengthRewardManager",
    }
    rm = {
        "reward_model.model.path": reward_model(root / "reward_model", Path(tiny["model_path"])),
        "reward_model.micro_batch_size_per_gpu": 4,
    }
    contexts = {
        "data.prompt_key": copies,
        "data.val_files": scorer,  # validation scores that depend on the answers
        "data.reward_fn_key": {**scorer, "custom_reward_function.name": "source_score"},
        "reward_model.enable": rm,
        "custom_reward_function.name": scorer,
        "custom_reward_function.reward_kwargs": scorer,
        "reward_manager.source": {k: v for k, v in manager.items() if k != "reward_manager.source"},
        "reward_manager.module.name": manager,
        "data.custom_cls.path": {"data.custom_cls.name": "ReversedRows"},
        "data.custom_cls.name": {"data.custom_cls.path": str(code)},
    }
    return values, contexts
