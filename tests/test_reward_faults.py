"""A user's reward function cannot take a run down: every bad behaviour (raise, hang, crash, NaN,
inf, a non-number, a huge object) becomes a per-row outcome that is counted and named in the log;
``custom_reward_function.on_error=raise`` keeps verl's fail-first strictness."""

import json
import math
import re
import signal
import time

import numpy as np
import pytest
from helpers import WatchedRun, row_scores, text_batch

from jrl import train
from jrl.config import default_config
from jrl.reward import load_reward_manager
from jrl.reward.guard import (
    FAULT_METRICS,
    RewardFault,
    checked_score,
    fault_metrics,
    finite_rewards,
)
from jrl.runspec.reads import KeyReads
from jrl.runspec.reward import reward_settings

# Each response names the fault its row triggers; "#### 7" and "#### 8" are scored honestly.
FAULTY_SCORER = """
import math
import os
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "raise":
        raise ValueError("cannot grade this row")
    if solution_str == "hang":
        time.sleep(600)
    if solution_str == "crash":
        os._exit(7)
    if solution_str == "nan":
        return math.nan
    if solution_str == "inf":
        return {"score": -math.inf, "note": "inf"}
    if solution_str == "string":
        return "zero"
    if solution_str == "huge":
        return "x" * 20_000_000
    return float(solution_str == "#### " + ground_truth)
"""

# For the training run: every 8th call misbehaves, cycling through the faults. The calls are
# counted in a file (one byte per call), so the count survives the workers that faults replace.
CYCLING_SCORER = """
import math
import os
import time

from jrl.reward.digits import compute_score as digits_score

_FAULTS = ["raise", "nan", "inf", "string", "huge", "hang", "crash"]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, counter=""):
    with open(counter, "ab") as calls:
        calls.write(b".")
    call = os.path.getsize(counter) - 1
    fault = _FAULTS[(call // 8) % len(_FAULTS)] if call % 8 == 3 else None
    if fault == "raise":
        raise ZeroDivisionError("the scorer divided by zero")
    if fault == "hang":
        time.sleep(600)
    if fault == "crash":
        os._exit(7)
    if fault in ("nan", "inf"):
        return float(fault)
    if fault == "string":
        return "zero"
    if fault == "huge":
        return "x" * 20_000_000
    return digits_score(solution_str, ground_truth)
"""

FAULTS = {
    "raise": "error",
    "hang": "timeout",
    "crash": "crashed",
    "nan": "non_finite",
    "inf": "non_finite",
    "string": "non_number",
    "huge": "non_number",
}


@pytest.fixture(scope="module")
def tokenizer(train_tokenizer):
    return train_tokenizer(["#### 7", "#### 8", *FAULTS, "What is 3 + 4?"] * 20, vocab_size=300)


def settings(path, manager="naive", **function_keys):
    cfg = default_config()
    with cfg.unlocked():
        cfg.reward_model.reward_manager = manager
        cfg.custom_reward_function.update(path=str(path), **function_keys)
    return reward_settings(KeyReads(cfg))


def test_checked_score_refuses_what_cannot_be_a_reward():
    assert checked_score(1).value == 1.0 and checked_score(True).value == 1.0
    assert checked_score({"score": 0.5, "acc": 1}).info == {"score": 0.5, "acc": 1}
    for bad, kind in [
        (math.nan, "non_finite"),
        ({"score": math.inf}, "non_finite"),
        ("1.0", "non_number"),  # float() would take it; a string is not a score
        ({"acc": 1.0}, "non_number"),
        (None, "non_number"),
        ([1.0], "non_number"),
    ]:
        with pytest.raises(RewardFault) as fault:
            checked_score(bad)
        assert fault.value.kind == kind


@pytest.mark.parametrize("manager", ["naive", "dapo"])
def test_every_fault_scores_zero_is_counted_and_named(tokenizer, tmp_path, capsys, manager):
    path = tmp_path / "faulty.py"
    path.write_text(FAULTY_SCORER)
    reward = load_reward_manager(settings(path, manager, timeout=1.5), tokenizer, 0)
    responses = ["#### 7", *FAULTS, "#### 8", "#### 7"]
    start = time.monotonic()
    out = reward(text_batch(tokenizer, responses), return_dict=True)
    assert time.monotonic() - start < 10  # the hung row cost its timeout, not the run
    assert row_scores(out) == [1.0] + [0.0] * len(FAULTS) + [0.0, 1.0]
    column = out["reward_extra_info"]["reward_fault"]
    assert column == ["", *FAULTS.values(), "", ""]
    metrics = fault_metrics(out["reward_extra_info"])
    assert metrics == {
        "reward/errors": 1.0,
        "reward/timeouts": 1.0,
        "reward/crashes": 1.0,
        "reward/non_finite": 2.0,
        "reward/non_numbers": 2.0,
    }
    log = capsys.readouterr().out
    assert "faulty.py): error on row 1 (data_source 'openai/gsm8k'): ValueError: cannot" in log
    assert "timeout on row 2" in log and "crashed on row 3" in log
    assert "non_finite on row 4 " in log and "non_number on row 6 " in log
    assert "non_finite on row 5" not in log  # the first of each kind only
    # The pool is whole again: the next batch scores normally.
    again = reward(text_batch(tokenizer, ["#### 7"] * 5), return_dict=True)
    assert row_scores(again) == [1.0] * 5


def test_on_error_raise_stops_at_the_first_fault(tokenizer, tmp_path):
    path = tmp_path / "faulty.py"
    path.write_text(FAULTY_SCORER)
    strict = load_reward_manager(settings(path, on_error="raise"), tokenizer, 0)
    with pytest.raises(RuntimeError, match=r"faulty.py\) failed on row 1 .*non_finite"):
        strict(text_batch(tokenizer, ["#### 7", "nan", "raise"]))
    with pytest.raises(ValueError, match="on_error must be one of"):
        settings(path, on_error="ignore")
    with pytest.raises(ValueError, match="timeout must be positive"):
        settings(path, timeout=0)


class NaNManager:
    """A user's reward manager class whose tensor holds NaN and inf on some rows."""


def test_a_managers_non_finite_rows_score_zero_and_are_counted(capsys):
    tensor = np.zeros((4, 3), np.float32)
    tensor[1, 2], tensor[2, 0], tensor[3, 1] = np.nan, 1.0, -np.inf
    reward = {"reward_tensor": tensor, "reward_extra_info": {"acc": [1, 0, 1, 0]}}
    out = finite_rewards(reward, NaNManager())
    np.testing.assert_array_equal(out["reward_tensor"].sum(-1), [0.0, 0.0, 1.0, 0.0])
    assert out["reward_extra_info"]["reward_fault"] == ["", "non_finite", "", "non_finite"]
    assert fault_metrics(out["reward_extra_info"])["reward/non_finite"] == 2.0
    assert "NaNManager gave 2 rows non-finite scores (first: row 1)" in capsys.readouterr().out
    clean = {"reward_tensor": np.ones((2, 3), np.float32), "reward_extra_info": {}}
    assert finite_rewards(clean, NaNManager()) is clean


def test_a_training_run_survives_a_misbehaving_reward_function(tmp_path, capsys):
    path = tmp_path / "cycling.py"
    path.write_text(CYCLING_SCORER)
    run_dir = tmp_path / "run"
    train.main(
        [
            "--config=configs/digits_grpo.py",
            f"custom_reward_function.path={path}",
            f"+custom_reward_function.reward_kwargs.counter={tmp_path / 'calls'}",
            "custom_reward_function.timeout=1",
            "trainer.total_training_steps=2",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            f"trainer.default_local_dir={run_dir}",
        ]
    )
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["data"] for line in lines]
    assert len(steps) == 2
    for metric in FAULT_METRICS.values():
        assert sum(step[metric] for step in steps) > 0, metric
    for step in steps:
        assert math.isfinite(step["actor/pg_loss"]) and math.isfinite(step["critic/score/mean"])
    log = capsys.readouterr().out
    assert "cycling.py): error on row " in log and "ZeroDivisionError" in log
    for kind in FAULT_METRICS:
        assert f"): {kind} on row " in log


NAN_MANAGER = """
import numpy as np


class NaNRows:
    \"\"\"A user's reward manager (verl's arguments) that scores its first row NaN.\"\"\"

    def __init__(self, tokenizer, num_examine, compute_score, reward_fn_key):
        pass

    def __call__(self, batch, return_dict=False):
        scores = np.zeros(np.shape(batch["responses"]), np.float32)
        scores[0, 0] = np.nan
        return {"reward_tensor": scores, "reward_extra_info": {}} if return_dict else scores
"""


def test_a_run_with_a_manager_that_gives_nan_trains_on(tmp_path):
    path = tmp_path / "nan_manager.py"
    path.write_text(NAN_MANAGER)
    run_dir = tmp_path / "run"
    train.main(
        [
            "--config=configs/digits_grpo.py",
            "reward_manager.source=importlib",
            f"reward_manager.module.path={path}",
            "reward_manager.module.name=NaNRows",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            f"trainer.default_local_dir={run_dir}",
        ]
    )
    (step,) = [json.loads(line)["data"] for line in (run_dir / "metrics.jsonl").open()]
    assert step["reward/non_finite"] == 1.0 and math.isfinite(step["actor/pg_loss"])


HANGING_SCORER = """
import time
import zlib

from jrl.reward.digits import compute_score as digits_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if zlib.crc32(f"{solution_str}|{extra_info['index']}".encode()) % 20 == 0:
        time.sleep(3600)  # about one row in twenty hangs
    return digits_score(solution_str, ground_truth)
"""


def test_sigterm_stops_a_run_whose_reward_function_hangs(tmp_path):
    """On main before the guard, SIGTERM waited for ever on a step whose reward hung; now the
    step ends once its hung rows time out, is saved, and the run exits 0."""
    scorer = tmp_path / "hanging.py"
    scorer.write_text(HANGING_SCORER)
    run_dir = tmp_path / "run"
    run = WatchedRun(
        [
            "--config=configs/digits_grpo.py",
            f"custom_reward_function.path={scorer}",
            "custom_reward_function.timeout=2",
            "trainer.total_training_steps=50",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            f"trainer.default_local_dir={run_dir}",
        ]
    )
    run.wait_for(lambda: "step:1 - " in run.output, timeout=300)
    run.process.send_signal(signal.SIGTERM)
    assert run.finish(timeout=120) == 0
    timeouts = [float(v) for v in re.findall(r"reward/timeouts:([0-9.]+)", run.output)]
    assert sum(timeouts) > 0 and "stopped after step" in run.output
    assert int((run_dir / "latest_checkpointed_iteration.txt").read_text()) >= 1
