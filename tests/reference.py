"""Reference implementations the tests check jrl against, shared by several test modules:

- numpy loops written from the formulas of `jrl.algos` (float64) on a fixed [B, R] response mask,
  with the random inputs and the closeness check they are compared by;
- randomised transformers models (torch, CPU, fp32) of one tiny shape, per decoder family, and
  their logits; the check that jrl's export of a model loads back into transformers.

torch and transformers are imported where they are used: a module that needs them skips itself
with `pytest.importorskip` first."""

import json
import math
import statistics

import numpy as np

from jrl.models import ModelConfig, from_pretrained, save_pretrained

# ---------------------------------------------------------------- jrl.algos: numpy references

B, R = 8, 6
# Rows: full, short, empty, EOS first, holes (tool tokens), full, short, medium.
MASK = np.array(
    [
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 0],
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0],
    ],
    dtype=np.float32,
)


def rand(seed: int, shape=(B, R), scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def close(actual, expected, tol: float = 1e-5) -> None:
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=tol, atol=tol)


def outcome_rewards(scores: np.ndarray) -> np.ndarray:
    """Score on the last valid token of each row (nothing on empty rows)."""
    rewards = np.zeros((B, R), np.float32)
    for i, s in enumerate(scores):
        valid = np.nonzero(MASK[i])[0]
        if len(valid):
            rewards[i, valid[-1]] = s
    return rewards


# Groups: "a" 3 rows (one empty), "b" all-equal pair, "c" singleton, "d" pair.
UIDS = np.array(["a", "b", "a", "c", "b", "a", "d", "d"], dtype=object)


def ref_masked_mean(x, m):
    return float((x.astype(np.float64) * m).sum() / (m.sum() + 1e-8))


def ref_whiten(x, m):
    valid = [float(v) for v, k in zip(x.ravel(), m.ravel(), strict=True) if k]
    mean = ref_masked_mean(x, m)
    var = sum((v - mean) ** 2 for v in valid) / (len(valid) + 1e-8) * len(valid) / (len(valid) - 1)
    return (x.astype(np.float64) - mean) / math.sqrt(var + 1e-8)


def ref_gae(rewards, values, mask, gamma, lam):
    adv = np.zeros((B, R))
    for i in range(B):
        next_value, last_gae = 0.0, 0.0
        for t in reversed(range(R)):
            delta = rewards[i, t] + gamma * next_value - values[i, t]
            gae = delta + gamma * lam * last_gae
            if mask[i, t]:
                next_value, last_gae = values[i, t], gae
            adv[i, t] = last_gae
    return ref_whiten(adv, mask), adv + values


def ref_grpo(rewards, mask, index, eps, norm):
    scores = rewards.astype(np.float64).sum(-1)
    out = np.zeros((B, R))
    for i in range(len(index)):
        group = [scores[j] for j in range(len(index)) if index[j] == index[i]]
        mean, std = (statistics.mean(group), statistics.stdev(group)) if len(group) > 1 else (0, 1)
        a = (scores[i] - mean) / (std + eps) if norm else scores[i] - mean
        out[i] = a * mask[i]
    return out


def ref_agg(loss, mask, mode, factor=None):
    rows = [i for i in range(B) if mask[i].sum() > 0]
    row_sums = [sum(loss[i, t] * mask[i, t] for t in range(R)) for i in range(B)]
    if mode == "token-mean":
        return sum(row_sums) / mask.sum() if mask.sum() else 0.0
    if mode == "seq-mean-token-sum":
        return sum(row_sums[i] for i in rows) / len(rows) if rows else 0.0
    if mode == "seq-mean-token-mean":
        means = [row_sums[i] / mask[i].sum() for i in rows]
        return sum(means) / len(rows) if rows else 0.0
    return sum(row_sums) / (R if factor is None else factor)


# ---------------------------------------------------------------- transformers references

SHAPE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)

WINDOW = 4
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
GEMMA = dict(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=24)
FAMILIES = {
    "llama": ("LlamaConfig", dict(rope_theta=5e5, rope_scaling=LLAMA3_ROPE)),
    "qwen2": (
        "Qwen2Config",
        dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    ),
    "qwen3": ("Qwen3Config", dict(head_dim=32, attention_bias=True, tie_word_embeddings=True)),
    "mistral": ("MistralConfig", dict(sliding_window=WINDOW)),
    "gemma2": (
        "Gemma2Config",
        dict(GEMMA, attn_logit_softcapping=2.0, final_logit_softcapping=5.0),
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        dict(
            GEMMA,
            sliding_window_pattern=2,
            rope_local_base_freq=100.0,
            rope_scaling={"rope_type": "linear", "factor": 2.0},
        ),
    ),
}


def randomise(model):
    """Gives every torch parameter (norm scales and biases included) a non-trivial value."""
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.1)
    return model.eval()


def hf_family_model(name):
    """A randomised 3-layer transformers model of family `name` (a key of `FAMILIES`), eager
    attention."""
    import transformers

    cls_name, extra = FAMILIES[name]
    cfg = getattr(transformers, cls_name)(**{**SHAPE, "num_hidden_layers": 3, **extra})
    cfg._attn_implementation = "eager"
    return randomise(transformers.AutoModelForCausalLM.from_config(cfg))


def torch_logits(model, batch):
    """The torch model's logits for `batch` = (ids, mask, positions)."""
    import torch

    ids, mask, pos = (torch.tensor(np.asarray(a, np.int64)) for a in batch)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.numpy()


def assert_export_roundtrip(path, hf_model, batch, tmp_path):
    """jrl's model of the HF folder `path` saved again (`save_pretrained`): its config.json
    reads back to the same config, and transformers loads it as `hf_model`'s class with the
    same logits on `batch`."""
    import transformers

    model = from_pretrained(path)
    save_pretrained(model, tmp_path / "export")
    hf = json.loads((tmp_path / "export" / "config.json").read_text())
    assert ModelConfig.from_hf(hf) == model.config
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "export", attn_implementation="eager"
    ).eval()
    assert type(reloaded) is type(hf_model)
    ours, theirs = torch_logits(reloaded, batch), torch_logits(hf_model, batch)
    valid = batch[1].astype(bool)
    assert np.abs(ours[valid] - theirs[valid]).max() <= 1e-6 * np.abs(theirs[valid]).max()
