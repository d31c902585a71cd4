"""verl's step metrics on hand-made batches: lengths from the attention mask (a multi-turn row's
tool tokens count), aborted rows, turns, per-token timings; and the loop's step timer, which
leaves validation and the checkpoint out, as verl's does."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from jrl.batch import Batch
from jrl.trainer.io.metrics import data_metrics, throughput_metrics
from jrl.trainer.loop.fit import Cadence, StepOutput, run_step


def multi_turn_batch() -> Batch:
    """3 rows, prompts of width 3 and responses of width 4. Row 0: a turn, a tool answer of 2
    tokens (attended, not trained) and a turn; row 1 fills the width; row 2 is aborted (no
    response token)."""
    attention = np.array(
        [
            [0, 1, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 1, 1],
            [0, 0, 1, 0, 0, 0, 0],
        ]
    )
    response_mask = np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]])
    scores = np.zeros((3, 4), np.float32)
    scores[:, 0] = [1.0, 3.0, -5.0]
    return Batch(
        {
            "attention_mask": attention,
            "responses": np.ones((3, 4), np.int32),
            "response_mask": response_mask,
            "token_level_scores": scores,
            "token_level_rewards": scores,
            "advantages": np.ones((3, 4), np.float32),
            "returns": np.ones((3, 4), np.float32),
        },
        meta={"num_turns": np.array([4, 2, 2])},
    )


def test_data_metrics_count_as_verl():
    metrics = data_metrics(multi_turn_batch(), use_critic=False)
    assert metrics["response_length/mean"] == pytest.approx((4 + 4 + 0) / 3)
    assert metrics["response_length/clip_ratio"] == pytest.approx(2 / 3)
    assert metrics["response_length_non_aborted/mean"] == 4
    assert metrics["response_length_non_aborted/min"] == 4
    assert metrics["response_length_non_aborted/clip_ratio"] == 1
    assert metrics["response/aborted_ratio"] == pytest.approx(1 / 3)
    # scores and rewards over the rows with a response only
    assert (metrics["critic/score/mean"], metrics["critic/score/min"]) == (2.0, 1.0)
    assert metrics["critic/rewards/max"] == 3.0
    assert metrics["prompt_length/mean"] == pytest.approx((2 + 3 + 1) / 3)
    assert metrics["prompt_length/clip_ratio"] == pytest.approx(1 / 3)
    assert (metrics["num_turns/min"], metrics["num_turns/max"]) == (2, 4)
    assert metrics["num_turns/mean"] == pytest.approx(8 / 3)


def test_explained_variance_is_torchs_unbiased_one():
    batch = multi_turn_batch()
    returns = np.zeros((3, 4), np.float32)  # variances near verl's 1e-5, where n - 1 shows
    returns[:2] = [[0.0, 9, 9, 0.002], [0.004, 0.006, 0.008, 0.010]]  # 9: not in response_mask
    values = np.zeros((3, 4), np.float32)
    batch = batch.union(Batch({"values": values}))
    batch.tensors["returns"] = returns
    metrics = data_metrics(batch, use_critic=True)
    variance = np.var(np.arange(6) * 0.002, ddof=1)  # the six response tokens' returns
    expected = 1 - variance / (variance + 1e-5)  # 0.417; n instead of n - 1 gives 0.461
    assert metrics["critic/vf_explained_var"] == pytest.approx(expected, rel=1e-4)


def test_the_token_count_is_exact_past_float32s_integers():
    rows, width = 4097, 4096  # 4097 * 4097 - 2 tokens: an odd count above 2**24, float32 rounds
    attention = np.ones((rows, width + 1), np.int8)
    attention[:2, 0] = 0
    batch = Batch({"attention_mask": attention, "responses": np.ones((rows, 1), np.int32)})
    metrics = throughput_metrics(batch, {"step": 1.0}, n_gpus=1)
    assert metrics["perf/total_num_tokens"] == rows * (width + 1) - 2


def test_per_token_timings_count_the_attended_response():
    timing = {"step": 2.0, "gen": 0.8, "update_actor": 1.4}
    metrics = throughput_metrics(multi_turn_batch(), timing, n_gpus=2)
    assert metrics["perf/total_num_tokens"] == 6 + 8
    assert metrics["timing_per_token_ms/gen"] == pytest.approx(1000 * 0.8 / 8)
    assert metrics["timing_per_token_ms/update_actor"] == pytest.approx(1000 * 1.4 / 14)
    assert metrics["perf/throughput"] == pytest.approx(14 / (2.0 * 2))


class SlowValidation:
    """The loop's side of an algorithm whose validation and checkpoint take a while."""

    name = "slow"
    vocab_size = 8
    cadence = Cadence(total_steps=2, test_freq=1, save_freq=1)
    checkpoints = SimpleNamespace(latest=lambda: "none")

    def train_step(self, batch, step, epoch, timing):
        return StepOutput({}, batch)

    def validate(self, step):
        time.sleep(0.3)
        return {"val-core/x/reward/mean@1": 1.0}

    def save_checkpoint(self, step):
        time.sleep(0.2)

    def step_metrics(self, output, step, epoch, timing):
        return {f"timing_s/{name}": seconds for name, seconds in timing.items()}


def test_the_step_timer_leaves_validation_and_saving_out():
    metrics = run_step(SlowValidation(), Batch(), step=1, epoch=0)
    assert metrics["timing_s/testing"] >= 0.3 and metrics["timing_s/save_checkpoint"] >= 0.2
    assert metrics["timing_s/step"] < 0.1
    assert metrics["val-core/x/reward/mean@1"] == 1.0
