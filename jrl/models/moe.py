"""The sparse MLP block of a mixture-of-experts layer (Qwen3-MoE, Mixtral): a router and a stack
of gated expert MLPs.

For a token x (hidden size H) and E experts of width I:

    p = softmax(x W_r)                (W_r: [H, E]; float32)
    (w, e) = top_k(p, k)              (w renormalised to sum to 1 where the family does so)
    y = sum_j w_j f_{e_j}(x),   f_e(x) = act(x G_e) * (x U_e) D_e   (G_e, U_e: [H, I]; D_e: [I, H])

The experts' weights are stacked [E, H, I] / [E, I, H] (logical axes ``expert``, ``embed``,
``mlp``). A training forward (one that knows which tokens are real) also records each block's
router load for transformers' load-balancing loss (`load_balancing_loss`).

Router replay (verl's R2 / R3): a block given `replay` [N, k] experts uses those where they are
>= 0 (and its own top-k elsewhere), weighted by the router's probabilities there,
w_j = p[replay_j] (renormalised as the family does), so the gradient still reaches the router.
Every block returns the experts it used, so a forward can record them (`ROUTE_NONE` marks a
token without a recorded route).

`moe_implementation` picks how f runs: ``ragged`` sorts the N * k (token, expert) pairs by
expert and runs each matmul as one grouped matmul (`jax.lax.ragged_dot`), so each token pays for
its k experts only; ``dense`` runs every expert on every token and weighs the outputs (the
reference path: E / k times the work).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from jrl.models.config import ModelConfig
from jrl.models.dtypes import product_dtype
from jrl.models.families import FAMILIES
from jrl.parallel.mesh import SEQUENCE_AXIS, batch_axes, sequence_parallel_size
from jrl.parallel.sharding import EXPERT_AXIS, logical_axes

# The name under which a sparse block records its router's load in a training forward: the
# experts picked and the router's probabilities, summed over the real tokens, and their count.
ROUTER_LOAD = "router_load"
# A recorded route's entry for a token that has none (the last generated token of a rollout row,
# padding): the block routes such a token itself.
ROUTE_NONE = -1
# The batch tensor of recorded routes [B, T, sparse layers, k], aligned with ``input_ids``: the
# rollout's (R3) or the old-log-prob pass's (R2); a forward given it replays it.
ROUTED_EXPERTS = "routed_experts"


def route_dtype(num_experts: int) -> Any:
    """The smallest integer type of a recorded route: experts 0 .. E-1 and `ROUTE_NONE`."""
    return jnp.int8 if num_experts <= jnp.iinfo(jnp.int8).max else jnp.int16


# The routers' parameters, by their names in every mixture-of-experts family (an NNX filter).
ROUTERS = nnx.Any(
    *(nnx.PathContains(name) for name in {f.sparse.router for f in FAMILIES.values() if f.sparse})
)


class ExpertStack(nnx.Module):
    """The E experts' gate, up and down weights, stacked, under HF's names (`names`: gate, up,
    down; HF files hold them as ``experts.{e}.<name>.weight``)."""

    def __init__(
        self,
        config: ModelConfig,
        names: tuple[str, str, str],
        *,
        param_dtype: Any,
        rngs: nnx.Rngs,
    ) -> None:
        experts = config.experts
        count, hidden, width = experts.num_experts, config.hidden_size, experts.intermediate_size
        init = nnx.initializers.normal(config.initializer_range)
        shapes = ((count, hidden, width), (count, hidden, width), (count, width, hidden))
        axes = (("expert", "embed", "mlp"),) * 2 + (("expert", "mlp", "embed"),)
        for name, shape, names_of_axes in zip(names, shapes, axes, strict=True):
            value = init(rngs.params(), shape, param_dtype)
            setattr(self, name, nnx.Param(value, **logical_axes(*names_of_axes)))
        self.names = names

    def weights(self, dtype: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(gate, up, down) in the compute `dtype`."""
        return tuple(getattr(self, name)[...].astype(dtype) for name in self.names)


class SparseMoE(nnx.Module):
    """A layer's sparse MLP block (the module docstring's formula), named as the family's
    `SparseBlock` says; `router` is its linear map [H, E] without bias."""

    def __init__(
        self,
        config: ModelConfig,
        router: nnx.Module,
        activation: Callable[[jax.Array], jax.Array],
        *,
        dtype: Any,
        param_dtype: Any,
        rngs: nnx.Rngs,
    ) -> None:
        block, experts = config.family.sparse, config.experts
        setattr(self, block.router, router)
        self.experts = ExpertStack(config, block.expert_weights, param_dtype=param_dtype, rngs=rngs)
        self.router_name = block.router
        self.top_k = experts.experts_per_token
        renormalize = block.renormalize
        self.renormalize = experts.norm_topk_prob if renormalize is None else renormalize
        self.weights_in_logits_dtype = block.weights_in_logits_dtype
        self.implementation = config.moe_implementation
        self.activation = activation
        self.dtype = dtype
        # The mesh axis whose devices split the experts inside a program that runs per batch
        # shard (the rollout's replicas: `split_experts_over`); None: `EXPERT_AXIS`'s dispatch.
        self.replica_axis: str | None = None

    def route(
        self, tokens: jax.Array, replay: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(router logits [N, E], the top-k experts' weights [N, k], their indices [N, k]); the
        indices are `replay`'s [N, k] where it holds a route (>= 0)."""
        logits = getattr(self, self.router_name)(tokens)
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        weights, chosen = jax.lax.top_k(probs, self.top_k)
        if replay is not None:
            chosen = jnp.where(replay >= 0, replay.astype(chosen.dtype), chosen)
            weights = jnp.take_along_axis(probs, chosen, axis=-1)
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdims=True)
        if self.weights_in_logits_dtype:
            weights = weights.astype(logits.dtype)
        return logits, weights, chosen

    def __call__(
        self,
        x: jax.Array,
        token_mask: jax.Array | None = None,
        replay: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        """(the block's output for x [..., H], the experts each token used [..., k] int32);
        with `token_mask` (x's leading shape, 1 on real tokens) it records the router's load
        over those tokens (`ROUTER_LOAD`); `replay` [..., k] gives routes to use (`route`)."""
        tokens = x.reshape(-1, x.shape[-1])
        replay = None if replay is None else replay.reshape(-1, self.top_k)
        logits, weights, chosen = self.route(tokens, replay)
        if token_mask is not None:
            real = token_mask.reshape(-1).astype(jnp.float32)
            picked = jax.nn.one_hot(chosen, logits.shape[-1], dtype=jnp.float32).sum(1)
            probs = jax.nn.softmax(logits, axis=-1).astype(jnp.float32)
            self.sow(nnx.Intermediate, ROUTER_LOAD, (real @ picked, real @ probs, real.sum()))
        dtype = self.dtype or x.dtype
        gate, up, down = self.experts.weights(dtype)
        run = ragged_experts if self.implementation == "ragged" else dense_experts
        if self.replica_axis is not None and splits(self.replica_axis):
            run = functools.partial(replica_experts, per_device=run, axis=self.replica_axis)
        elif runs_per_device(gate.shape[0]):
            run = functools.partial(parallel_experts, per_device=run)
        out = run(tokens.astype(dtype), weights, chosen, (gate, up, down), self.activation)
        used = chosen.astype(jnp.int32).reshape(*x.shape[:-1], self.top_k)
        return out.reshape(x.shape).astype(dtype), used


def load_balancing_loss(model: nnx.Module) -> jax.Array | None:
    """transformers' load-balancing loss of the sparse blocks' last training forward (their
    records popped from `model`; None where nothing was recorded): over the real tokens t of
    every sparse layer l, with p_t the softmax of the router logits and k experts picked,

        aux = E * sum_e f_e * P_e,   f_e = #{(l, t, j): e chosen} / #(l, t),
                                     P_e = sum_{l, t} p_t[e] / #(l, t)

    (uniform routing gives k)."""
    records = nnx.pop(model, nnx.Intermediate)
    loads = [
        load
        for path, variable in nnx.to_flat_state(records)
        if path[-1] == ROUTER_LOAD
        for load in variable.get_value()
    ]
    if not loads:
        return None
    picked, probs, rows = (sum(parts) for parts in zip(*loads, strict=True))
    return picked.shape[-1] * jnp.sum((picked / rows) * (probs / rows))


def _product(dtype: Any) -> Any:
    """The result dtype a 16-bit matmul asks for (`dtypes.product_dtype`), else None."""
    return product_dtype() if jnp.dtype(dtype).itemsize == 2 else None


def grouped_ffn(
    rows: jax.Array,
    sizes: jax.Array,
    experts: tuple[jax.Array, jax.Array, jax.Array],
    activation: Callable[[jax.Array], jax.Array],
) -> jax.Array:
    """f of `rows` [M, H] sorted by expert, `sizes[e]` rows for expert e (rows beyond their sum
    come out 0): each matmul one `jax.lax.ragged_dot` over the experts."""
    gate, up, down = experts
    wide = _product(rows.dtype)

    def grouped(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
        out = jax.lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=wide)
        return out.astype(rows.dtype)

    return grouped(activation(grouped(rows, gate)) * grouped(rows, up), down)


def ragged_experts(
    tokens: jax.Array,
    weights: jax.Array,
    chosen: jax.Array,
    experts: tuple[jax.Array, jax.Array, jax.Array],
    activation: Callable[[jax.Array], jax.Array],
) -> jax.Array:
    """y [N, H] of `tokens` [N, H] through their `chosen` experts [N, k] weighted by `weights`:
    the N * k pairs sorted by expert, through `grouped_ffn`."""
    count, k = experts[0].shape[0], chosen.shape[1]
    flat = chosen.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=count).astype(jnp.int32)
    out = grouped_ffn(tokens[order // k], sizes, experts, activation)
    out = out * weights.reshape(-1)[order][:, None].astype(tokens.dtype)
    return out[jnp.argsort(order)].reshape(-1, k, tokens.shape[-1]).sum(1)


def parallel_experts(
    tokens: jax.Array,
    weights: jax.Array,
    chosen: jax.Array,
    experts: tuple[jax.Array, jax.Array, jax.Array],
    activation: Callable[[jax.Array], jax.Array],
    per_device: Callable[..., jax.Array] = ragged_experts,
) -> jax.Array:
    """`per_device` (`ragged_experts` or `dense_experts`) on each device, inside one `shard_map`
    over the ambient mesh: tokens [N, H], weights and choices [N, k] split by rows over the
    batch axes (and ``sequence``), each device holding E / D experts whole (D: the ``data``
    axis, the expert axis `EXPERT_AXIS`; gathered over ``fsdp`` and ``tensor`` only). With D = 1
    each device runs its own tokens through every expert (left to the partitioner, the block
    would gather every device's tokens onto each). With D > 1 each device sends each of its
    (token, expert) pairs to the device holding the expert (`jax.lax.all_to_all`, a slot for
    every pair a device could send: no pair is dropped), runs its experts over what it received
    (each received row with its one expert, weight 1; an empty slot names no expert held and
    comes out 0), and sends the outputs back; no device ever holds another's experts."""
    mesh = jax.sharding.get_abstract_mesh()
    rows = (*batch_axes(), *((SEQUENCE_AXIS,) if sequence_parallel_size(mesh) > 1 else ()))
    by_rows, by_expert = P(rows), P(EXPERT_AXIS)

    def local(tokens, weights, chosen, gate, up, down):
        devices, held, k = jax.lax.axis_size(EXPERT_AXIS), gate.shape[0], chosen.shape[1]
        if devices == 1:  # every expert here: the device's own tokens only
            return per_device(tokens, weights, chosen, (gate, up, down), activation)
        pairs = chosen.reshape(-1)
        to, expert = pairs // held, pairs % held
        sent = jax.nn.one_hot(to, devices, dtype=jnp.int32)
        slot = jnp.take_along_axis(jnp.cumsum(sent, 0) - sent, to[:, None], 1)[:, 0]
        capacity, width = pairs.shape[0], tokens.shape[-1]
        outbox = jnp.zeros((devices, capacity, width), tokens.dtype)
        outbox = outbox.at[to, slot].set(tokens[jnp.arange(capacity) // k])
        labels = jnp.full((devices, capacity), held, jnp.int32).at[to, slot].set(expert)
        inbox = jax.lax.all_to_all(outbox, EXPERT_AXIS, 0, 0).reshape(-1, width)
        owners = jax.lax.all_to_all(labels, EXPERT_AXIS, 0, 0).reshape(-1, 1)
        ones = jnp.ones(owners.shape, weights.dtype)
        out = per_device(inbox, ones, owners, (gate, up, down), activation)
        out = out.reshape(devices, capacity, width)
        back = jax.lax.all_to_all(out, EXPERT_AXIS, 0, 0)[to, slot]  # [pairs, H]
        back = back * weights.reshape(-1)[:, None].astype(tokens.dtype)
        return back.reshape(-1, k, width).sum(1)

    spread = jax.shard_map(
        local,
        in_specs=(by_rows, by_rows, by_rows, by_expert, by_expert, by_expert),
        out_specs=by_rows,
    )
    return spread(tokens, weights, chosen, *experts)


def replica_experts(
    tokens: jax.Array,
    weights: jax.Array,
    chosen: jax.Array,
    experts: tuple[jax.Array, jax.Array, jax.Array],
    activation: Callable[[jax.Array], jax.Array],
    per_device: Callable[..., jax.Array],
    axis: str,
) -> jax.Array:
    """`per_device` inside one `shard_map` over the mesh axis `axis` (within a program that
    already runs per batch shard, such as the rollout's replicas): every device of `axis` sees
    every token and holds E / D experts whole; it runs the (token, expert) pairs of its own
    experts (the others weighted 0, their expert one it does not hold, which comes out 0), and
    the outputs are summed over `axis`. As vLLM's expert parallelism within a tensor-parallel
    group: one all-reduce, no all-to-all."""

    def local(tokens, weights, chosen, gate, up, down):
        held = gate.shape[0]
        first = jax.lax.axis_index(axis) * held
        mine = (chosen >= first) & (chosen < first + held)
        local_chosen = jnp.where(mine, chosen - first, held)
        local_weights = jnp.where(mine, weights, jnp.zeros_like(weights))
        out = per_device(tokens, local_weights, local_chosen, (gate, up, down), activation)
        return jax.lax.psum(out, axis)

    whole, split = P(), P(axis)
    spread = jax.shard_map(
        local,
        in_specs=(whole, whole, whole, split, split, split),
        out_specs=whole,
        axis_names=frozenset({axis}),
    )
    return spread(tokens, weights, chosen, *experts)


def splits(axis: str) -> bool:
    """Whether the ambient mesh has `axis` with more than one device, not yet manual."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and axis not in mesh.manual_axes and dict(mesh.shape).get(axis, 1) > 1


def split_experts_over(model: nnx.Module, axis: str) -> None:
    """Makes every sparse block of `model` split its experts over the mesh axis `axis` inside
    programs that run per batch shard (`replica_experts`); in place, before `nnx.split`."""
    for _, module in model.iter_modules():
        if isinstance(module, SparseMoE):
            module.replica_axis = axis


def runs_per_device(count: int) -> bool:
    """Whether the block runs per device (`parallel_experts`): under an ambient mesh (outside
    any `shard_map` over it) whose expert axis divides the `count` experts."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.manual_axes:
        return False
    return count % dict(mesh.shape).get(EXPERT_AXIS, 1) == 0


def dense_experts(
    tokens: jax.Array,
    weights: jax.Array,
    chosen: jax.Array,
    experts: tuple[jax.Array, jax.Array, jax.Array],
    activation: Callable[[jax.Array], jax.Array],
) -> jax.Array:
    """`ragged_experts`' result with every expert run on every token and the outputs weighed by
    each token's weights on its chosen experts (0 elsewhere): the reference path."""
    gate, up, down = experts
    hidden = activation(jnp.einsum("nh,ehi->eni", tokens, gate))
    hidden = hidden * jnp.einsum("nh,ehi->eni", tokens, up)
    outs = jnp.einsum("eni,eih->enh", hidden, down)  # [E, N, H]
    mix = (jax.nn.one_hot(chosen, gate.shape[0], dtype=weights.dtype) * weights[..., None]).sum(1)
    return jnp.einsum("ne,enh->nh", mix.astype(tokens.dtype), outs)
