"""`reward_model.enable`: a sequence-classification reward model scores responses in training."""

from __future__ import annotations

import math

import pytest

from jrl import train
from jrl.assets import prepare_tiny
from jrl.data.tokenizer import load_tokenizer
from jrl.models import ModelConfig, from_pretrained, init_random, save_pretrained


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    paths = prepare_tiny()
    policy = from_pretrained(paths["model_path"])
    config = ModelConfig.from_hf({**policy.config.to_hf(), "num_hidden_layers": 1})
    out = tmp_path_factory.mktemp("rm") / "reward_model"
    save_pretrained(
        init_random(config, kind="reward", seed=3),
        out,
        tokenizer=load_tokenizer(paths["model_path"]),
    )
    return out


@pytest.mark.parametrize("input_tokenizer", ["null", "same"], ids=["policy-tokens", "retemplate"])
def test_reward_model_scores_drive_training(reward_model_dir, input_tokenizer, tmp_path):
    tokenizer = reward_model_dir if input_tokenizer == "same" else "null"
    metrics = train.main(
        [
            "--config=configs/gsm8k_grpo.py:tiny",
            f"trainer.default_local_dir={tmp_path}",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            "reward_model.enable=True",
            f"reward_model.model.path={reward_model_dir}",
            f"reward_model.model.input_tokenizer={tokenizer}",
            "reward_model.micro_batch_size_per_gpu=4",
        ]
    )
    # a random reward model gives non-zero scores, where the rule scorer gives 0 on a random policy
    assert metrics["critic/score/mean"] != 0.0
    assert math.isfinite(metrics["critic/score/mean"]) and math.isfinite(metrics["actor/pg_loss"])
    assert metrics["critic/score/max"] != metrics["critic/score/min"]
