"""The `jax` rollout engine: verl's generate contract on top of the on-device sampler."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jrl.batch import Batch
from jrl.models import CausalLM
from jrl.parallel import batch_sharding
from jrl.rollout.sampler import generate_tokens
from jrl.rollout.sampling import SamplingParams, as_token_ids

_PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")


class JaxRollout:
    """Generates responses with the model's own forward pass, compiled once per (rows, P).

    Rows go to the device in groups of `max_batch_rows` (default: all rows of the call); the last
    group is padded up to that size with copies of its first row, so the compiled shapes stay few.
    With a `mesh`, each group is split over the mesh's batch axes (data parallel generation; the
    parameters keep their own sharding), its size rounded up to a multiple of those devices.
    """

    def __init__(
        self,
        model: CausalLM,
        *,
        response_length: int,
        pad_token_id: int,
        eos_token_ids: int | Iterable[int] | None,
        max_batch_rows: int | None = None,
        mesh: Mesh | None = None,
    ):
        if response_length < 1:
            raise ValueError(f"response_length={response_length} must be at least 1")
        if max_batch_rows is not None and max_batch_rows < 1:
            raise ValueError(f"max_batch_rows={max_batch_rows} must be at least 1 (or None)")
        self._graphdef, self._state = nnx.split(model)
        self.response_length = int(response_length)
        self.pad_token_id = int(pad_token_id)
        self.eos_token_ids = as_token_ids(eos_token_ids)
        self.max_batch_rows = max_batch_rows
        self.mesh = mesh

    @property
    def state(self) -> nnx.State:
        """The parameters generation runs with."""
        return self._state

    def sampling_params(self, rollout_cfg: Any, *, validate: bool = False) -> SamplingParams:
        """SamplingParams from verl's `actor_rollout_ref.rollout` keys and this engine's tokens."""
        return SamplingParams.from_rollout_config(
            rollout_cfg,
            response_length=self.response_length,
            eos_token_ids=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            validate=validate,
        )

    def generate(self, prompts: Batch, sampling: SamplingParams, rng: jax.Array) -> Batch:
        """`sampling.n` responses per prompt row, interleaved (p0, p0, .., p1, p1, ..).

        `prompts` holds left-padded `input_ids`, `attention_mask`, `position_ids` [B, P]. The result
        has `prompts`, `responses`, `response_mask`, `input_ids`, `attention_mask`, `position_ids`
        ([B*n, P+R] for the last three), `rollout_log_probs` with `calculate_log_probs`, and the
        prompts' meta repeated. Responses are right-padded to `response_length`.
        """
        self._check(prompts, sampling)
        batch = prompts.repeat(sampling.n, interleave=True)
        ids, mask = jnp.asarray(batch["input_ids"]), jnp.asarray(batch["attention_mask"])
        out = self._generate_rows(ids, mask, sampling, rng)
        width = self.response_length - sampling.max_new_tokens
        fill = {"responses": self.pad_token_id, "response_mask": 0, "rollout_log_probs": 0.0}
        out = {k: jnp.pad(v, ((0, 0), (0, width)), constant_values=fill[k]) for k, v in out.items()}

        positions = jnp.asarray(batch["position_ids"])
        steps = jnp.arange(1, self.response_length + 1, dtype=positions.dtype)
        tensors = {
            "prompts": ids,
            "responses": out["responses"],
            "response_mask": out["response_mask"],
            "input_ids": jnp.concatenate([ids, out["responses"].astype(ids.dtype)], axis=1),
            "attention_mask": jnp.concatenate(
                [mask, out["response_mask"].astype(mask.dtype)], axis=1
            ),
            "position_ids": jnp.concatenate([positions, positions[:, -1:] + steps], axis=1),
        }
        if sampling.calculate_log_probs:
            tensors["rollout_log_probs"] = out["rollout_log_probs"]
        return Batch(tensors, batch.meta)

    def _generate_rows(
        self, ids: jax.Array, mask: jax.Array, sampling: SamplingParams, rng: jax.Array
    ) -> dict[str, jax.Array]:
        rows = ids.shape[0]
        group = self.max_batch_rows or rows
        if self.mesh is not None:
            devices = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
            group = -(-group // devices) * devices
        sampling = dataclasses.replace(sampling, n=1)  # rows are already repeated; one compile
        parts = []
        for index, start in enumerate(range(0, rows, group)):
            part_ids, part_mask = ids[start : start + group], mask[start : start + group]
            real = part_ids.shape[0]
            if real < group:
                part_ids, part_mask = (_pad_rows(x, group) for x in (part_ids, part_mask))
            if self.mesh is not None:
                rows_split = batch_sharding(self.mesh, 2)
                part_ids, part_mask = (jax.device_put(x, rows_split) for x in (part_ids, part_mask))
            out = generate_tokens(
                self._graphdef,
                self._state,
                part_ids,
                part_mask,
                jax.random.fold_in(rng, index),
                sampling,
            )
            parts.append({k: v[:real] for k, v in out.items()})
        return {k: jnp.concatenate([p[k] for p in parts]) for k in parts[0]}

    def _check(self, prompts: Batch, sampling: SamplingParams) -> None:
        missing = [k for k in _PROMPT_KEYS if k not in prompts.tensors]
        if missing:
            raise KeyError(f"prompt batch lacks tensors {missing}; it needs {list(_PROMPT_KEYS)}")
        shapes = {k: tuple(prompts.tensors[k].shape) for k in _PROMPT_KEYS}
        if len(set(shapes.values())) > 1 or len(shapes["input_ids"]) != 2:
            raise ValueError(f"prompt tensors must all be [batch, prompt_length]; got {shapes}")
        if sampling.max_new_tokens > self.response_length:
            raise ValueError(
                f"SamplingParams.max_new_tokens={sampling.max_new_tokens} exceeds the rollout's "
                f"response_length={self.response_length}"
            )
        if sampling.pad_token_id != self.pad_token_id:
            raise ValueError(
                f"SamplingParams.pad_token_id={sampling.pad_token_id} differs from the rollout's "
                f"pad_token_id={self.pad_token_id}; build it with JaxRollout.sampling_params"
            )
        last = np.asarray(prompts.tensors["attention_mask"])[:, -1]
        bad = np.flatnonzero(last == 0)
        if bad.size:
            raise ValueError(
                f"prompt rows {bad[:8].tolist()} end with padding (attention_mask 0 in the last "
                "column); prompts must be left-padded and non-empty"
            )

    def update_weights(self, state: nnx.State) -> None:
        """Use new parameters (same structure and shapes), cast to this engine's dtypes."""
        new = jax.tree_util.tree_flatten_with_path(state)[0]
        old, treedef = jax.tree_util.tree_flatten_with_path(self._state)
        new_paths = [jax.tree_util.keystr(p) for p, _ in new]
        old_paths = [jax.tree_util.keystr(p) for p, _ in old]
        if new_paths != old_paths:
            diff = sorted(set(new_paths) ^ set(old_paths))[:5]
            raise ValueError(f"update_weights: parameter names differ from the rollout's: {diff}")
        leaves = []
        for path, (_, value), (_, current) in zip(new_paths, new, old, strict=True):
            if tuple(value.shape) != tuple(current.shape):
                raise ValueError(
                    f"update_weights: {path} has shape {tuple(value.shape)}, "
                    f"the rollout expects {tuple(current.shape)}"
                )
            leaves.append(jnp.asarray(value, current.dtype))
        self._state = jax.tree_util.tree_unflatten(treedef, leaves)

    def release(self) -> None:
        """No-op: the KV cache is allocated inside each generate call and freed when it returns."""

    def resume(self) -> None:
        """No-op: generate allocates its KV cache itself (see `release`)."""


def _pad_rows(x: jax.Array, rows: int) -> jax.Array:
    fill = jnp.broadcast_to(x[:1], (rows - x.shape[0], *x.shape[1:]))
    return jnp.concatenate([x, fill])
