"""The real vLLM (its CPU build) on the quickstart's model, SmolLM2-135M-Instruct in fp32: greedy
rows equal to jrl's JAX sampler's on held-out word problems, and a 2-step GRPO run of the
word-problems card with ``rollout.name=vllm`` whose trainer recomputes the rollout's
probabilities (`training/rollout_probs_diff_*`). Skipped where vllm is not installed or vLLM's
platform is not the CPU."""

import gc
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pyarrow.parquet as pq
import pytest
import transformers
from fake_vllm import prompt_batch
from helpers import jit_call, tiny_rollout_spec
from real_vllm import KV_CACHE, LOG_PROB_TOLERANCE, why_no_real_vllm

from jrl import assets
from jrl.models import from_pretrained
from jrl.rollout import JaxRollout, SamplingParams
from jrl.rollout.vllm_rollout import VllmRollout

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(why_no_real_vllm() is not None, reason=str(why_no_real_vllm())),
]

ROWS, R = 16, 24
# |p_trainer - p_rollout| of each response token over a run's two steps, fp32 (measured ~1.5e-5)
PROBS_DIFF_MAX = 1e-4


@pytest.fixture(scope="module")
def problems():
    """The model and the first `ROWS` held-out word problems, chat-templated, left-padded."""
    paths = assets.prepare_word_problems()
    tokenizer = transformers.AutoTokenizer.from_pretrained(paths["model_path"])
    rows = pq.read_table(paths["val_files"]).to_pylist()[:ROWS]
    texts = [
        tokenizer.encode(
            tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )
        for r in rows
    ]
    width = max(map(len, texts))
    ids = np.full((ROWS, width), tokenizer.pad_token_id, np.int64)
    mask = np.zeros((ROWS, width), np.int32)
    for i, text in enumerate(texts):
        ids[i, width - len(text) :], mask[i, width - len(text) :] = text, 1
    return from_pretrained(paths["model_path"]), prompt_batch(ids, mask), tokenizer


@pytest.fixture(scope="module")
def vllm_rows(problems):
    """vLLM's greedy rows and log-probs (fp32, weights pushed from jrl over random ones); the
    engine is dropped before the run below."""
    model, prompts, tokenizer = problems
    width = prompts["input_ids"].shape[1]
    spec = tiny_rollout_spec(
        str(assets.smollm2_folder()), dtype="float32", prompt_length=width, response_length=R,
        **{"engine_kwargs.vllm": KV_CACHE},
    )  # fmt: skip
    engine = VllmRollout.from_spec(
        model, spec, pad_token_id=tokenizer.pad_token_id, eos_token_ids=()
    )
    greedy = SamplingParams(
        max_new_tokens=R, pad_token_id=tokenizer.pad_token_id, do_sample=False,
        calculate_log_probs=True,
    )  # fmt: skip
    rows = engine.generate(prompts, greedy, jax.random.key(0)).to_numpy()
    del engine
    gc.collect()
    return rows


def test_greedy_rows_are_the_jax_samplers_and_log_probs_the_trainers(problems, vllm_rows):
    model, prompts, tokenizer = problems
    jax_engine = JaxRollout(
        model, response_length=R, pad_token_id=tokenizer.pad_token_id, eos_token_ids=()
    )
    greedy = SamplingParams(max_new_tokens=R, pad_token_id=tokenizer.pad_token_id, do_sample=False)
    expected = jax_engine.generate(prompts, greedy, jax.random.key(0)).to_numpy()
    np.testing.assert_array_equal(vllm_rows["responses"], expected["responses"])
    full = (vllm_rows["input_ids"], vllm_rows["attention_mask"], vllm_rows["position_ids"])
    width = prompts["input_ids"].shape[1]
    logits = jit_call(model, full)[:, width - 1 : -1].astype(np.float32)
    picked = np.take_along_axis(jax.nn.log_softmax(logits), vllm_rows["responses"][..., None], -1)
    np.testing.assert_allclose(
        vllm_rows["rollout_log_probs"], picked[..., 0], rtol=0, atol=LOG_PROB_TOLERANCE
    )


def test_two_grpo_steps_of_the_word_problems_card_with_vllm(tmp_path):
    """`python -m jrl.train` (its own process) on the quickstart card with rollout.name=vllm for
    2 steps: the rollout's log-probs are recomputed by the trainer (bypass mode off, so that the
    old log-probs are the trainer's) and their probabilities agree within `PROBS_DIFF_MAX`; no
    validation (the run's time is the rollouts and updates)."""
    run_dir = tmp_path / "run"
    argv = [
        "--config=configs/word_problems_grpo.py:quickstart",
        "trainer.total_training_steps=2",
        "actor_rollout_ref.rollout.name=vllm",
        "algorithm.rollout_correction.bypass_mode=false",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        f"++actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes={2**28}",
        "trainer.logger=['console','file']",
        f"trainer.default_local_dir={run_dir}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "jrl.train", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "XLA_FLAGS": ""},  # one CPU device, as the card's run has
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "jrl: vLLM has no sleep mode on cpu" in done.stdout
    assert "JAX sampler generates" not in done.stdout
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    diffs = {
        row["step"]: {k: v for k, v in row["data"].items() if "rollout_probs_diff" in k}
        for row in rows
    }
    print("rollout_probs_diff by step:", diffs)
    assert sorted(diffs) == [1, 2]
    for step in diffs.values():
        assert step["training/rollout_probs_diff_valid"] == 1.0
        assert step["training/rollout_probs_diff_max"] < PROBS_DIFF_MAX, diffs
