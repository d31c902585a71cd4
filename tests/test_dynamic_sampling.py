"""DAPO's dynamic sampling (``data.gen_batch_size``, ``algorithm.filter_groups``): the group filter
against a loop written from its formula, accumulation and trimming across generation batches,
the ``max_num_gen_batches`` limit, the config's checks, verl's DAPO recipe config on the digits
task, steps of exactly ``train_batch_size`` prompts, the end of the data, and exact resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import digits_scale

from jrl import train
from jrl.batch import Batch
from jrl.config import ConfigError
from jrl.runspec import load_config
from jrl.runspec.dynamic_sampling import FilterGroups
from jrl.runspec.spec import resolve_run
from jrl.trainer.ppo.dynamic_sampling import GroupCollector, kept_rows, row_metric
from jrl.trainer.ppo.trainer import PPOTrainer

DIGITS = "--config=configs/digits_grpo.py"  # 16 prompts x 8 answers a step
FILTER = ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=seq_reward"]
QUIET = ["trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.logger=['console']"]
TIME_DEPENDENT = ("timing_s/", "timing_per_token_ms/", "perf/")


def _reference_keep(uids: list[str], values: list[float]) -> list[bool]:
    """verl's rule, row by row: a group is kept when its values' std is > 0 or it has one row."""
    groups: dict[str, list[float]] = {}
    for uid, value in zip(uids, values, strict=True):
        groups.setdefault(uid, []).append(value)
    keep = {}
    for uid, members in groups.items():
        mean = sum(members) / len(members)
        std = (sum((m - mean) ** 2 for m in members) / len(members)) ** 0.5
        keep[uid] = std > 0 or len(members) == 1
    return [keep[uid] for uid in uids]


def test_kept_rows_match_the_formula_on_random_groups():
    rng = np.random.default_rng(0)
    uids, values = [], []
    for group in range(40):
        size = int(rng.choice([1, 2, 4, 8]))
        constant = rng.random() < 0.5
        draws = np.full(size, float(rng.integers(0, 2))) if constant else rng.integers(0, 2, size)
        uids += [f"g{group}"] * size
        values += [float(v) for v in draws]
    order = rng.permutation(len(uids))  # groups need not be contiguous
    uids, values = [uids[i] for i in order], [values[i] for i in order]
    got = kept_rows(np.array(uids, dtype=object), np.array(values))
    assert got.tolist() == _reference_keep(uids, values)
    assert 0 < got.sum() < len(uids)  # both kinds of group occur
    singles = [uid for uid in set(uids) if uids.count(uid) == 1]
    assert singles and all(got[uids.index(uid)] for uid in singles)


def _scored(uids: list[str], scores: list[float], kl: float = 0.0) -> Batch:
    """Rows of 3 response tokens with the score on the last one."""
    tokens = np.zeros((len(uids), 3), np.float32)
    tokens[:, -1] = scores
    tensors = {"token_level_scores": tokens, "responses": np.zeros((len(uids), 3), np.int32)}
    if kl:
        tensors["token_level_rewards"] = tokens - kl
    return Batch(tensors, {"uid": np.array(uids, dtype=object)})


def test_row_metric_reads_scores_final_rewards_or_an_extra_info_column():
    batch = _scored(["a", "a"], [1.0, 0.0], kl=0.25)
    assert row_metric(batch, {}, "seq_reward").tolist() == [1.0, 0.0]
    assert row_metric(batch, {}, "seq_final_reward").tolist() == [1.0 - 0.75, -0.75]
    plain = _scored(["a", "a"], [1.0, 0.0])
    assert row_metric(plain, {}, "seq_final_reward").tolist() == [1.0, 0.0]
    assert row_metric(plain, {"acc": [True, False]}, "acc").tolist() == [1.0, 0.0]
    with pytest.raises(ValueError, match="metric='score' is not a column.*it has: acc"):
        row_metric(plain, {"acc": [1, 0]}, "score")


def _settings(train_batch_size: int, limit: int = 0, metric: str = "acc") -> FilterGroups:
    return FilterGroups(metric=metric, train_batch_size=train_batch_size, max_num_gen_batches=limit)


def test_collector_gathers_kept_groups_across_batches_and_trims_in_order():
    collector = GroupCollector(_settings(train_batch_size=3))
    # Batch 1: groups 0 and 2 vary, group 1 does not (acc all 1).
    first = _scored(["0", "0", "1", "1", "2", "2"], [0, 0, 0, 0, 0, 0])
    collector.add(first, {"acc": [1, 0, 1, 1, 0, 1], "note": ["a", "b", "c", "d", "e", "f"]})
    assert (collector.kept, collector.filtered, collector.full) == (2, 1, False)
    collector.check_limit(step=1, gen_batch_size=3)  # no limit
    # Batch 2: groups 3 and 5 vary; only the first (3) is needed; 5 is surplus.
    second = _scored(["3", "3", "4", "4", "5", "5"], [0] * 6)
    collector.add(second, {"acc": [0, 1, 0, 0, 1, 0]})
    assert collector.full
    batch, extra = collector.batch()
    assert batch.meta["uid"].tolist() == ["0", "0", "2", "2", "3", "3"]
    assert extra["acc"] == [1, 0, 0, 1, 0, 1]
    assert extra["note"] == ["a", "b", "e", "f", None, None]  # a column one batch lacked
    assert collector.metrics() == {
        "train/num_gen_batches": 2.0,
        "training/filter_groups/evicted_samples": 2.0,
        "training/filter_groups/discarded_surplus_samples": 1.0,
    }


def test_max_num_gen_batches_stops_a_step_that_cannot_fill():
    collector = GroupCollector(_settings(train_batch_size=2, limit=2))
    flat = _scored(["0", "0", "1", "1"], [0] * 4)
    collector.add(flat, {"acc": [1, 1, 0, 0]})
    collector.check_limit(step=5, gen_batch_size=2)  # 1 < 2 batches: go on
    collector.add(flat, {"acc": [1, 1, 0, 0]})
    with pytest.raises(ValueError) as error:
        collector.check_limit(step=5, gen_batch_size=2)
    message = str(error.value)
    assert "step 5: 2 generation batches" in message and "kept only 0 of the 2" in message
    assert "raise algorithm.filter_groups.max_num_gen_batches (0: no limit)" in message
    unlimited = GroupCollector(_settings(train_batch_size=2, limit=0))
    for _ in range(20):
        unlimited.add(flat, {"acc": [1, 1, 0, 0]})
    unlimited.check_limit(step=5, gen_batch_size=2)


@pytest.mark.parametrize(
    "overrides, error",
    [
        (["algorithm.filter_groups.enable=True"], "algorithm.filter_groups.enable=True needs "),
        (["data.gen_batch_size=8"], "data.gen_batch_size=8 differs from data.train_batch_size=4"),
        ([*FILTER, "data.gen_batch_size=0"], "data.gen_batch_size=0 must be positive"),
        (
            [
                *FILTER[:1],
                "algorithm.filter_groups.metric=seq_final_reward",
                "algorithm.use_kl_in_reward=True",
            ],
            "metric=seq_final_reward with algorithm.use_kl_in_reward=True",
        ),
        (
            [*FILTER, "algorithm.filter_groups.max_inflight_gen_batches=3"],
            "max_inflight_gen_batches=3: generation batches pending at once are not implemented",
        ),
    ],
)
def test_config_errors_name_the_keys(overrides, error):
    with pytest.raises(ConfigError, match=error):
        load_config(["--config=configs/gsm8k_grpo.py:tiny", *overrides])


def test_settings_are_resolved_once():
    config, _ = load_config(["--config=configs/gsm8k_grpo.py:tiny", *FILTER])
    run = resolve_run(config)
    assert run.algorithm.filter_groups == _settings(4, limit=0, metric="seq_reward")
    inflight = "algorithm.filter_groups.max_inflight_gen_batches"
    assert inflight in run.keys.skipped  # current verl's default, 1: one batch at a time
    assert run.data.gen_batch_size == 4  # null: the train batch
    config, _ = load_config(["--config=configs/gsm8k_grpo.py:tiny", "data.gen_batch_size=4"])
    assert resolve_run(config).algorithm.filter_groups is None


# verl v0.6.0's recipe/dapo/run_dapo_qwen2.5_32b.sh, its DAPO keys at the digits task's scale
# (train_prompt_bsz 512 -> 16, gen_prompt_bsz = 3 x train, n 16 -> 8, mini-batch 32 -> 8,
# response 20480 with a 4096 buffer -> 2 with a buffer of 1), over --config-name=dapo_trainer.
DAPO_SCRIPT = [
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "algorithm.kl_ctrl.kl_coef=0.0",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "actor_rollout_ref.actor.kl_loss_coef=0.0",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.clip_ratio_c=10.0",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.grad_clip=1.0",
    "actor_rollout_ref.actor.optim.weight_decay=0.1",
    "data.max_response_length=2",
    "data.gen_batch_size=48",
    "data.train_batch_size=16",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "algorithm.filter_groups.enable=True",
    "algorithm.filter_groups.max_num_gen_batches=10",
    "algorithm.filter_groups.metric=acc",
    "reward_model.reward_manager=dapo",
    "reward_model.overlong_buffer.enable=True",
    "reward_model.overlong_buffer.len=1",
    "reward_model.overlong_buffer.penalty_factor=1.0",
    "trainer.total_epochs=1",
]


def test_verl_dapo_recipe_config_runs_two_steps(tmp_path):
    argv = ["--config-name=dapo_trainer", *DAPO_SCRIPT, *digits_scale(tmp_path / "run")]
    config, _ = load_config(argv)
    assert config.trainer.project_name == "verl-dapo"  # the recipe's own layer
    assert config.reward_model.overlong_buffer.penalty_factor == 1.0
    metrics = train.main(argv)
    assert metrics["training/global_step"] == 2
    assert metrics["train/num_gen_batches"] >= 1
    assert "val-core/jrl/digits/acc/mean@1" in metrics
    assert np.isfinite(metrics["actor/pg_loss"])


def _trainer(tmp_path: Path, *overrides: str) -> PPOTrainer:
    config, _ = load_config(
        [DIGITS, *FILTER, *QUIET, f"trainer.default_local_dir={tmp_path}", *overrides]
    )
    return PPOTrainer(resolve_run(config))


def test_a_step_draws_generation_batches_until_train_batch_size_prompts_vary(tmp_path):
    trainer = _trainer(tmp_path, "data.gen_batch_size=8")  # at least 2 batches of 8 a step
    epoch, prompts = next(trainer.batches())
    output = trainer.train_step(prompts, step=1, epoch=epoch, timing={})
    drawn = output.metrics["train/num_gen_batches"]
    assert drawn >= 2
    assert trainer.train_loader.get_state() == {"epoch": 0, "position": drawn}
    batch = output.batch
    assert len(batch) == 16 * 8  # train_batch_size x n
    uids, counts = np.unique(batch.meta["uid"], return_counts=True)
    assert len(uids) == 16 and set(counts) == {8}
    rewards = np.asarray(batch.tensors["token_level_scores"]).sum(-1)
    for uid in uids:
        assert np.std(rewards[batch.meta["uid"] == uid]) > 0
    surplus = output.metrics["training/filter_groups/discarded_surplus_samples"]
    evicted = output.metrics["training/filter_groups/evicted_samples"]
    assert 16 + surplus + evicted == 8 * drawn


def test_data_that_runs_out_ends_the_run_after_the_last_step(tmp_path, capsys):
    # 40 prompts: five batches of 8; a step takes at least two, so the third step runs out.
    run_dir = tmp_path / "run"
    argv = [DIGITS, *FILTER, *QUIET, "data.gen_batch_size=8", "data.train_max_samples=40"]
    metrics = train.main([*argv, "trainer.total_epochs=1", f"trainer.default_local_dir={run_dir}"])
    step = int(metrics["training/global_step"])
    assert 1 <= step <= 2
    assert f"stopped after step {step} on the end of the data (step {step + 1} kept" in (
        capsys.readouterr().out
    )
    assert (run_dir / f"global_step_{step}").is_dir()


def _metrics(path: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {
        row["step"]: {k: v for k, v in row["data"].items() if not k.startswith(TIME_DEPENDENT)}
        for row in rows
    }


def test_resume_with_generation_batches_is_exact(tmp_path, monkeypatch, capsys):
    """Steps of 2 or 3 generation batches of 8 prompts: a run resumed from step 2 logs what the
    uninterrupted run logged at steps 3 and 4, bitwise."""
    argv = [DIGITS, *FILTER, *QUIET, "data.gen_batch_size=8", "trainer.total_training_steps=4"]
    argv += ["trainer.save_freq=2", "trainer.logger=['console','file']"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    monkeypatch.setenv("JRL_FILE_LOGGER_PATH", str(whole / "metrics.jsonl"))
    train.main([*argv, f"trainer.default_local_dir={whole}"])
    reference = _metrics(whole / "metrics.jsonl")
    assert sorted(reference) == [1, 2, 3, 4]
    assert {reference[s]["train/num_gen_batches"] for s in reference} != {1.0}
    resumed.mkdir()
    shutil.copytree(whole / "global_step_2", resumed / "global_step_2")
    (resumed / "latest_checkpointed_iteration.txt").write_text("2")
    monkeypatch.setenv("JRL_FILE_LOGGER_PATH", str(resumed / "metrics.jsonl"))
    train.main([*argv, f"trainer.default_local_dir={resumed}"])
    assert "at global step 2" in capsys.readouterr().out
    again = _metrics(resumed / "metrics.jsonl")
    assert sorted(again) == [3, 4]
    for step in (3, 4):
        assert again[step] == reference[step], step


ECHO_SCORER = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    score = (len(solution_str) % 5) / 4
    return {"score": score, "echo": score}
"""


def test_balanced_rows_keep_their_own_extra_infos_in_the_dump(tmp_path):
    """With ``trainer.balance_batch`` the kept rows are reordered after the filter; the reward's
    extra-info columns move with them, so each dumped row's ``echo`` is the score of its own
    output (the dump's ``score`` is the reward's column of that name too)."""
    scorer = tmp_path / "scorer.py"
    scorer.write_text(ECHO_SCORER)
    trainer = _trainer(
        tmp_path,
        "data.gen_batch_size=8",
        "trainer.balance_batch=True",
        "trainer.n_gpus_per_node=2",  # two shards: balancing reorders the rows
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        f"custom_reward_function.path={scorer}",
        f"trainer.rollout_data_dir={tmp_path / 'dump'}",
    )
    assert trainer.run.trainer.balance_batch
    epoch, prompts = next(trainer.batches())
    trainer.train_step(prompts, step=1, epoch=epoch, timing={})
    rows = [json.loads(line) for line in (tmp_path / "dump" / "1.jsonl").read_text().splitlines()]
    assert len(rows) == 16 * 8
    assert len({row["score"] for row in rows}) > 1
    assert all(row["echo"] == (len(row["output"]) % 5) / 4 for row in rows)
