"""verl's generation dumps: the JSONL writer, and a tiny GRPO run with ``rollout_data_dir`` and
``validation_data_dir`` set."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jrl import train
from jrl.data.loader import DataLoader
from jrl.data.rl_dataset import create_rl_dataset
from jrl.data.tokenizer import load_tokenizer
from jrl.runspec import load_config
from jrl.runspec.spec import resolve_run
from jrl.trainer.io.generations import write_generations

CARD = "--config=configs/gsm8k_grpo.py:tiny"
SCORER = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": (len(solution_str) % 5) / 4, "length": len(solution_str)}
"""


def _rows(path: Path) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n") and not text.endswith("\n\n")
    return [json.loads(line) for line in text.splitlines()]


def test_writer_format_and_matching_extra_infos(tmp_path):
    path = write_generations(
        tmp_path / "dumps",
        7,
        ["2+2=", "ünï"],
        ["4", "ok"],
        ["4", None],
        [1.0, 0.0],
        {"acc": [True, False], "pred": ["4", "x"], "summary": ["one value"]},
    )
    assert path == tmp_path / "dumps" / "7.jsonl"
    assert "ünï" in path.read_text(encoding="utf-8")  # ensure_ascii=False
    base = ["input", "output", "gts", "score", "step", "acc", "pred"]
    assert _rows(path) == [
        dict(zip(base, ["2+2=", "4", "4", 1.0, 7, True, "4"], strict=True)),
        dict(zip(base, ["ünï", "ok", None, 0.0, 7, False, "x"], strict=True)),
    ]


def test_writer_replaces_a_file_whole_and_leaves_no_temp_file(tmp_path, monkeypatch):
    old = "".join(json.dumps({"input": f"old {i}"}) + "\n" for i in range(50))
    (tmp_path / "3.jsonl").write_text(old)
    write_generations(tmp_path, 3, ["new"], ["out"], [None], [0.5], {})
    assert [row["input"] for row in _rows(tmp_path / "3.jsonl")] == ["new"]
    assert os.listdir(tmp_path) == ["3.jsonl"]

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_generations(tmp_path, 3, ["newer"], ["out"], [None], [0.5], {})
    assert [row["input"] for row in _rows(tmp_path / "3.jsonl")] == ["new"]
    assert os.listdir(tmp_path) == ["3.jsonl"]


def _first_batch_prompts(config) -> Counter:
    """(decoded prompt, ground truth) of the run's first training batch, each rollout.n times."""
    tokenizer = load_tokenizer(config.actor_rollout_ref.model.path)
    dataset = create_rl_dataset(config.data.train_files, tokenizer, config.data)
    loader = DataLoader(
        dataset,
        config.data.train_batch_size,
        shuffle=config.data.shuffle,
        seed=resolve_run(config).trainer.seed,
    )
    batch = next(iter(loader.epoch(0)))
    texts = tokenizer.batch_decode(batch.tensors["input_ids"], skip_special_tokens=True)
    gts = [info["ground_truth"] for info in batch.meta["reward_model"]]
    return Counter(list(zip(texts, gts, strict=True)) * config.actor_rollout_ref.rollout.n)


def test_tiny_run_dumps_rollout_and_validation_generations(tmp_path, capsys):
    scorer = tmp_path / "scorer.py"
    scorer.write_text(SCORER)  # scores that differ between answers, and one extra info
    args = [
        CARD,
        f"custom_reward_function.path={scorer}",
        "trainer.total_training_steps=1",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        f"trainer.rollout_data_dir={tmp_path / 'rollout'}",
        f"trainer.validation_data_dir={tmp_path / 'val'}",
    ]
    metrics = train.main(args)
    config, _ = load_config(args)

    rollout = _rows(tmp_path / "rollout" / "1.jsonl")
    assert len(rollout) == config.data.train_batch_size * config.actor_rollout_ref.rollout.n
    # reward_fault: the custom function's fault per row ("" for none), as it runs contained
    assert list(rollout[0]) == ["input", "output", "gts", "score", "step", "length", "reward_fault"]
    assert all(row["step"] == 1 and row["reward_fault"] == "" for row in rollout)
    assert any(row["score"] for row in rollout)
    mean_score = sum(row["score"] for row in rollout) / len(rollout)
    assert mean_score == pytest.approx(metrics["critic/score/mean"], abs=1e-6)
    assert Counter((row["input"], row["gts"]) for row in rollout) == _first_batch_prompts(config)
    assert "timing_s/dump_rollout_generations" in metrics
    assert sorted(os.listdir(tmp_path / "rollout")) == ["1.jsonl"]

    tokenizer = load_tokenizer(config.actor_rollout_ref.model.path)
    val_data = create_rl_dataset(
        config.data.val_files, tokenizer, config.data, max_samples=config.data.val_max_samples
    )
    val_n = config.actor_rollout_ref.rollout.val_kwargs.n
    val_gts = Counter([row["reward_model"]["ground_truth"] for row in val_data] * val_n)
    # inputs: the dataset's prompts, decoded as verl decodes them
    prompts = [tokenizer.decode(row["input_ids"], skip_special_tokens=True) for row in val_data]
    assert sorted(os.listdir(tmp_path / "val")) == ["0.jsonl", "1.jsonl"]
    for step in (0, 1):
        val = _rows(tmp_path / "val" / f"{step}.jsonl")
        assert len(val) == val_gts.total()
        assert all(row["step"] == step and row["reward"] == row["score"] for row in val)
        # verl's order: "reward" first among the extra infos, then the scorer's own
        assert list(val[0])[:7] == ["input", "output", "gts", "score", "step", "reward", "length"]
        assert all(isinstance(row["length"], int) for row in val)
        assert Counter(row["gts"] for row in val) == val_gts
        assert Counter(row["input"] for row in val) == Counter(prompts * val_n)
    last_val = [row["score"] for row in val]
    reward_mean = metrics["val-core/openai/gsm8k/reward/mean@1"]
    assert sum(last_val) / len(last_val) == pytest.approx(reward_mean, abs=1e-6)
    out = capsys.readouterr().out
    assert f"Dumped generations to {tmp_path / 'rollout' / '1.jsonl'}" in out


def test_the_datasets_own_uids_group_validation_rows(tmp_path):
    """As verl: a validation set with a ``uid`` column keeps it, so two rows of one uid are one
    group of two answers (mean@2), not two groups of one."""
    args = [CARD, "data.val_max_samples=4"]
    config, _ = load_config(args)
    rows = pq.read_table(config.data.val_files).to_pylist()[:4]
    for i, row in enumerate(rows):
        row["uid"] = f"q{i // 2}"
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "val.parquet")
    metrics = train.main(
        [
            *args,
            f"data.val_files={tmp_path / 'val.parquet'}",
            "trainer.val_only=true",
            "trainer.val_before_train=true",
            f"trainer.default_local_dir={tmp_path / 'run'}",
        ]
    )
    assert "val-core/openai/gsm8k/reward/mean@2" in metrics
    assert not any("@1" in key for key in metrics if key.startswith("val-core"))
