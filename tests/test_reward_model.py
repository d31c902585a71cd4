"""The reward model against transformers' *ForSequenceClassification (torch, CPU, fp32)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from reference import SHAPE as LM_SHAPE

from jrl.models import RewardModel, default_position_ids, from_pretrained, save_pretrained

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PAD = 0
SHAPE = dict(LM_SHAPE, pad_token_id=PAD)  # the language models' tiny shape, with a pad id


def _hf_reward_model(family: str, num_labels: int = 1):
    config = getattr(transformers, f"{family}Config")(**SHAPE, num_labels=num_labels)
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForSequenceClassification")(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.rand_like(p) + 0.5 if "norm" in name else torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def batch():
    """No padding, 3 tokens of left padding, 4 and 7 tokens of right padding; no valid token is
    the pad id, so transformers' choice (rightmost non-pad id) is the last valid token."""
    ids = np.random.RandomState(0).randint(1, SHAPE["vocab_size"], (4, 10))
    mask = np.ones((4, 10), np.int32)
    mask[1, :3] = 0
    mask[2, -4:] = 0
    mask[3, -7:] = 0
    ids[mask == 0] = PAD
    return ids, mask, np.asarray(default_position_ids(jnp.asarray(mask)))


def _hf_rewards(model, ids, mask, pos):
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=torch.tensor(mask),
            position_ids=torch.tensor(pos, dtype=torch.long),
        )
    return out.logits.numpy()[:, 0]


def _jit_rewards(model, ids, mask, pos):
    graphdef, state = nnx.split(model)
    run = jax.jit(lambda state, *a: nnx.merge(graphdef, state)(*a))
    return np.asarray(run(state, *(jnp.asarray(a) for a in (ids, mask, pos))))


@pytest.fixture(scope="module", params=["Qwen2", "Llama"])
def reward_dir(request, tmp_path_factory):
    hf_model = _hf_reward_model(request.param)
    path = tmp_path_factory.mktemp(request.param.lower())
    hf_model.save_pretrained(path)
    return path, hf_model


def test_rewards_match_transformers_with_left_and_right_padding(reward_dir, batch, tmp_path):
    path, hf_model = reward_dir
    model = from_pretrained(path, kind="reward")
    assert isinstance(model, RewardModel)
    ours = _jit_rewards(model, *batch)
    ref = _hf_rewards(hf_model, *batch)
    assert ours.shape == (4,) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    assert np.abs(ref).min() > 1e-3 and len(np.unique(np.round(ref, 4))) == 4

    save_pretrained(model, tmp_path / "export")
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config["architectures"][0].endswith("ForSequenceClassification")
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "export"
    ).eval()
    assert reloaded.config.num_labels == 1
    np.testing.assert_allclose(_hf_rewards(reloaded, *batch), ref, rtol=1e-6, atol=1e-7)


def test_reward_is_taken_at_the_last_valid_token_even_if_it_is_the_pad_id(reward_dir, batch):
    """With pad = eos, a row ending in eos: transformers skips that token, jrl scores it."""
    path, hf_model = reward_dir
    model = from_pretrained(path, kind="reward")
    ids, mask, pos = (np.array(a) for a in batch)
    ids[2, 5] = PAD  # the last valid token of row 2 (right padded by 4) is the pad id
    scores = np.asarray(model.token_scores(*(jnp.asarray(a) for a in (ids, mask, pos))))
    ours = np.asarray(model(*(jnp.asarray(a) for a in (ids, mask, pos))))
    np.testing.assert_allclose(ours[2], scores[2, 5], rtol=1e-6)
    np.testing.assert_allclose(_hf_rewards(hf_model, ids, mask, pos)[2], scores[2, 4], rtol=1e-4)


def test_reward_checkpoint_errors(tmp_path):
    causal = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**SHAPE))
    causal.save_pretrained(tmp_path / "causal")
    with pytest.raises(KeyError, match="sequence-classification checkpoint.*score.weight"):
        from_pretrained(tmp_path / "causal", kind="reward")
    _hf_reward_model("Qwen2", num_labels=2).save_pretrained(tmp_path / "two")
    with pytest.raises(ValueError, match="2 labels; a reward model needs num_labels=1"):
        from_pretrained(tmp_path / "two", kind="reward")


def test_a_critic_starts_from_a_reward_model_and_a_reward_bias_is_not_dropped(tmp_path):
    """As transformers' token-classification loading in verl: a critic (kind='value') starts
    from a reward checkpoint, whose head has no bias, with bias 0. A reward checkpoint with a
    non-zero score.bias is refused: jrl's reward head has none, and every reward would move."""
    hf = _hf_reward_model("Qwen2")
    hf.save_pretrained(tmp_path / "rm")
    critic = from_pretrained(tmp_path / "rm", kind="value")
    kernel = np.asarray(critic.score.kernel[...]).reshape(-1)
    np.testing.assert_allclose(kernel, hf.score.weight.detach().numpy().reshape(-1), rtol=1e-6)
    assert np.asarray(critic.score.bias[...]).tolist() == [0.0]
    config = transformers.Qwen2Config(**SHAPE, num_labels=1)
    biased = transformers.Qwen2ForTokenClassification(config)
    with torch.no_grad():
        biased.score.bias.fill_(3.0)
    biased.save_pretrained(tmp_path / "biased")
    with pytest.raises(ValueError, match="score.bias is not 0, but jrl's reward head has no bias"):
        from_pretrained(tmp_path / "biased", kind="reward")
    with torch.no_grad():
        biased.score.bias.fill_(0.0)
    biased.save_pretrained(tmp_path / "zero")
    assert isinstance(from_pretrained(tmp_path / "zero", kind="reward"), RewardModel)
