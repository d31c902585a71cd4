"""Host-side batching: padding rows to a multiple, forward chunks and PPO mini/micro-batches,
by row counts or by token budget (`jrl.trainer.update.dynamic_batching`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from jrl.parallel import host_array, shard_batch
from jrl.trainer.update.dynamic_batching import TokenBudget, budget_forward, plan_micro_batches
from jrl.trainer.update.packing import PackLayout, with_packing

# forward(micro_batch, packed layout or None) -> per-row outputs
Forward = Callable[[dict[str, jax.Array], PackLayout | None], Any]
# packing(tensors) -> (tensors with their packing plan, static layout)
PackingPlan = Callable[[dict[str, np.ndarray]], tuple[dict[str, np.ndarray], Any]]


def pad_rows(tensors: dict[str, np.ndarray], multiple: int) -> tuple[dict[str, np.ndarray], int]:
    """Append all-zero rows so the row count divides `multiple`; returns (padded, original rows)."""
    rows = next(iter(tensors.values())).shape[0]
    extra = -rows % multiple
    if not extra:
        return tensors, rows
    padded = {
        k: np.concatenate([v, np.zeros((extra, *v.shape[1:]), v.dtype)]) for k, v in tensors.items()
    }
    return padded, rows


def chunked_forward(
    fn: Callable[[dict[str, jax.Array]], Any],
    tensors: dict[str, np.ndarray],
    chunk_rows: int,
    mesh: Mesh,
) -> Any:
    """Run the jitted `fn` over row chunks of `chunk_rows` (the last one padded) and concatenate."""
    padded, rows = pad_rows(tensors, chunk_rows)
    total = next(iter(padded.values())).shape[0]
    outputs = []
    for start in range(0, total, chunk_rows):
        chunk = {k: v[start : start + chunk_rows] for k, v in padded.items()}
        outputs.append(jax.tree.map(host_array, fn(shard_batch(chunk, mesh))))
    return jax.tree.map(lambda *xs: np.concatenate(xs)[:rows], *outputs)


def forward_pass(
    fn: Forward,
    tensors: dict[str, np.ndarray],
    mesh: Mesh,
    *,
    rows: int | None,
    remove_padding: bool = False,
    budget: TokenBudget | None = None,
    share_prompts: bool = False,
) -> Any:
    """Per-row outputs of the jitted ``fn(micro_batch, layout)`` over the whole batch: micro
    batches under the token `budget` when one is given (packed as it says), else chunks of `rows`
    (packed when `remove_padding`, answers sharing their prompt when `share_prompts`)."""
    if budget is not None:
        return budget_forward(fn, tensors, budget, mesh)
    tensors, layout = with_packing(tensors, rows, mesh, remove_padding, share_prompts)
    return chunked_forward(lambda chunk: fn(chunk, layout), tensors, rows, mesh)


def forward_inputs(
    tensors: dict[str, np.ndarray],
    mesh: Mesh,
    *,
    rows: int | None,
    remove_padding: bool = False,
    budget: TokenBudget | None = None,
    share_prompts: bool = False,
) -> list[tuple[dict[str, np.ndarray], PackLayout | None]]:
    """The distinct (host micro-batch, layout) inputs `forward_pass` would feed its jitted
    function for `tensors`, one per shape (to compile the pass without running it)."""
    if budget is not None:
        plan = plan_micro_batches(tensors["attention_mask"], budget, mesh)
        chunks = [plan.gather(tensors, micro) for micro in range(plan.count)]
        layout = plan.layout
    else:
        tensors, layout = with_packing(tensors, rows, mesh, remove_padding, share_prompts)
        padded, _ = pad_rows(tensors, rows)
        total = next(iter(padded.values())).shape[0]
        chunks = [
            {k: v[start : start + rows] for k, v in padded.items()}
            for start in range(0, total, rows)
        ]
    distinct = {tuple((k, v.shape) for k, v in chunk.items()): chunk for chunk in chunks}
    return [(chunk, layout) for chunk in distinct.values()]


def fixed_minibatches(
    tensors: dict[str, np.ndarray], mini_rows: int, micro_rows: int, packing: PackingPlan | None
) -> Iterator[tuple[dict[str, np.ndarray], Any]]:
    """`minibatches` of the rows planned once by `packing` (when given), each with the packed
    layout (None without packing)."""
    layout = None
    if packing is not None:
        tensors, layout = packing(tensors)
    for minibatch in minibatches(tensors, mini_rows, micro_rows):
        yield minibatch, layout


def minibatches(
    tensors: dict[str, np.ndarray], mini_rows: int, micro_rows: int
) -> Iterator[dict[str, np.ndarray]]:
    """Consecutive mini-batches of `mini_rows`, each reshaped to ``[mini_rows // micro_rows,
    micro_rows, ...]`` for gradient accumulation (verl splits without shuffling)."""
    total = next(iter(tensors.values())).shape[0]
    if total % mini_rows or mini_rows % micro_rows:
        raise ValueError(
            f"{total} rows do not split into mini-batches of {mini_rows} and micro-batches of "
            f"{micro_rows}; check ppo_mini_batch_size and ppo_micro_batch_size_per_gpu"
        )
    for start in range(0, total, mini_rows):
        yield {
            k: v[start : start + mini_rows].reshape(
                mini_rows // micro_rows, micro_rows, *v.shape[1:]
            )
            for k, v in tensors.items()
        }
