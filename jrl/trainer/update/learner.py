"""A trainable model on the mesh: parameters, optimizer state and the jitted update.

The update takes one mini-batch laid out as ``[n_micro, micro_rows, ...]`` and scans over the micro
batches, accumulating gradients. Each micro-batch loss is already divided by the mini-batch's global
normaliser, so the sum over micro-batches (and devices) is exactly the mini-batch loss: splitting
into micro-batches or devices never changes the gradient. Micro-batches come in fixed row counts or
by token budget (``use_dynamic_bsz``); a micro-batch without response tokens (padding of the scan)
is skipped. Gradients are clipped by global norm as
torch's ``clip_grad_norm_`` does, and a non-finite norm skips the update.

Mini-batches are verl's: the batch is dealt to the data-parallel ranks in contiguous chunks,
each rank cuts its chunk (shuffled per epoch with ``shuffle``) into local mini-batches, and
optimizer step k takes every rank's k-th local mini-batch (`verl_row_order`). With one rank, or
one mini-batch, that is the batch in order.

Only the parameters that the `trainable` filter selects (all of them by default; the LoRA adapters
when LoRA is on) are differentiated, updated and given optimizer state. The rest stay frozen: they
are inputs of the update, never outputs or donated buffers, so other roles (the LoRA reference) may
hold them.

With host offload (`jrl.parallel.Offload`: ``param_offload``, ``optimizer_offload``) the stored
parameters or optimizer state live in host memory between uses: `train` moves them to the device
for its updates and back after. `params` is always in device memory; with parameter offload it is
a device copy, made on first use and shared with whoever asks (e.g. the rollout): the trainable
part's until the next update consumes it, the frozen part's while it is unchanged. Handing the
weights out twice never costs a second device copy.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, traverse_util
from jax.sharding import Mesh

from jrl.algos import LOSS_AGG_MODES, global_denominator
from jrl.optim.optimizers import set_learning_rate
from jrl.parallel import (
    ON_DEVICE,
    Offload,
    batch_sharding,
    data_parallel_size,
    is_abstract,
    param_shardings,
    place,
    put_global,
    replicated,
    shard_params,
)
from jrl.trainer.update.batching import PackingPlan, fixed_minibatches
from jrl.trainer.update.dynamic_batching import TokenBudget, token_minibatches

# loss_fn(model, micro_batch, normaliser) -> (loss, {metric_name: contribution}). It is hashable
# and its hash covers every option it closes over (a frozen dataclass, or a plain function): the
# compiled update is cached per loss, so a changed option always compiles a new program.
LossFn = Callable[[Any, dict[str, jax.Array], jax.Array], tuple[jax.Array, dict[str, jax.Array]]]


@dataclasses.dataclass(frozen=True)
class UpdatePlan:
    """How one role's update walks a batch, resolved once from the config.

    `epochs` passes over mini-batches of `mini_rows` rows (None: the whole batch), one optimizer
    step each, gradients clipped to `grad_clip`. Each mini-batch is split into micro-batches of
    `micro_rows` rows, or under `token_budget` (``use_dynamic_bsz``, which then also says whether
    they are packed); `packing` (packed sequences, with `micro_rows`) plans each epoch's rows
    once they are in order. `loss_scale_factor` fixes the ``seq-mean-token-sum-norm`` divisor.
    """

    grad_clip: float
    mini_rows: int | None = None
    epochs: int = 1
    micro_rows: int | None = None
    token_budget: TokenBudget | None = None
    packing: PackingPlan | None = None
    loss_scale_factor: float | None = None

    def __post_init__(self) -> None:
        if (self.micro_rows is None) == (self.token_budget is None):
            raise ValueError("an UpdatePlan needs exactly one of micro_rows and token_budget")


@dataclasses.dataclass
class Learner:
    """Graph definition, sharded trainable and frozen parameters, and the optimizer state (of the
    trainable part only) of one trainable role, each stored where its `Offload` says.

    Its state changes only through its own methods: `train` (the updates) and `load` (a
    checkpoint); `state_dict` is what a checkpoint saves. Compiled updates are cached per
    (loss, layout, shapes).
    """

    graphdef: Any
    trainable: Any
    frozen: Any
    opt_state: Any
    tx: optax.GradientTransformation
    mesh: Mesh
    trainable_shardings: Any
    frozen_shardings: Any
    opt_shardings: Any
    compiled: dict[Any, Any] = dataclasses.field(default_factory=dict)
    param_offload: Offload = ON_DEVICE
    optimizer_offload: Offload = ON_DEVICE
    # With parameter offload: per state name, (the stored state, its device copy in use).
    _device_copies: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def create(
        cls,
        model: nnx.Module,
        tx: optax.GradientTransformation,
        mesh: Mesh,
        trainable: Any = nnx.Param,
        *,
        param_offload: Offload = ON_DEVICE,
        optimizer_offload: Offload = ON_DEVICE,
    ) -> Learner:
        """Split `model` into the `trainable` variables (an NNX filter, e.g. `LoRAParam`) and the
        frozen rest, place both as `jrl.parallel.TRAINING_RULES` lay out their logical axes
        (fsdp + tensor) and initialise the optimizer for the trainable part;
        the parameters and the optimizer state are then stored as their offloads say. A model
        of shapes only (`nnx.eval_shape`) gives a learner of shapes with their shardings, whose
        updates can be compiled (`update_programs`) but not run."""
        graphdef, train_params, frozen = nnx.split(model, trainable, ...)
        if not jax.tree.leaves(train_params):
            raise ValueError(f"the model has no parameters that match the filter {trainable}")
        train_params, train_shardings = shard_params(train_params, mesh)
        frozen, frozen_shardings = shard_params(frozen, mesh)
        opt_shapes = jax.eval_shape(tx.init, train_params)
        opt_shardings = param_shardings(opt_shapes, mesh)
        if is_abstract(train_params):  # shapes only, to compile for a slice (`jrl.compile`)
            opt_state = place(opt_shapes, opt_shardings)
        else:
            opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(train_params)
        return cls(
            graphdef,
            param_offload.store(train_params, train_shardings),
            param_offload.store(frozen, frozen_shardings),
            optimizer_offload.store(opt_state, opt_shardings),
            tx,
            mesh,
            train_shardings,
            frozen_shardings,
            opt_shardings,
            param_offload=param_offload,
            optimizer_offload=optimizer_offload,
        )

    @property
    def params(self) -> Any:
        """All parameters (trainable and frozen) as one state, in device memory."""
        return nnx.merge_state(self._on_device("trainable"), self._on_device("frozen"))

    def _on_device(self, name: str) -> Any:
        """The stored `name` state ('trainable' or 'frozen') in device memory: itself, or with
        parameter offload its device copy, made on first use and kept while the stored state
        is unchanged."""
        stored = getattr(self, name)
        if not self.param_offload.enabled:
            return stored
        source, copy = self._device_copies.get(name, (None, None))
        if source is not stored:
            copy = self.param_offload.fetch(stored, getattr(self, f"{name}_shardings"))
            self._device_copies[name] = (stored, copy)
        return copy

    @property
    def param_shardings(self) -> Any:
        """Shardings of `params`."""
        return nnx.merge_state(self.trainable_shardings, self.frozen_shardings)

    def model(self) -> nnx.Module:
        """The model with the current parameters (for host-side use)."""
        return nnx.merge(self.graphdef, self.trainable, self.frozen)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint saves: ``model`` (every parameter, as a pure dict) and
        ``optimizer`` (the optimizer state, where it is stored)."""
        return {"model": nnx.to_pure_dict(self.params), "optimizer": self.opt_state}

    def load(self, model: dict[str, Any] | None = None, optimizer: Any = None) -> None:
        """Replaces the parameters with the arrays at the same paths of `model` (a pure dict, as
        `state_dict` gives) and the optimizer state with `optimizer`; None keeps that part."""
        if model is not None:
            self.trainable = _fill(self.trainable, model)
            self.frozen = _fill(self.frozen, model)
        if optimizer is not None:
            self.opt_state = optimizer

    def step(
        self, update: Any, minibatch: dict[str, Any], normaliser: dict[str, Any], lr: float
    ) -> dict[str, jax.Array]:
        """Applies one `build_update` step in place to the state, which must be in device memory
        (as it is inside `train`), with the state's mesh as the ambient mesh (so that the model
        runs sequence parallel on a mesh with a `sequence` axis); returns its metrics (on
        device)."""
        shardings = micro_batch_shardings(self.mesh, minibatch)
        minibatch = {k: put_global(v, shardings[k]) for k, v in minibatch.items()}
        with jax.set_mesh(self.mesh):
            self.trainable, self.opt_state, metrics = update(
                self.trainable, self.frozen, self.opt_state, minibatch, normaliser, lr
            )
        return metrics

    def train(
        self,
        loss_fn: LossFn,
        tensors: dict[str, np.ndarray],
        plan: UpdatePlan,
        *,
        lr: float,
        shuffle_seed: Sequence[int] | None = None,
    ) -> dict[str, list[float]]:
        """`plan.epochs` passes over mini-batches, one optimizer step each.

        Mini-batches are verl's (`verl_row_order` over the mesh's data-parallel ranks), with
        `shuffle_seed` (the `shuffle` key) each rank's rows permuted afresh each epoch by a
        generator seeded with (*shuffle_seed, epoch). `loss_fn` receives a packed layout as
        `packing=`. Offloaded states are in device memory for the passes and back in host memory
        after. Returns every update's metrics as lists (one entry per mini-batch update).
        """
        stored_frozen = self.frozen
        self.trainable, self.frozen = self._on_device("trainable"), self._on_device("frozen")
        self._device_copies.pop("trainable", None)  # the updates consume it
        self.opt_state = self.optimizer_offload.fetch(self.opt_state, self.opt_shardings)
        history: dict[str, list[float]] = {}
        for mb, update in self.updates(loss_fn, tensors, plan, shuffle_seed):
            norm = normalisers(mb["response_mask"], plan.loss_scale_factor)
            metrics = self.step(update, mb, norm, lr)
            for k, v in jax.device_get(metrics).items():
                history.setdefault(k, []).append(float(v))
        self.trainable = self.param_offload.store(self.trainable, self.trainable_shardings)
        self.frozen = stored_frozen
        self.opt_state = self.optimizer_offload.store(self.opt_state, self.opt_shardings)
        return history

    def updates(
        self,
        loss_fn: LossFn,
        tensors: dict[str, np.ndarray],
        plan: UpdatePlan,
        shuffle_seed: Sequence[int] | None = None,
    ) -> Iterator[tuple[dict[str, np.ndarray], Any]]:
        """Every mini-batch of `train` in order (``[n_micro, rows, ...]`` host arrays) with its
        jitted update, compiled once per (loss, layout, shapes) and cached."""
        dynamic = plan.token_budget is not None
        rows = next(iter(tensors.values())).shape[0]
        mini_rows = plan.mini_rows or rows
        ranks = data_parallel_size(self.mesh)
        for epoch in range(plan.epochs):
            rng = None
            if shuffle_seed is not None:
                rng = np.random.default_rng([*shuffle_seed, epoch])
            order = verl_row_order(rows, ranks, mini_rows, rng)
            epoch_tensors = tensors if order is None else {k: v[order] for k, v in tensors.items()}
            if dynamic:
                split = token_minibatches(epoch_tensors, mini_rows, plan.token_budget, self.mesh)
            else:
                split = fixed_minibatches(epoch_tensors, mini_rows, plan.micro_rows, plan.packing)
            for mb, layout in split:
                key = (loss_fn, layout, dynamic, tuple((k, v.shape) for k, v in mb.items()))
                if key not in self.compiled:
                    micro_loss = loss_fn
                    if layout is not None:
                        micro_loss = functools.partial(loss_fn, packing=layout)
                    self.compiled[key] = build_update(
                        self, micro_loss, plan.grad_clip, mb, skip_empty=dynamic
                    )
                yield mb, self.compiled[key]


def _fill(state: nnx.State, values: dict[str, Any]) -> nnx.State:
    """A copy of `state` with each array replaced by the one at the same path in `values`."""
    flat = traverse_util.flatten_dict(values)
    paths = traverse_util.flatten_dict(nnx.to_pure_dict(state))
    out = jax.tree.map(lambda x: x, state)
    nnx.replace_by_pure_dict(out, traverse_util.unflatten_dict({k: flat[k] for k in paths}))
    return out


def verl_row_order(
    rows: int, ranks: int, mini_rows: int, rng: np.random.Generator | None = None
) -> np.ndarray | None:
    """The row order whose consecutive `mini_rows` slices are verl's mini-batches over `ranks`
    data-parallel ranks: rank r holds the r-th contiguous chunk of the batch (permuted by `rng`
    when given, as each rank's shuffle), cut into local mini-batches of ``mini_rows // ranks``
    rows; mini-batch k is the ranks' k-th local mini-batches, rank after rank. None when that is
    the batch in order; with one rank only the shuffle applies. Rows that do not split evenly
    over the ranks keep their order (shuffled as one chunk)."""
    if rows % ranks or mini_rows % ranks:
        ranks = 1
    if ranks == 1 or rows == mini_rows:
        return None if rng is None else rng.permutation(rows)
    chunks = np.arange(rows).reshape(ranks, rows // ranks)
    if rng is not None:
        chunks = np.stack([rng.permutation(chunk) for chunk in chunks])
    local = chunks.reshape(ranks, -1, mini_rows // ranks)
    return local.transpose(1, 0, 2).reshape(-1)


def normalisers(mask: np.ndarray, loss_scale_factor: float | None) -> dict[str, jax.Array]:
    """Global divisors of one mini-batch (all its micro-batches): one per aggregation mode (a loss
    may fix its own mode) plus the valid-token count for token-level metrics."""
    flat = mask.reshape(-1, mask.shape[-1])
    out = {m: global_denominator(flat, m, loss_scale_factor) for m in LOSS_AGG_MODES}
    out["tokens"] = jnp.sum(flat).astype(jnp.float32)
    return {k: jnp.maximum(v, 1e-8) for k, v in out.items()}


def micro_batch_shardings(mesh: Mesh, minibatch: dict[str, Any]) -> dict[str, Any]:
    """Shardings for ``[n_micro, rows, ...]`` arrays: rows split over the batch axes."""
    return {k: batch_sharding(mesh, jnp.ndim(v), row_axis=1) for k, v in minibatch.items()}


def build_update(
    learner: Learner,
    loss_fn: LossFn,
    grad_clip: float,
    example: dict[str, Any],
    skip_empty: bool = False,
):
    """Jitted ``update(trainable, frozen, opt_state, minibatch, normaliser, lr)``, returning the
    new trainable params, optimizer state and metrics (`Learner.step` calls it). The trainable
    params and the optimizer state are donated; the frozen params are only read. With
    `skip_empty`, micro-batches whose ``response_mask`` is all zero are not computed."""
    graphdef = learner.graphdef

    def micro_loss(params, frozen, micro, normaliser):
        return loss_fn(nnx.merge(graphdef, params, frozen), micro, normaliser)

    def like_params(tree):
        """`tree` laid out as the trainable params: the gradient sum stays sharded."""
        return jax.lax.with_sharding_constraint(tree, learner.trainable_shardings)

    def update(params, frozen, opt_state, minibatch, normaliser, lr):
        grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

        def accumulate(grads, micro):
            # Tied to the micro-batch, the weights are gathered inside each iteration; as loop
            # invariants XLA would gather every layer's weights once, before the scan.
            here, frozen_here, micro = jax.lax.optimization_barrier((params, frozen, micro))
            (loss, aux), g = grad_fn(here, frozen_here, micro, normaliser)
            return like_params(jax.tree.map(jnp.add, grads, g)), (loss, aux)

        def body(grads, micro):
            if not skip_empty:
                return accumulate(grads, micro)
            outputs = jax.eval_shape(accumulate, grads, micro)[1]
            nothing = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), outputs)
            active = jnp.any(micro["response_mask"] != 0)
            return jax.lax.cond(active, accumulate, lambda g, _: (g, nothing), grads, micro)

        zeros = like_params(jax.tree.map(jnp.zeros_like, params))
        grads, (losses, aux) = jax.lax.scan(body, zeros, minibatch)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(grad_norm)
        scale = jnp.minimum(1.0, grad_clip / (grad_norm + 1e-6))
        grads = jax.tree.map(lambda g: g * scale, grads)
        opt_state = set_learning_rate(opt_state, jnp.asarray(lr, jnp.float32))
        updates, new_opt_state = learner.tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
        metrics = {k: v.sum() for k, v in aux.items()}
        metrics.update(loss=losses.sum(), grad_norm=grad_norm, skipped=1.0 - finite)
        return (
            jax.tree.map(keep, new_params, params),
            jax.tree.map(keep, new_opt_state, opt_state),
            metrics,
        )

    rep = replicated(learner.mesh)
    return jax.jit(
        update,
        in_shardings=(
            learner.trainable_shardings,
            learner.frozen_shardings,
            learner.opt_shardings,
            micro_batch_shardings(learner.mesh, example),
            rep,
            rep,
        ),
        out_shardings=(learner.trainable_shardings, learner.opt_shardings, rep),
        donate_argnums=(0, 2),
    )
