"""Validation metrics under verl's names and the validation samples shown to loggers."""

from __future__ import annotations

import numpy as np
import pytest

from jrl.trainer.ppo.validation import (
    answer_codes,
    majority_values,
    select_val_generations,
    subset_sizes,
    validation_metrics,
)


def _verl_draws(n: int, k: int) -> np.ndarray:
    """Bootstrap indices as verl draws them: the global numpy stream reseeded with 42."""
    saved = np.random.get_state()
    np.random.seed(42)
    draws = np.random.choice(n, size=(1000, k), replace=True)
    np.random.set_state(saved)
    return draws


def _vote(values: list[float], votes: list[str]) -> float:
    """verl's majority value of one draw: most common vote (first seen wins), its first value."""
    by_vote: dict[str, list[float]] = {}
    for value, vote in zip(values, votes, strict=True):
        by_vote.setdefault(vote, []).append(value)
    winner = max(by_vote, key=lambda v: len(by_vote[v]))
    return by_vote[winner][0]


def test_subset_sizes():
    assert [subset_sizes(n) for n in (1, 2, 3, 4, 5, 8)] == [
        [],
        [2],
        [2, 3],
        [2, 4],
        [2, 4, 5],
        [2, 4, 8],
    ]


def test_single_sample_gives_mean_at_1_only():
    sources = ["openai/gsm8k"] * 3 + ["math"] * 2
    metrics = validation_metrics(
        sources, [f"u{i}" for i in range(5)], {"reward": [1.0, 0.0, 1.0, 0.0, 0.5]}
    )
    assert metrics == {
        "val-core/openai/gsm8k/reward/mean@1": pytest.approx(2 / 3),
        "val-core/math/reward/mean@1": 0.25,
    }


def test_four_samples_mean_std_and_bootstrap():
    rewards = [1.0, 0.0, 0.0, 1.0, 0.2, 0.4, 0.6, 0.8]
    uids = ["a"] * 4 + ["b"] * 4
    metrics = validation_metrics(["src"] * 8, uids, {"reward": rewards})
    assert metrics["val-core/src/reward/mean@4"] == pytest.approx((0.5 + 0.5) / 2)
    assert metrics["val-aux/src/reward/std@4"] == pytest.approx((0.5 + np.sqrt(0.05)) / 2)
    per_prompt = [np.array(rewards[:4]), np.array(rewards[4:])]
    for k, section in ((2, "val-aux"), (4, "val-core")):
        draws = _verl_draws(4, k)
        best = [[max(v[i] for i in row) for row in draws] for v in per_prompt]
        worst = [[min(v[i] for i in row) for row in draws] for v in per_prompt]
        for name, stats, where in (("best", best, section), ("worst", worst, "val-aux")):
            assert metrics[f"{where}/src/reward/{name}@{k}/mean"] == pytest.approx(
                np.mean([np.mean(s) for s in stats])
            )
            assert metrics[f"{where}/src/reward/{name}@{k}/std"] == pytest.approx(
                np.mean([np.std(s) for s in stats])
            )
    assert 0.5 < metrics["val-core/src/reward/best@4/mean"] < 1.0
    assert len(metrics) == 2 + 2 * 2 * 2  # mean, std; (best, worst) x (mean, std) x k in {2, 4}


def test_prompts_with_different_sample_counts_average_separately():
    metrics = validation_metrics(
        ["s"] * 6, ["a", "a", "b", "b", "b", "b"], {"reward": [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]}
    )
    assert metrics["val-aux/s/reward/mean@2"] == 0.5
    assert metrics["val-core/s/reward/mean@4"] == 0.75
    assert metrics["val-aux/s/reward/best@2/mean"] < metrics["val-core/s/reward/best@4/mean"]


def test_acc_is_core_and_pred_gives_majority_votes():
    acc = [1, 0, 0, 1, 1, 1, 0, 0]
    preds = ["7", "3", "3", "7", "5", "5", "2", "9"]
    metrics = validation_metrics(
        ["gsm8k"] * 8,
        ["a"] * 4 + ["b"] * 4,
        {"reward": [float(a) for a in acc], "acc": acc, "pred": preds},
    )
    core = sorted(k for k in metrics if k.startswith("val-core/"))
    assert core == [
        f"val-core/gsm8k/acc/{m}"
        for m in ("best@4/mean", "best@4/std", "maj@4/mean", "maj@4/std", "mean@4")
    ]
    assert not any("/pred/" in k for k in metrics)
    assert "val-aux/gsm8k/reward/maj@4/mean" in metrics
    for k in (2, 4):
        draws = _verl_draws(4, k)
        stats = [
            [_vote([acc[o + i] for i in row], [preds[o + i] for i in row]) for row in draws]
            for o in (0, 4)
        ]
        where = "val-core" if k == 4 else "val-aux"
        assert metrics[f"{where}/gsm8k/acc/maj@{k}/mean"] == pytest.approx(
            np.mean([np.mean(s) for s in stats])
        )
        assert metrics[f"{where}/gsm8k/acc/maj@{k}/std"] == pytest.approx(
            np.mean([np.std(s) for s in stats])
        )


def test_majority_ties_go_to_the_first_answer_in_the_draw():
    values = np.array([[1.0, 0.0, 0.5, 0.25], [0.1, 0.2, 0.3, 0.4]])
    codes = np.array([answer_codes(["a", "b", "b", "a"]), answer_codes(["x", "y", "z", "y"])])
    draws = np.array([[0, 1, 2, 3], [1, 0, 3, 2], [2, 2, 0, 3], [3, 3, 3, 1]])
    np.testing.assert_array_equal(
        majority_values(values, codes, draws),
        [[1.0, 0.0, 0.5, 0.25], [0.2, 0.2, 0.3, 0.4]],
    )


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="'acc' has 1 values for 2 samples"):
        validation_metrics(["s", "s"], ["a", "a"], {"reward": [1.0, 0.0], "acc": [1]})
    with pytest.raises(ValueError, match="1 uids for 2 samples"):
        validation_metrics(["s", "s"], ["a"], {"reward": [1.0, 0.0]})
    with pytest.raises(ValueError, match="'score' mixes numbers"):
        validation_metrics(["s", "s"], ["a", "a"], {"reward": [1.0, 0.0], "score": [1.0, None]})


def test_logged_generations_follow_verls_sort_and_shuffle():
    inputs = [f"q{i:02d}" for i in range(12)][::-1]
    outputs = [f"a{i}" for i in range(12)]
    scores = [float(i) for i in range(12)]
    rows = select_val_generations(inputs, outputs, scores, step=3, count=5)

    samples = sorted(zip(inputs, outputs, scores, strict=True), key=lambda s: s[0])
    np.random.RandomState(42).shuffle(samples)
    assert rows == [{"input": i, "output": o, "score": s, "step": 3} for i, o, s in samples[:5]]

    shuffled = np.random.default_rng(1).permutation(12)
    again = select_val_generations(
        [inputs[i] for i in shuffled],
        [outputs[i] for i in shuffled],
        [scores[i] for i in shuffled],
        step=3,
        count=5,
    )
    assert again == rows  # the same prompts whatever order validation produced them in
    assert select_val_generations(inputs, outputs, scores, step=0, count=0) == []
    assert len(select_val_generations(inputs, outputs, scores, step=0, count=50)) == 12
    with pytest.raises(ValueError, match="log_val_generations must be >= 0"):
        select_val_generations(inputs, outputs, scores, step=0, count=-1)
