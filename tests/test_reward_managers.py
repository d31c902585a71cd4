"""Reward managers beyond `naive`: prime (process pool, timeouts), batch, dapo; manager loading."""

import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import row_scores, text_batch

from jrl.batch import Batch
from jrl.config import default_config
from jrl.reward import (
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    PrimeRewardManager,
    default_compute_score,
    load_reward_manager,
)
from jrl.reward.settings import DAPOOptions, OverlongBuffer, PrimeOptions
from jrl.runspec.reads import KeyReads
from jrl.runspec.reward import reward_settings

PRIME_SCORERS = """
import os
import subprocess
import sys
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    if solution_str == "hang":
        time.sleep(120)
    if solution_str == "boom":
        raise ValueError("scorer exploded")
    if solution_str == "die":
        os._exit(3)
    return float(solution_str == "#### " + ground_truth) + bonus
"""

BATCH_SCORERS = """
def compute_score(data_sources, solution_strs, ground_truths, extra_infos, scale=1.0):
    return [
        {"score": scale * (s == "#### " + g), "rows_in_call": len(solution_strs), "src": d}
        for d, s, g in zip(data_sources, solution_strs, ground_truths)
    ]


def short_by_one(data_sources, solution_strs, ground_truths, extra_infos):
    return [0.0] * (len(solution_strs) - 1)


def always_one(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


def turns_told(data_source, solution_str, ground_truth, extra_info=None):
    assert extra_info["rollout_reward_scores"] == {}
    return {"score": 1.0, "turns": extra_info["num_turns"]}


class EchoManager:
    def __init__(self, tokenizer, num_examine, compute_score, reward_fn_key, width=1):
        self.compute_score = compute_score
        self.width = width
"""


@pytest.fixture(scope="module")
def tokenizer(train_tokenizer):
    texts = ["#### 7", "#### 8", "hang", "boom", "die", "What is 3 + 4?"] * 20
    return train_tokenizer(texts, vocab_size=300)


@pytest.fixture(scope="module")
def scorer_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("scorers")
    (folder / "prime_scorers.py").write_text(PRIME_SCORERS)
    (folder / "batch_scorers.py").write_text(BATCH_SCORERS)
    return folder


def config(manager="naive", path=None, name="compute_score", reward_kwargs=None, **sections):
    """The RewardSettings of the default tree with these reward keys (``section__field=value``;
    a dict value updates that section)."""
    cfg = default_config()
    with cfg.unlocked():
        cfg.data.max_response_length = 8
        cfg.reward_model.reward_manager = manager
        cfg.reward_model.reward_kwargs = reward_kwargs or {}
        cfg.custom_reward_function.update(path=path, name=name)
        for key, value in sections.items():
            section, field = key.split("__")
            if isinstance(value, dict):
                cfg[section][field].update(value)
            else:
                cfg[section][field] = value
    return reward_settings(KeyReads(cfg))


# ---------------------------------------------------------------- prime


def test_prime_survives_a_hanging_a_raising_and_a_dying_scorer(tokenizer, scorer_files, capsys):
    cfg = config(
        "prime",
        path=str(scorer_files / "prime_scorers.py"),
        reward_kwargs={"timeout": 2.0, "num_processes": 4},
    )
    manager = load_reward_manager(cfg, tokenizer, num_examine=0)
    try:
        assert isinstance(manager, PrimeRewardManager)
        # The first call also waits for the worker processes to start.
        assert row_scores(manager(text_batch(tokenizer, ["#### 7", "#### 8"]), True)) == [1, 0]

        responses = ["#### 7" if i % 3 else "#### 8" for i in range(64)]
        responses[10], responses[40] = "hang", "boom"
        start = time.monotonic()
        out = manager(text_batch(tokenizer, responses), return_dict=True)
        elapsed = time.monotonic() - start
        assert 2.0 <= elapsed < 4.0  # the hung row waited out its timeout, and no longer
        expected = [float(r == "#### 7") for r in responses]
        assert row_scores(out) == expected
        assert sum(expected) == 40  # of the 62 scored rows, 40 are right and 22 wrong
        info = out["reward_extra_info"]
        assert "acc" not in info  # verl's prime reports the score alone: val-core is "reward"
        faults = {i: f for i, f in enumerate(info["reward_fault"]) if f}
        assert faults == {10: "timeout", 40: "error"}
        log = capsys.readouterr().out
        assert "timeout on row 10" in log and "ValueError: scorer exploded" in log

        # A worker that dies costs its row only; the pool replaces it.
        out = manager(text_batch(tokenizer, ["#### 7", "die", "#### 7"]), return_dict=True)
        assert row_scores(out) == [1.0, 0.0, 1.0]
        assert out["reward_extra_info"]["reward_fault"] == ["", "crashed", ""]
        assert row_scores(manager(text_batch(tokenizer, ["#### 7"] * 6), True)) == [1.0] * 6
    finally:
        manager.close()
    assert not manager.scorer.start()._workers
    with pytest.raises(RuntimeError, match="closed"):
        manager(text_batch(tokenizer, ["#### 7"]))


def test_prime_default_scorer_and_bad_functions(tokenizer):
    manager = PrimeRewardManager(tokenizer, 0, options=PrimeOptions(num_processes=1))
    try:
        assert manager.compute_score is default_compute_score
        assert row_scores(manager(text_batch(tokenizer, ["#### 7", "#### 8"]), True)) == [1, 0]
    finally:
        manager.close()
    with pytest.raises(TypeError, match="cannot be sent to a worker process"):
        PrimeRewardManager(
            tokenizer, 0, compute_score=lambda *a: 1.0, options=PrimeOptions(num_processes=1)
        )
    with pytest.raises(ValueError, match="timeout must be positive"):
        PrimeOptions(timeout=0, num_processes=1)


# ---------------------------------------------------------------- batch


def test_batch_manager_scores_in_one_call(tokenizer, scorer_files, capsys):
    path = str(scorer_files / "batch_scorers.py")
    manager = load_reward_manager(
        config("batch", path=path, reward_kwargs={"scale": 2.0}), tokenizer, 0
    )
    assert isinstance(manager, BatchRewardManager)
    out = manager(text_batch(tokenizer, ["#### 7", "#### 8", "#### 7"]), return_dict=True)
    assert row_scores(out) == [2.0, 0.0, 2.0]
    assert out["reward_extra_info"]["rows_in_call"] == [3, 3, 3]
    assert out["reward_extra_info"]["src"] == ["openai/gsm8k"] * 3
    # Without a custom function, the built-in scorers run row by row.
    default = load_reward_manager(config("batch"), tokenizer, 0)
    assert row_scores(default(text_batch(tokenizer, ["#### 8", "#### 7"]), True)) == [0.0, 1.0]
    # A user's function runs contained: a call that fails is a fault of every row.
    short = load_reward_manager(config("batch", path=path, name="short_by_one"), tokenizer, 0)
    out = short(text_batch(tokenizer, ["#### 8", "#### 7"]), return_dict=True)
    assert row_scores(out) == [0.0, 0.0]
    assert out["reward_extra_info"]["reward_fault"] == ["error", "error"]
    assert "returned 1 for 2 rows" in capsys.readouterr().out
    strict = config("batch", path=path, name="always_one", custom_reward_function__on_error="raise")
    with pytest.raises(RuntimeError, match="'always_one' .* failed on row 0 .*TypeError"):
        load_reward_manager(strict, tokenizer, 0)(text_batch(tokenizer, ["#### 8", "#### 7"]))


def test_scoring_functions_see_the_rows_turns_as_verls_managers_pass_them(tokenizer, scorer_files):
    path = str(scorer_files / "batch_scorers.py")
    manager = load_reward_manager(config("naive", path=path, name="turns_told"), tokenizer, 0)
    rows = text_batch(tokenizer, ["#### 7", "#### 8"])
    agent_rows = rows.union(Batch(meta={"num_turns": np.array([3, 5], np.int32)}))
    assert manager(agent_rows, True)["reward_extra_info"]["turns"] == [3, 5]
    assert manager(rows, True)["reward_extra_info"]["turns"] == [None, None]  # no agent loop


# ---------------------------------------------------------------- dapo


def length_batch(lengths, width):
    """Responses of the given token counts (token 5 repeated), one prompt token each."""
    n = len(lengths)
    responses = np.zeros((n, width), np.int32)
    mask = np.zeros((n, 1 + width), np.int32)
    mask[:, 0] = 1
    for i, length in enumerate(lengths):
        responses[i, :length] = 5
        mask[i, 1 : 1 + length] = 1
    return Batch(
        {"prompts": np.full((n, 1), 6, np.int32), "responses": responses, "attention_mask": mask},
        {"data_source": ["d"] * n, "reward_model": [{"ground_truth": "x"}] * n},
    )


def test_dapo_overlong_penalty(tokenizer, scorer_files):
    path = str(scorer_files / "batch_scorers.py")
    buffer = {"enable": True, "len": 4, "penalty_factor": 0.5, "log": True}
    cfg = config("dapo", path=path, name="always_one", reward_model__overlong_buffer=buffer)
    manager = load_reward_manager(cfg, tokenizer, 0)
    assert isinstance(manager, DAPORewardManager) and manager.options.max_resp_len == 8
    out = manager(length_batch([2, 4, 6, 8], width=8), return_dict=True)
    # Threshold 8 - 4 = 4 tokens; the penalty grows by 0.5 / 4 per token past it.
    assert row_scores(out) == [1.0, 1.0, 0.75, 0.5]
    assert out["reward_tensor"][2, 5] == 0.75
    info = out["reward_extra_info"]
    assert info["acc"] == [1.0] * 4  # the score before the penalty
    assert info["overlong_reward"] == [0.0, 0.0, -0.25, -0.5]
    assert info["overlong"] == [False, False, True, True]
    # verl's main_ppo scripts name the buffer by the manager's argument, under reward_kwargs.
    verl_spelling = {"overlong_buffer_cfg": buffer, "max_resp_len": 8}
    cfg = config("dapo", path=path, name="always_one", reward_kwargs=verl_spelling)
    out = load_reward_manager(cfg, tokenizer, 0)(length_batch([2, 4, 6, 8], width=8), True)
    assert row_scores(out) == [1.0, 1.0, 0.75, 0.5]

    # Without reward_model.overlong_buffer (or with enable=False) there is no penalty.
    plain = load_reward_manager(config("dapo", path=path, name="always_one"), tokenizer, 0)
    assert row_scores(plain(length_batch([2, 8], width=8), True)) == [1.0, 1.0]
    quiet = dict(buffer, log=False)
    cfg = config("dapo", path=path, name="always_one", reward_model__overlong_buffer=quiet)
    out = load_reward_manager(cfg, tokenizer, 0)(length_batch([8], width=8), return_dict=True)
    info = out["reward_extra_info"]
    assert row_scores(out) == [0.5] and sorted(info) == ["acc", "reward_fault"]
    with pytest.raises(ValueError, match=r"overlong_buffer.len=0 must be in \(0, .*=8\]"):
        cfg = config("dapo", reward_model__overlong_buffer={"enable": True, "len": 0})
        load_reward_manager(cfg, tokenizer, 0)
    with pytest.raises(ValueError, match="needs the maximum response length"):
        DAPOOptions(overlong_buffer=OverlongBuffer(enable=True, len=2))


# ---------------------------------------------------------------- loading


def test_unknown_manager_and_options(tokenizer):
    with pytest.raises(ValueError, match="reward_manager='ppo'.*naive, prime, batch, dapo"):
        load_reward_manager(config("ppo"), tokenizer, 0)
    with pytest.raises(ValueError, match=r"\['timeot'\] are not options of the 'prime'.*timeout"):
        load_reward_manager(config("prime", reward_kwargs={"timeot": 1}), tokenizer, 0)
    with pytest.raises(ValueError, match=r"\['x'\] are not options of the 'naive'.*none"):
        load_reward_manager(config(reward_kwargs={"x": 1}), tokenizer, 0)
    naive = load_reward_manager(config(), tokenizer, 0)
    assert type(naive) is NaiveRewardManager and naive.compute_score is default_compute_score


def test_reward_manager_class_from_a_file(tokenizer, scorer_files):
    path = str(scorer_files / "batch_scorers.py")
    cfg = config(
        reward_kwargs={"width": 3},
        reward_manager__source="importlib",
        reward_manager__module={"path": path, "name": "EchoManager"},
    )
    manager = load_reward_manager(cfg, tokenizer, 0)
    assert type(manager).__name__ == "EchoManager" and manager.width == 3
    assert manager.compute_score is default_compute_score
    with pytest.raises(ValueError, match="reward_manager.source='elsewhere'.*importlib"):
        load_reward_manager(config(reward_manager__source="elsewhere"), tokenizer, 0)


def test_the_reward_settings_import_no_jax_and_no_manager():
    """The resolver and the checks ask for the managers' names without building anything."""
    probe = (
        "import sys, jrl.reward.settings; print(sorted(m for m in sys.modules if "
        "m.split('.')[0] in ('jax', 'transformers') or m == 'jrl.reward.base'))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
