"""Shared pieces of the tests: a tiny llama configuration, a training run in a subprocess whose
output is watched line by line, a finiteness check of run metrics, the arguments of a small
generation run, random left-padded prompts and prompt + response rows, a model's forward under
jit (full, and cached prefill then decode), random LoRA adapters, a closeness check of logits and
the rollout spec of a tiny run (`tiny_rollout_spec`).
Reference implementations (numpy loops, transformers models) are in `reference.py`."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jrl.assets import digits_paths
from jrl.batch import Batch
from jrl.config import default_config, resolve
from jrl.models import LoRAParam, ModelConfig, default_position_ids
from jrl.rollout import RolloutSpec
from jrl.runspec.rollout import rollout_spec

REPO = Path(__file__).resolve().parents[1]

TINY_LLAMA = ModelConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    attention_bias=False,
    max_position_embeddings=64,
    model_type="llama",
    eos_token_id=1,
)


def tiny_llama(**changes) -> ModelConfig:
    """`TINY_LLAMA` with some fields changed."""
    return dataclasses.replace(TINY_LLAMA, **changes)


# A tiny Gemma 2 in `config.json` keys: sliding-window and global layers, soft-capped logits.
TINY_GEMMA2_HF = {
    "model_type": "gemma2",
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 128,
    "sliding_window": 4,
    "query_pre_attn_scalar": 8,
    "final_logit_softcapping": 5.0,
}
GEMMA2_ONLY = ("model_type", "sliding_window", "query_pre_attn_scalar", "final_logit_softcapping")


def tiny_gemma2(**changes) -> ModelConfig:
    """The model of `TINY_GEMMA2_HF` with some of its `config.json` keys changed."""
    return ModelConfig.from_hf({**TINY_GEMMA2_HF, **changes})


def left_padded_prompts(
    lengths, width: int, vocab_size: int, *, seed: int = 0, low: int = 2, meta: dict | None = None
) -> Batch:
    """Prompts of the given lengths, of random tokens in [low, vocab_size), left-padded with 0 to
    `width`, with positions that skip the padding; `meta` is the batch's per-row metadata."""
    mask = (np.arange(width)[None] >= width - np.asarray(lengths)[:, None]).astype(np.int32)
    ids = np.where(mask, np.random.default_rng(seed).integers(low, vocab_size, mask.shape), 0)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": positions}, meta or {})


def left_padded_inputs(pads, width: int, vocab_size: int, *, seed: int, low: int = 0):
    """A model call's (ids, mask, positions): random ids in [low, vocab_size) (numpy's legacy
    `RandomState(seed)`) of `len(pads)` rows of `width` tokens, row i with `pads[i]` tokens of
    left padding, positions that skip the padding."""
    ids = np.random.RandomState(seed).randint(low, vocab_size, (len(pads), width))
    mask = np.ones((len(pads), width), np.int32)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    return ids, mask, np.asarray(default_position_ids(jnp.asarray(mask)))


def padded_rows(
    prompt_lens, response_lens, prompt: int, response: int, vocab_size: int, rng
) -> dict[str, np.ndarray]:
    """Prompts left-padded to `prompt` columns and responses right-padded to `response` columns,
    of the given lengths and of random tokens in [1, vocab_size) from `rng` (0 on the padding):
    `input_ids`, `attention_mask`, `position_ids`, `responses` and `response_mask`."""
    slots = np.arange(prompt + response)
    starts = prompt - np.asarray(prompt_lens)[:, None]
    ends = prompt + np.asarray(response_lens)[:, None]
    mask = ((slots >= starts) & (slots < ends)).astype(np.int32)
    ids = (rng.integers(1, vocab_size, mask.shape) * mask).astype(np.int32)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": np.clip(np.cumsum(mask, axis=1) - 1, 0, None).astype(np.int32),
        "responses": ids[:, prompt:],
        "response_mask": mask[:, prompt:],
    }


def jit_call(model, batch, method="__call__"):
    """`model.method(ids, mask, positions)` for `batch` = (ids, mask, positions), under jit."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, ids, mask, pos):
        return getattr(nnx.merge(graphdef, state), method)(ids, mask, pos)

    return np.asarray(run(state, *(jnp.asarray(a) for a in batch)))


def prefill_then_decode(model, batch, prompt: int, max_len: int):
    """Logits of `batch` = (ids, mask, positions) by `forward_cached`: the first `prompt` tokens
    in one prefill, then one token a step, into a KV cache of `max_len` slots; returns the logits
    [B, T, V] and the cache."""
    ids, mask, pos = batch
    graphdef, state = nnx.split(model)

    @jax.jit
    def step(state, ids, pos, cache, offset, kv_mask):
        m = nnx.merge(graphdef, state)
        hidden, cache, _ = m.forward_cached(ids, pos, cache, offset, kv_mask)
        return m.logits(hidden), cache

    kv_mask = np.zeros((ids.shape[0], max_len), bool)
    kv_mask[:, :prompt] = mask[:, :prompt]
    cache = model.init_cache(ids.shape[0], max_len)
    logits, cache = step(state, ids[:, :prompt], pos[:, :prompt], cache, 0, kv_mask)
    outputs = [np.asarray(logits)]
    for t in range(prompt, ids.shape[1]):
        kv_mask[:, t] = mask[:, t]
        logits, cache = step(state, ids[:, t : t + 1], pos[:, t : t + 1], cache, t, kv_mask)
        outputs.append(np.asarray(logits))
    return np.concatenate(outputs, axis=1), cache


def assert_close(ours, ref, mask, rel=1e-4):
    """max |ours - ref| over valid positions is within rel * max |ref|."""
    valid = mask.astype(bool)
    assert np.isfinite(ours).all()
    err, scale = np.abs(ours[valid] - ref[valid]).max(), np.abs(ref[valid]).max()
    assert err <= rel * scale, (err, scale)


def randomise_adapters(model, seed: int = 1) -> None:
    """Gives every LoRA B a non-zero value (B starts at zero, which hides the adapter)."""
    key = jax.random.key(seed)
    for i, (path, var) in enumerate(nnx.to_flat_state(nnx.state(model, LoRAParam))):
        if path[-1] == "lora_b":
            shape = var.get_value().shape
            var.set_value(0.1 * jax.random.normal(jax.random.fold_in(key, i), shape))


def flatten(tree: dict, prefix: str = "") -> dict:
    """Dotted leaf path -> value of a nested dict (empty dicts are leaves)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def assert_finite(metrics: dict, keys: Iterable[str]) -> None:
    """Each of `keys` is in `metrics` and finite."""
    for key in keys:
        assert math.isfinite(metrics[key]), (key, metrics.get(key))


def tiny_rollout_spec(
    model_path: str = "m", trust_remote_code: bool = False, **changes
) -> RolloutSpec:
    """The rollout of the default config for one tensor-parallel rank, with `changes` to its
    rollout keys (dotted below the section, e.g. ``engine_kwargs.vllm``) and the actor's model
    at `model_path`."""
    config = resolve(default_config())
    rollout = config.actor_rollout_ref.rollout
    rollout.tensor_model_parallel_size = 1
    for key, value in changes.items():
        *sections, name = key.split(".")
        target = rollout
        for section in sections:
            target = target[section]
        target[name] = value
    config.actor_rollout_ref.model.update(
        {"path": model_path, "trust_remote_code": trust_remote_code}
    )
    return rollout_spec(config)


def generate_args(
    prompts: str | Path,
    output: str | Path,
    model: str | Path,
    *overrides: str,
    samples: int,
    batch_size: int,
) -> list[str]:
    """``jrl.generate`` arguments: `samples` answers of up to 3 tokens (float32, plain sampling,
    on the CPU) per digits-task prompt in `prompts` by the model at `model`, then `overrides`."""
    return [
        f"data.path={prompts}",
        f"data.output_path={output}",
        f"model.path={model}",
        f"data.n_samples={samples}",
        f"data.batch_size={batch_size}",
        "rollout.name=jax",
        "rollout.dtype=float32",
        "rollout.prompt_length=8",
        "rollout.response_length=3",
        "rollout.top_k=-1",
        "rollout.top_p=1.0",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        *overrides,
    ]


def one_tiny_ppo_step(run_dir: Path, *overrides: str) -> dict:
    """One step of the `:tiny` PPO card (no validation) with `overrides`; checks that it ran and
    that the actor's and critic's losses and norms are finite; returns the metrics."""
    from jrl import train

    metrics = train.main(
        [
            "--config=configs/gsm8k_ppo.py:tiny",
            *overrides,
            "trainer.total_training_steps=1",
            "trainer.val_before_train=False",
            "trainer.test_freq=-1",
            f"trainer.default_local_dir={run_dir}",
        ]
    )
    assert metrics["training/global_step"] == 1
    assert_finite(
        metrics, ["actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/values/mean"]
    )
    return metrics


def text_batch(tokenizer, responses, truth="7", source="openai/gsm8k") -> Batch:
    """A batch to score: one left-padded prompt per row, right-padded `responses`, gsm8k-style
    meta (ground truth `truth`, data source `source`)."""
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    pad = tokenizer.pad_token_id
    prompt = encode("What is 3 + 4?")
    encoded = [encode(r) for r in responses]
    width = max(len(r) for r in encoded)
    n = len(responses)
    return Batch(
        {
            "prompts": np.array([[pad] + prompt] * n, np.int32),
            "responses": np.array([r + [pad] * (width - len(r)) for r in encoded], np.int32),
            "attention_mask": np.array(
                [[0] + [1] * len(prompt) + [1] * len(r) + [0] * (width - len(r)) for r in encoded],
                np.int32,
            ),
        },
        {
            "data_source": [source] * n,
            "reward_model": [{"ground_truth": truth}] * n,
            "extra_info": [{"index": i} for i in range(n)],
        },
    )


def row_scores(out: dict) -> list[float]:
    """Each row's reward (the sum over its tokens: only the last valid one is non-zero)."""
    return out["reward_tensor"].sum(-1).tolist()


class WatchedRun:
    """``python -m jrl.train ARGS`` in a subprocess (one CPU device), its stdout collected line by
    line while it runs."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jrl.train", *args],
            cwd=REPO,
            env={**os.environ, "XLA_FLAGS": "", **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(
            target=lambda: self.lines.extend(self.process.stdout), daemon=True
        )
        self._reader.start()

    @property
    def output(self) -> str:
        """Standard output so far."""
        return "".join(self.lines)

    def wait_for(self, condition: Callable[[], bool], timeout: float = 600) -> None:
        """Polls `condition` until it holds; fails if the run ends first or time runs out."""
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.process.poll() is None, "the run ended early:\n" + self.output[-3000:]
            assert time.monotonic() < deadline, "timed out waiting on the run"
            time.sleep(0.002)

    def finish(self, timeout: float = 300) -> int:
        """Waits for the process to end; returns its exit status."""
        code = self.process.wait(timeout=timeout)
        self._reader.join()
        return code


def policy_log_probs(
    model: Any,
    mesh: Any,
    batch: Any,
    *,
    rows: int | None,
    budget: Any = None,
    packed: bool = False,
    temperature: float = 0.8,
    calculate_entropy: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The trainer's log-prob pass (`LogProbForward`, naive kernel) of `model` sharded on `mesh`
    over `batch`: chunks of `rows` rows or micro-batches under the token `budget`, packed when
    `packed`."""
    from flax import nnx

    from jrl.parallel import shard_params
    from jrl.trainer.roles.log_probs import LogProbForward
    from jrl.trainer.roles.specs import ForwardSpec

    graphdef, params = nnx.split(model)
    params, shardings = shard_params(params, mesh)
    scoring = types.SimpleNamespace(temperature=temperature, impl="naive")
    forward = LogProbForward(graphdef, shardings, mesh, ForwardSpec(rows, budget, packed), scoring)
    return forward(params, batch, calculate_entropy)


def build_actor(config: Any, mesh: Any, total_training_steps: int = 1) -> Any:
    """The actor of the loaded PPO-family `config` on `mesh`, built as `PPOTrainer` builds it
    (from the RunSpec's actor and algorithm)."""
    from jrl.runspec.spec import resolve_run
    from jrl.trainer.roles.actor import Actor

    run = resolve_run(config)
    return Actor.create(run.actor, run.algorithm, mesh, total_training_steps)


def digits_scale(run_dir: Path) -> list[str]:
    """The digits task's files, tiny random model and one-CPU settings (configs/digits_ppo.py)."""
    paths = digits_paths()
    return [
        f"data.train_files={paths['train_files']}",
        f"data.val_files={paths['val_files']}",
        f"actor_rollout_ref.model.path={paths['model_path']}",
        "data.max_prompt_length=8",
        "data.val_max_samples=32",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.name=jax",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=128",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=False",
        "trainer.test_freq=2",
        "trainer.logger=['console']",
        f"trainer.default_local_dir={run_dir}",
    ]


# Fully-async training that does not depend on timing (staleness_threshold=0) on the digits card:
# each weight version's 32 groups are 2 updates of 2 mini-batches of 8 prompts.
FULLY_ASYNC_KEYS = (
    "async_training.mode=fully_async",
    "async_training.staleness_threshold=0",
    "async_training.trigger_parameter_sync_step=2",
    "async_training.require_batches=2",
    "actor_rollout_ref.rollout.calculate_log_probs=True",
)


def checkpoint_cache(tmp_path_factory, build):
    """name -> (HF folder, torch model) of `build(name)` (a transformers model), each built and
    saved once."""
    built = {}

    def get(name):
        if name not in built:
            model = build(name)
            path = tmp_path_factory.mktemp(name)
            model.save_pretrained(path, safe_serialization=True)
            built[name] = path, model
        return built[name]

    return get
