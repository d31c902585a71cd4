"""Rewards: GSM8K scorer, default_compute_score dispatch, NaiveRewardManager, custom functions."""

import dataclasses

import numpy as np
import pytest

from jrl.batch import Batch
from jrl.config import default_config
from jrl.data.gsm8k import make_offline_rows
from jrl.reward import NaiveRewardManager, default_compute_score, load_reward_manager
from jrl.reward.gsm8k import compute_score, extract_solution
from jrl.runspec.reads import KeyReads
from jrl.runspec.reward import reward_settings


@pytest.fixture(scope="session")
def tokenizer(train_tokenizer):
    rows = make_offline_rows(200, seed=0, split="train")
    texts = [r["prompt"][0]["content"] + " " + r["extra_info"]["answer"] for r in rows]
    return train_tokenizer(texts, vocab_size=400)


# ---------------------------------------------------------------- gsm8k scorer


def test_strict_extraction():
    assert extract_solution("so 3 + 4 = 7\n#### 7") == "7"
    assert extract_solution("#### 1 then #### -2.5") == "-2.5"
    assert extract_solution("#### 1,234,567") == "1234567"
    assert extract_solution("the answer is 7") is None
    assert extract_solution("####7") is None  # strict needs the space
    assert extract_solution("#### $5") is None  # '$' is not part of a number


def test_flexible_extraction():
    assert extract_solution("first 3 then 1,200 at last.", "flexible") == "1,200"
    assert extract_solution("we get 42. ", "flexible") == "42."
    assert extract_solution("value -3 and a dot .", "flexible") == "-3"
    assert extract_solution("no digits here", "flexible") is None
    assert extract_solution("only . and .", "flexible") == "."  # verl keeps the first match
    with pytest.raises(ValueError, match="strict' or 'flexible"):
        extract_solution("x", "loose")


def test_only_the_last_300_characters_are_searched():
    answer = "#### 12"
    assert extract_solution(answer + " " * 293) == "12"
    assert extract_solution(answer + " " * 294) is None
    assert compute_score(answer + "x" * 400, "12") == 0.0


def test_compute_score_values():
    assert compute_score("#### 72", "72") == 1.0
    assert compute_score("#### 1,000", "1000") == 1.0
    assert compute_score("#### 71", "72") == 0.0
    assert compute_score("#### 71", "72", format_score=0.1) == 0.1
    assert compute_score("72", "72", format_score=0.1) == 0.0
    assert compute_score("#### 72", "72", score=2.0) == 2.0
    assert compute_score("it is 72", "72", method="flexible") == 1.0


def test_default_compute_score_dispatch():
    score = default_compute_score("openai/gsm8k", "#### 5", "5")
    assert score == 1.0 and isinstance(score, float)
    for source in (
        "lighteval/MATH",
        "DigitalLearningGmbH/MATH-lighteval",
        "HuggingFaceH4/MATH-500",
    ):
        assert default_compute_score(source, "so $\\boxed{\\dfrac12}$", "\\frac{1}{2}") == 1.0
        assert default_compute_score(source, "so $\\boxed{3}$", "4") == 0.0
    with pytest.raises(NotImplementedError, match="math_dapo.*verl has one.*custom_reward"):
        default_compute_score("math_dapo", "x", "1")
    with pytest.raises(NotImplementedError, match="aime2024"):
        default_compute_score("aime2024", "x", "1")
    with pytest.raises(NotImplementedError, match="my/data.*custom_reward_function.path"):
        default_compute_score("my/data", "x", "1")


# ---------------------------------------------------------------- manager


def make_batch(tokenizer, responses, prompt_len=12, sources=None):
    """Left-padded prompts, right-padded responses (the longest fills the width), and meta."""
    pad = tokenizer.pad_token_id
    response_len = max(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in responses)
    prompt_ids, response_ids, masks = [], [], []
    for text in responses:
        p = tokenizer("Tom has 3 apples.", add_special_tokens=False)["input_ids"][-prompt_len:]
        r = tokenizer(text, add_special_tokens=False)["input_ids"]
        prompt_ids.append([pad] * (prompt_len - len(p)) + p)
        response_ids.append(r + [pad] * (response_len - len(r)))
        masks.append(
            [0] * (prompt_len - len(p)) + [1] * (len(p) + len(r)) + [0] * (response_len - len(r))
        )
    n = len(responses)
    return Batch(
        {
            "prompts": np.array(prompt_ids, np.int32),
            "responses": np.array(response_ids, np.int32),
            "attention_mask": np.array(masks, np.int32),
        },
        {
            "data_source": sources or ["openai/gsm8k"] * n,
            "reward_model": [{"style": "rule", "ground_truth": "7"}] * n,
            "extra_info": [None] + [{"index": i} for i in range(1, n)],
        },
    )


def test_naive_manager_scores_on_last_valid_token(tokenizer, capsys):
    responses = ["3 + 4 = 7\n#### 7", "#### 8", "", "#### 7"]
    batch = make_batch(tokenizer, responses)
    reward = NaiveRewardManager(tokenizer, num_examine=1)(batch)
    width = batch["responses"].shape[1]
    assert reward.dtype == np.float32 and reward.shape == (4, width)
    lengths = batch["attention_mask"][:, 12:].sum(-1)
    assert lengths[0] == width and 0 < lengths[3] < width and lengths[2] == 0
    expected = np.zeros((4, width), np.float32)
    expected[0, width - 1] = 1.0
    expected[3, lengths[3] - 1] = 1.0
    np.testing.assert_array_equal(reward, expected)  # the empty response gets no score
    out = capsys.readouterr().out
    assert out.count("[prompt] Tom has 3 apples.") == 1 and "[score] 1.0" in out


def test_naive_manager_dict_scores_and_extra_info(tokenizer):
    seen = []

    def score_fn(data_source, solution_str, ground_truth, extra_info):
        seen.append((data_source, solution_str, ground_truth, extra_info))
        return {"score": float(len(solution_str)), "acc": solution_str.endswith(ground_truth)}

    batch = make_batch(tokenizer, ["#### 7", "#### 77"], sources=["a", "b"])
    manager = NaiveRewardManager(tokenizer, 0, compute_score=score_fn)
    out = manager(batch, return_dict=True)
    lengths = batch["attention_mask"][:, 12:].sum(-1)
    assert out["reward_tensor"][0, lengths[0] - 1] == 6.0
    assert out["reward_tensor"][1, lengths[1] - 1] == 7.0
    assert out["reward_tensor"].sum() == 13.0
    assert out["reward_extra_info"] == {"score": [6.0, 7.0], "acc": [True, True]}
    added = {"num_turns": None, "rollout_reward_scores": {}}  # what verl's managers add
    assert seen == [("a", "#### 7", "7", added), ("b", "#### 77", "7", {"index": 1, **added})]
    with pytest.raises(KeyError, match=r"lacks \['source'\].*data.reward_fn_key"):
        NaiveRewardManager(tokenizer, 0, reward_fn_key="source")(batch)
    bad = NaiveRewardManager(tokenizer, 0, compute_score=lambda **kw: {"acc": 1.0})
    with pytest.raises(RuntimeError, match="failed on row 0 .*without 'score'"):
        bad(batch)


def test_existing_rm_scores_pass_through(tokenizer):
    batch = make_batch(tokenizer, ["#### 7"])
    scores = np.full(batch["responses"].shape, 0.5, np.float32)
    batch = batch.union(Batch({"rm_scores": scores}))
    np.testing.assert_array_equal(NaiveRewardManager(tokenizer, 0)(batch), scores)


# ---------------------------------------------------------------- loading


def config(path=None, name="compute_score", reward_kwargs=None, manager="naive"):
    """The RewardSettings of the default tree with these reward keys."""
    cfg = default_config()
    with cfg.unlocked():
        cfg.reward_model.reward_manager = manager
        cfg.custom_reward_function.update(path=path, name=name)
        cfg.custom_reward_function.reward_kwargs = reward_kwargs or {}
        cfg.data.reward_fn_key = "source"
    return reward_settings(KeyReads(cfg))


def test_load_reward_manager_with_custom_function(tokenizer, tmp_path):
    file = tmp_path / "my_reward.py"
    file.write_text(
        "def my_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
        "    right = solution_str == '#### ' + ground_truth\n"
        "    return {'score': bonus + right, 'src': data_source}\n"
    )
    manager = load_reward_manager(
        config(str(file), "my_score", {"bonus": 0.5}), tokenizer, num_examine=0
    )
    batch = make_batch(tokenizer, ["#### 7", "#### 3"])
    batch.meta["source"] = batch.meta["data_source"]
    out = manager(batch, return_dict=True)
    assert out["reward_extra_info"]["score"] == [1.5, 0.5]
    # The config's reward_kwargs win over the caller's keyword arguments.
    called = manager.compute_score(data_source="d", solution_str="x", ground_truth="1", bonus=9.0)
    assert called["score"] == 0.5

    default = load_reward_manager(config(), tokenizer, num_examine=0)
    assert default.compute_score is default_compute_score and default.reward_fn_key == "source"


def test_load_reward_manager_errors(tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="custom_reward_function.path='.*missing.py'"):
        load_reward_manager(config(str(tmp_path / "missing.py")), tokenizer, 0)
    file = tmp_path / "r.py"
    file.write_text("def other(*a, **k):\n    return 0.0\n")
    with pytest.raises(AttributeError, match="name='compute_score'.*defines other"):
        load_reward_manager(config(str(file)), tokenizer, 0)
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    with pytest.raises(RuntimeError, match="failed to import"):
        load_reward_manager(config(str(broken)), tokenizer, 0)
    with pytest.raises(ValueError, match="reward_manager='ppo'.*naive, prime, batch, dapo"):
        load_reward_manager(config(manager="ppo"), tokenizer, 0)


def test_custom_reward_that_raises_names_the_row(tokenizer, tmp_path, capsys):
    file = tmp_path / "r.py"
    file.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if solution_str.endswith('8'):\n"
        "        raise ValueError('cannot grade this')\n"
        "    return 1.0\n"
    )
    settings = config(str(file))
    batch = make_batch(tokenizer, ["#### 7", "#### 8"])
    batch.meta["source"] = batch.meta["data_source"]
    out = load_reward_manager(settings, tokenizer, 0)(batch, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0]
    assert out["reward_extra_info"]["reward_fault"] == ["", "error"]
    assert "r.py): error on row 1 " in capsys.readouterr().out
    strict = dataclasses.replace(
        settings,
        custom_function=dataclasses.replace(settings.custom_function, on_error="raise"),
    )
    with pytest.raises(RuntimeError, match=r"r.py.*failed on row 1 .*ValueError: cannot grade"):
        load_reward_manager(strict, tokenizer, 0)(batch)
