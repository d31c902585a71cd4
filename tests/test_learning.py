"""The digits task (data, tokenizer, reward) and the proof that GRPO and PPO learn it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jrl.assets import prepare_digits
from jrl.data import digits
from jrl.data.tokenizer import load_tokenizer
from jrl.reward import default_compute_score
from jrl.reward.digits import compute_score

ROOT = Path(__file__).resolve().parents[1]


def test_rows_are_seeded_disjoint_and_in_verl_schema():
    rows = digits.make_rows(300, 50, seed=3, num_digits=3)
    assert rows == digits.make_rows(300, 50, seed=3, num_digits=3)
    assert rows != digits.make_rows(300, 50, seed=4, num_digits=3)
    prompts = {split: [r["prompt"][0]["content"] for r in rows[split]] for split in rows}
    assert len(set(prompts["train"])) == 300 and len(set(prompts["test"])) == 50
    assert not set(prompts["train"]) & set(prompts["test"])
    row = rows["test"][7]
    text = row["prompt"][0]["content"]
    assert len(text) == 4 and text[:3].isdigit() and text.endswith("=")
    assert row["data_source"] == "jrl/digits" and row["prompt"][0]["role"] == "user"
    assert row["reward_model"] == {"style": "rule", "ground_truth": text[0]}
    assert row["extra_info"] == {"split": "test", "index": 7}


def test_rows_refuse_more_prompts_than_exist():
    with pytest.raises(ValueError, match="at most 100, the number of distinct 2-digit prompts"):
        digits.make_rows(90, 20, num_digits=2)
    with pytest.raises(ValueError, match="num_digits must be at least 1"):
        digits.make_rows(1, 1, num_digits=0)


def test_cli_writes_both_splits(tmp_path):
    paths = digits.main(["--local_dir", str(tmp_path), "--train_size", "20", "--test_size", "5"])
    assert [p.name for p in paths] == ["train.parquet", "test.parquet"]
    table = pq.read_table(tmp_path / "test.parquet")
    assert table.num_rows == 5
    assert set(table.column_names) == {
        "data_source",
        "prompt",
        "ability",
        "reward_model",
        "extra_info",
    }


def test_tokenizer_has_one_token_per_character_also_when_loaded_from_the_model():
    built = load_tokenizer(prepare_digits()["model_path"])  # transformers picks its qwen2 class
    assert len(built) == len(digits.VOCABULARY)
    text = built.apply_chat_template(
        [{"role": "user", "content": "3718="}], add_generation_prompt=True, tokenize=False
    )
    assert text == "3718="
    ids = built(text, add_special_tokens=False)["input_ids"]
    assert [digits.VOCABULARY[i] for i in ids] == list("3718=")
    eos = built.eos_token_id
    assert built.pad_token_id == eos == digits.VOCABULARY.index(digits.EOS_TOKEN)
    assert built.decode([ids[0], ids[1], eos], skip_special_tokens=True) == "37"


@pytest.mark.parametrize(
    "answer, score",
    [("3", 1.0), ("37", 1.0), (" 3=", 1.0), ("7", 0.0), ("=3", 0.0), ("", 0.0)],
)
def test_score_is_the_first_answer_token(answer, score):
    assert compute_score(answer, "3") == score
    assert default_compute_score("jrl/digits", answer, "3") == score


@pytest.mark.parametrize("model", ["digits", "digits_moe"])
def test_grpo_and_ppo_raise_held_out_accuracy_far_above_noise(tmp_path, model):
    """bench/learning.py, one fixed seed, 60 steps per algorithm (about a minute on 2 cores),
    with the dense tiny model and with the tiny mixture of experts (Qwen3-MoE).

    The untrained greedy policy scores 0 on the 256 held-out prompts (a constant non-digit
    answer), and 0.99-1.0 after 60 steps for seeds 0, 1, 2 and two other model inits; with the
    advantages zeroed or sign-flipped it stays at 0. The mixture of experts reaches 1.0 too.
    """
    out = tmp_path / "learning"
    cmd = [sys.executable, "bench/learning.py", "--model", model, "--seeds", "0", "--steps", "60"]
    cmd += ["--test-freq", "30", "--out", str(out)]
    env = {**os.environ, "XLA_FLAGS": ""}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = {r["algo"]: r for r in map(json.loads, proc.stdout.splitlines()) if "seed" in r}
    assert set(runs) == {"grpo", "ppo"}
    for algo, run in runs.items():
        assert run["steps"] == 60, run
        assert run["before"] <= 0.2, (algo, run)
        assert run["after"] >= 0.8, (algo, run)
    curves = [json.loads(line) for line in (out / "learning.jsonl").read_text().splitlines()]
    for algo in runs:
        validated = [c["step"] for c in curves if c["algo"] == algo and "val_accuracy" in c]
        assert validated == [0, 30, 60]
        assert len([c for c in curves if c["algo"] == algo and "train_reward" in c]) == 60
    assert (out / "learning.png").exists() or "no matplotlib" in proc.stderr
