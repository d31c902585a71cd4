"""Host-side shaping of a generate call: the checks of its prompts, prompt-length buckets and the
split of rows over data-parallel replicas (both in a few fixed sizes so that few shapes are ever
compiled), and the batch an engine returns."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jrl.batch import Batch
from jrl.rollout.limits import ceil_pow2
from jrl.rollout.sampling import SamplingParams

PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")


def check_prompts(
    prompts: Batch,
    sampling: SamplingParams,
    *,
    response_length: int,
    pad_token_id: int,
) -> None:
    """Raise unless `prompts` holds left-padded, non-empty [batch, prompt_length] prompt tensors
    and `sampling` fits the engine's response length and pad token."""
    missing = [k for k in PROMPT_KEYS if k not in prompts.tensors]
    if missing:
        raise KeyError(f"prompt batch lacks tensors {missing}; it needs {list(PROMPT_KEYS)}")
    shapes = {k: tuple(prompts.tensors[k].shape) for k in PROMPT_KEYS}
    if len(set(shapes.values())) > 1 or len(shapes["input_ids"]) != 2:
        raise ValueError(f"prompt tensors must all be [batch, prompt_length]; got {shapes}")
    if sampling.max_new_tokens > response_length:
        raise ValueError(
            f"SamplingParams.max_new_tokens={sampling.max_new_tokens} exceeds the rollout's "
            f"response_length={response_length}"
        )
    if sampling.pad_token_id != pad_token_id:
        raise ValueError(
            f"SamplingParams.pad_token_id={sampling.pad_token_id} differs from the rollout's "
            f"pad_token_id={pad_token_id}; build it with jrl.rollout.sampling_params"
        )
    bad = np.flatnonzero(np.asarray(prompts.tensors["attention_mask"])[:, -1] == 0)
    if bad.size:
        raise ValueError(
            f"prompt rows {bad[:8].tolist()} end with padding (attention_mask 0 in the last "
            "column); prompts must be left-padded and non-empty"
        )


def rows_to_generate(
    prompts: Batch, sampling: SamplingParams, *, response_length: int, pad_token_id: int
) -> Batch:
    """The rows a generate call samples: each prompt `sampling.n` times in a row, once
    `check_prompts` passes."""
    check_prompts(prompts, sampling, response_length=response_length, pad_token_id=pad_token_id)
    return prompts.repeat(sampling.n, interleave=True)


def rollout_batch(
    batch: Batch,
    responses: jax.Array,
    response_mask: jax.Array,
    log_probs: jax.Array | None,
    present: jax.Array | None = None,
) -> Batch:
    """verl's rollout output from `batch` (the prompts, already repeated per response) and one
    right-padded response per row ([rows, R]): `prompts`, `responses`, `response_mask`,
    `input_ids`, `attention_mask`, `position_ids` ([rows, P + R], positions continuing from each
    prompt's last) and `rollout_log_probs` when `log_probs` is given; meta as in `batch`. The
    response's attention is `present` (its real tokens, where a multi-turn response holds tokens
    the loss masks out), else `response_mask`."""
    ids = jnp.asarray(batch["input_ids"])
    prompt_mask = jnp.asarray(batch["attention_mask"])
    positions = jnp.asarray(batch["position_ids"])
    steps = jnp.arange(1, responses.shape[1] + 1, dtype=positions.dtype)
    tensors = {
        "prompts": ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": jnp.concatenate([ids, responses.astype(ids.dtype)], axis=1),
        "attention_mask": jnp.concatenate(
            [
                prompt_mask,
                (response_mask if present is None else present).astype(prompt_mask.dtype),
            ],
            axis=1,
        ),
        "position_ids": jnp.concatenate([positions, positions[:, -1:] + steps], axis=1),
    }
    if log_probs is not None:
        tensors["rollout_log_probs"] = log_probs
    return Batch(tensors, batch.meta)


def prompt_bucket(longest: int, width: int) -> int:
    """The prompt width a batch runs at: the next power of two >= `longest`, at most `width`.

    Left-padded prompts keep all their tokens when cut to their last `bucket` columns.
    """
    return min(width, ceil_pow2(max(longest, 1)))


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """Where each row goes: replica r holds slots r*per_replica .. (r+1)*per_replica - 1.

    `source[j]` is the row in slot j (row 0 again in a padding slot), `real[j]` whether slot j
    holds a row, and `counts[r]` how many rows replica r holds (its first slots).
    """

    source: np.ndarray
    real: np.ndarray
    counts: np.ndarray

    @property
    def per_replica(self) -> int:
        """Row slots per replica (a power of two)."""
        return len(self.source) // len(self.counts)


def row_layout(rows: int, replicas: int) -> RowLayout:
    """Spread `rows` rows over `replicas` in order and as evenly as possible (counts differ by at
    most one), each replica padded to the same power-of-two size."""
    counts = np.full(replicas, rows // replicas) + (np.arange(replicas) < rows % replicas)
    per_replica = ceil_pow2(int(counts.max()))
    lane = np.arange(per_replica)[None, :]
    real = lane < counts[:, None]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    source = np.where(real, starts[:, None] + lane, 0)
    return RowLayout(source.reshape(-1), real.reshape(-1), counts.astype(np.int32))
