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


def _scorer(reward_model_dir, *overrides: str):
    from jrl.parallel import make_mesh
    from jrl.runspec import load_config
    from jrl.runspec.spec import resolve_run
    from jrl.trainer.roles.reward_model import RewardModel

    config = load_config(
        [
            "--config=configs/gsm8k_grpo.py:tiny",
            "trainer.n_gpus_per_node=1",
            "reward_model.enable=True",
            f"reward_model.model.path={reward_model_dir}",
            *overrides,
        ]
    )[0]
    return RewardModel(resolve_run(config).reward_model, make_mesh(1))


def test_offloaded_reward_model_lives_in_host_memory_and_scores_the_same(reward_model_dir):
    import jax
    import numpy as np

    from jrl.batch import Batch
    from jrl.parallel import make_mesh
    from jrl.parallel.offload import HOST_MEMORY, host_memory_kind

    if host_memory_kind(make_mesh(1).local_devices) is None:
        pytest.skip("this backend has no host memory kind")

    def scorer(offload: bool):
        return _scorer(
            reward_model_dir,
            "reward_model.model.input_tokenizer=null",
            f"reward_model.model.fsdp_config.param_offload={offload}",
        )

    rng = np.random.default_rng(0)
    ids = rng.integers(3, 60, (2, 10)).astype(np.int32)
    mask = np.ones((2, 10), np.int32)
    response_mask = np.ones((2, 4), np.int32)
    response_mask[1, 2:] = 0
    positions = np.broadcast_to(np.arange(10, dtype=np.int32), (2, 10)).copy()
    batch = Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": positions,
            "responses": ids[:, 6:],
            "response_mask": response_mask,
        }
    )
    offloaded, plain = scorer(True), scorer(False)
    kinds = {x.sharding.memory_kind for x in jax.tree.leaves(offloaded.stored)}
    assert kinds == {HOST_MEMORY}
    assert {x.sharding.memory_kind for x in jax.tree.leaves(plain.stored)} == {"device"}
    np.testing.assert_allclose(offloaded.rm_scores(batch), plain.rm_scores(batch), rtol=1e-6)
    assert np.count_nonzero(plain.rm_scores(batch)) == 2  # one score per row, at its last token


def test_input_tokenizer_decodes_the_response_for_the_reward_models_template(reward_model_dir):
    import numpy as np

    from jrl.batch import Batch

    scorer = _scorer(reward_model_dir, f"reward_model.model.input_tokenizer={reward_model_dir}")
    tokenizer = load_tokenizer(reward_model_dir)
    messages = [{"role": "user", "content": "what is two plus two?"}]
    answer = tokenizer("four, I think", add_special_tokens=False)["input_ids"]
    responses = np.asarray([[*answer, tokenizer.eos_token_id]] * 2, np.int32)
    prompts = np.full((2, 60), tokenizer.pad_token_id, np.int32)  # room for the template
    ids = np.concatenate([prompts, responses], axis=1)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": ids,
        "attention_mask": np.ones(ids.shape, np.int32),
        "response_mask": np.ones(responses.shape, np.int32),
    }
    inputs = scorer._inputs(Batch(tensors, meta={"raw_prompt": [messages, messages]}))
    # verl: the prompt's messages, then the response decoded with its EOS text removed.
    chat = [*messages, {"role": "assistant", "content": tokenizer.decode(answer)}]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
    expected = tokenizer(text, add_special_tokens=False)["input_ids"]
    for row in range(2):
        assert inputs["attention_mask"][row].sum() == len(expected)
        np.testing.assert_array_equal(inputs["input_ids"][row, : len(expected)], expected)


def test_a_multi_turn_rows_score_sits_on_its_last_attended_token(reward_model_dir):
    """As verl: a row whose response holds a tool turn (attended, not trained on) is scored with
    the tool's text in the reward model's input, and its score sits on the row's last attended
    token, not on the last trained one before it."""
    import numpy as np

    from jrl.batch import Batch

    scorer = _scorer(reward_model_dir, f"reward_model.model.input_tokenizer={reward_model_dir}")
    tokenizer = load_tokenizer(reward_model_dir)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    turn, tool, answer = encode("let me add"), encode(" tool says 391 "), encode("so 391")
    row = [*turn, *tool, *answer, tokenizer.eos_token_id]
    width, pad = len(row) + 3, tokenizer.pad_token_id
    responses = np.asarray([row + [pad] * 3] * 2, np.int32)
    trained = [1] * len(turn) + [0] * len(tool) + [1] * (len(answer) + 1) + [0] * 3
    prompts = np.full((2, 60), pad, np.int32)
    attention = np.ones((2, 60 + width), np.int32)
    attention[:, -3:] = 0
    batch = Batch(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": np.concatenate([prompts, responses], axis=1),
            "attention_mask": attention,
            "response_mask": np.asarray([trained] * 2, np.int32),
        },
        meta={"raw_prompt": [[{"role": "user", "content": "add them"}]] * 2},
    )
    inputs = scorer._inputs(batch)
    text = tokenizer.decode(inputs["input_ids"][0][inputs["attention_mask"][0] > 0])
    assert "tool says 391" in text
    scores = scorer.rm_scores(batch)
    assert np.flatnonzero(scores[0]).tolist() == [len(row) - 1]
