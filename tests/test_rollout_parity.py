"""The rollout against references outside it: Hugging Face greedy `generate` (fp32) token for
token, and the trainer's log-prob recomputation under bfloat16 (with the mismatch metrics)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import left_padded_prompts
from reference import SHAPE as LM_SHAPE

from jrl.batch import Batch
from jrl.models import from_pretrained
from jrl.rollout import EngineLimits, JaxRollout, SamplingParams, log_prob_mismatch_metrics

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

P, R, PAD = 7, 8, 0
SHAPE = dict(LM_SHAPE, vocab_size=96)
LIMITS = EngineLimits(max_num_seqs=4, max_num_batched_tokens=P)


def _hf_model(family: str):
    torch.manual_seed(0)
    if family == "llama":
        config = transformers.LlamaConfig(**SHAPE, tie_word_embeddings=False, rope_theta=5e5)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Qwen2Config(**SHAPE, tie_word_embeddings=True, rope_theta=1e4)
        model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.uniform_(0.5, 1.5) if "norm" in name else p.normal_(0.0, 0.15)
    return model.eval()


@pytest.fixture(scope="module")
def prompts() -> Batch:
    return left_padded_prompts([7, 2, 5, 4], P, SHAPE["vocab_size"], seed=1, low=3)


def _hf_greedy(model, prompts: Batch, eos: list[int] | None) -> np.ndarray:
    """transformers' greedy responses, right-padded with PAD to R columns."""
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor(prompts["input_ids"], dtype=torch.long),
            attention_mask=torch.tensor(prompts["attention_mask"], dtype=torch.long),
            do_sample=False,
            max_new_tokens=R,
            eos_token_id=eos,
            pad_token_id=PAD,
        )
    responses = out[:, P:].numpy()
    return np.pad(responses, ((0, 0), (0, R - responses.shape[1])), constant_values=PAD)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_matches_transformers_generate(family, prompts, tmp_path):
    hf = _hf_model(family)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    free_run = _hf_greedy(hf, prompts, eos=None)
    # Two EOS ids that end rows 0 and 2 early; the others run to R tokens.
    eos = [int(free_run[0, 2]), int(free_run[2, 5])]
    expected = _hf_greedy(hf, prompts, eos=eos)
    assert (expected == PAD).any()

    rollout = JaxRollout(
        from_pretrained(tmp_path),
        response_length=R,
        pad_token_id=PAD,
        eos_token_ids=eos,
        limits=LIMITS,
    )
    greedy = SamplingParams(R, eos_token_ids=eos, pad_token_id=PAD, do_sample=False)
    out = rollout.generate(prompts, greedy, jax.random.key(0))
    np.testing.assert_array_equal(out["responses"], expected)
    ends = np.isin(expected, eos).argmax(1)
    finished = np.isin(expected, eos).any(1)
    lengths = np.where(finished, ends + 1, R)
    np.testing.assert_array_equal(out["response_mask"].sum(1), lengths)


def test_bf16_log_probs_match_the_trainer(prompts, tmp_path):
    """A bf16 rollout (bf16 weights) against the trainer's recomputation: bf16 compute from fp32
    master weights, fused log-prob kernel."""
    from jrl.trainer.roles.log_probs import response_log_probs

    _hf_model("qwen2").save_pretrained(tmp_path, safe_serialization=True)
    model = from_pretrained(tmp_path, dtype=jnp.bfloat16, param_dtype=jnp.float32)
    rollout = JaxRollout(
        model, response_length=R, pad_token_id=PAD, eos_token_ids=[5], limits=LIMITS
    )
    matrices = {x.dtype for x in jax.tree.leaves(rollout.state) if x.ndim >= 2}
    assert matrices == {jnp.dtype(jnp.bfloat16)}
    sampling = SamplingParams(
        R, eos_token_ids=(5,), pad_token_id=PAD, temperature=0.8, calculate_log_probs=True, n=2
    )
    out = rollout.generate(prompts, sampling, jax.random.key(0))
    tensors = {k: jnp.asarray(v) for k, v in out.tensors.items()}
    trainer, _ = jax.jit(lambda t: response_log_probs(model, t, 0.8))(tensors)
    mask = np.asarray(out["response_mask"])
    rollout_lp, trainer_lp = np.asarray(out["rollout_log_probs"]), np.asarray(trainer) * mask
    gap = np.abs(rollout_lp - trainer_lp)[mask > 0]
    assert gap.max() < 0.1 and gap.mean() < 0.02, (gap.max(), gap.mean())

    metrics = log_prob_mismatch_metrics(rollout_lp, trainer_lp, mask)
    assert metrics["training/rollout_probs_diff_valid"] == 1.0
    assert metrics["training/rollout_probs_diff_max"] < 0.05
    assert metrics["training/rollout_actor_probs_pearson_corr"] > 0.99


@pytest.mark.parametrize("impl", ["naive", "chunked"])
def test_decode_log_probs_match_the_trainer_in_fp32(prompts, tmp_path, impl):
    """The sampler's `calculate_log_probs` and the trainer's recomputation by each log-prob
    implementation (`use_fused_kernels` off: naive, on: chunked on a CPU) agree in fp32, softcap
    and temperature included; only the KV cache's summation order separates them."""
    from jrl.trainer.roles.log_probs import response_log_probs

    _hf_model("qwen2").save_pretrained(tmp_path, safe_serialization=True)
    model = from_pretrained(tmp_path, dtype=jnp.float32)
    model.config = dataclasses.replace(model.config, final_logit_softcapping=3.0)  # as Gemma 2
    rollout = JaxRollout(
        model, response_length=R, pad_token_id=PAD, eos_token_ids=[5], limits=LIMITS
    )
    sampling = SamplingParams(
        R, eos_token_ids=(5,), pad_token_id=PAD, temperature=0.8, calculate_log_probs=True, n=2
    )
    out = rollout.generate(prompts, sampling, jax.random.key(3))
    tensors = {k: jnp.asarray(v) for k, v in out.tensors.items()}
    trainer, _ = jax.jit(lambda t: response_log_probs(model, t, 0.8, impl=impl))(tensors)
    mask = np.asarray(out["response_mask"])
    assert mask.sum() > R  # several sampled tokens per row on average
    np.testing.assert_allclose(
        np.asarray(out["rollout_log_probs"]), np.asarray(trainer) * mask, atol=2e-5
    )


def test_log_prob_mismatch_metrics():
    rollout = np.log(np.asarray([[0.5, 0.25, 0.9], [0.1, 0.6, 0.3]]))
    trainer = np.log(np.asarray([[0.4, 0.25, 0.7], [0.3, 0.6, 0.3]]))
    mask = np.asarray([[1, 1, 0], [1, 1, 1]])
    metrics = log_prob_mismatch_metrics(rollout, trainer, mask)
    diffs = np.asarray([0.1, 0.0, 0.2, 0.0, 0.0])
    assert metrics["training/rollout_probs_diff_max"] == pytest.approx(0.2)
    assert metrics["training/rollout_probs_diff_mean"] == pytest.approx(diffs.mean())
    assert metrics["training/rollout_probs_diff_std"] == pytest.approx(diffs.std(ddof=1))
    x, y = np.asarray([0.4, 0.25, 0.3, 0.6, 0.3]), np.asarray([0.5, 0.25, 0.1, 0.6, 0.3])
    assert metrics["training/rollout_actor_probs_pearson_corr"] == pytest.approx(
        np.corrcoef(x, y)[0, 1]
    )
    same = log_prob_mismatch_metrics(trainer, trainer, mask)
    assert same["training/rollout_probs_diff_max"] == 0
    assert same["training/rollout_actor_probs_pearson_corr"] == pytest.approx(1.0)
    assert log_prob_mismatch_metrics(rollout, trainer, 0 * mask) == {
        "training/rollout_probs_diff_valid": 0.0
    }
    with pytest.raises(ValueError, match="one \\[B, R\\] shape"):
        log_prob_mismatch_metrics(rollout, trainer[:, :2], mask)
