"""Logical axes of parameters and the rules that lay them out on a mesh.

Each parameter names its dimensions where it is created (`logical_axes`, stored as Flax's
``out_sharding`` variable metadata): ``vocab``, ``embed`` (the hidden size), ``heads`` and
``kv_heads`` (fused ``heads * head_dim`` projection columns), ``mlp`` (the intermediate size),
``norm`` (norm scales) and ``lora_rank``; None names a dimension never split (a one-output
head). A rules table maps each name to the mesh axis (or axes) that splits it, one per mesh kind:

- `TRAINING_RULES` (fsdp x tensor): ``embed`` over ``fsdp`` (ZeRO-3), and Megatron-style tensor
  parallelism over ``tensor``: ``heads``, ``kv_heads``, ``mlp`` and ``vocab``.
- `ROLLOUT_RULES` (tensor only, data-parallel replicas): the same ``tensor`` split with
  ``embed`` whole, so attention heads and MLP columns go in, the matching rows come out, and the
  embedding and LM head split the vocabulary; `ROLLOUT_EXPERT_RULES` split a mixture's experts
  over ``tensor`` instead of their width (the rollout's ``expert_parallel_size``).

`param_shardings` applies a table to parameters and to anything that mirrors them (optax's
``mu`` / ``nu`` keep the variables' metadata). A dimension of size n split over mesh axes of
sizes m_1..m_k needs n % (m_1 * ... * m_k) == 0 and stays whole otherwise; axes of size 1 are
left out, and arrays without logical axes (an optimizer's step count) are replicated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# A logical axis name -> the mesh axis, or axes, that split it (None: kept whole).
Rules = Mapping[str, str | tuple[str, ...] | None]

# The mesh axis that splits a mixture of experts' experts (`jrl.models.moe.parallel_experts`):
# expert parallelism runs over the data-parallel axis, as Megatron's expert groups split the
# data-parallel ranks.
EXPERT_AXIS = "data"
TRAINING_RULES: Rules = {
    "vocab": "tensor",
    "embed": "fsdp",
    "heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "expert": EXPERT_AXIS,
    "norm": None,
    "lora_rank": None,
}
# The rollout keeps every expert on each device (its tensor axis splits their width)...
ROLLOUT_RULES: Rules = {**TRAINING_RULES, "embed": None, "expert": None}
# ... or, with the rollout's expert parallelism, splits a replica's experts over its tensor axis
# (each expert whole: its width no longer split).
ROLLOUT_EXPERT_RULES: Rules = {**ROLLOUT_RULES, "expert": "tensor"}
# The variable metadata key that holds the logical axes (Flax's own, see `nnx.get_partition_spec`).
_AXES_KEY = "out_sharding"


def logical_axes(*names: str | None) -> dict[str, Any]:
    """Variable metadata naming a parameter's dimensions, e.g. ``nnx.Param(w,
    **logical_axes("embed", "mlp"))`` or ``nnx.Linear(..., kernel_metadata=logical_axes(...))``.

    The parameter is not placed when created (``eager_sharding=False``): `param_shardings` lays
    it out on a mesh."""
    return {_AXES_KEY: names, "eager_sharding": False}


def axes_of(variable: nnx.Variable) -> tuple[str | None, ...] | None:
    """The logical axes `variable` was created with, or None."""
    return variable.get_metadata(_AXES_KEY, None)


def _mesh_axes(name: str | None, rules: Rules) -> tuple[str, ...]:
    if name is None:
        return ()
    if name not in rules:
        raise KeyError(f"logical axis {name!r} has no sharding rule; the rules know {list(rules)}")
    axes = rules[name]
    return () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)


def _partition_spec(
    names: tuple[str | None, ...] | None, shape: tuple[int, ...], mesh: Mesh, rules: Rules
) -> PartitionSpec:
    """The layout of an array of `shape` whose dimensions are `names` (None: replicated)."""
    if names is None:
        return PartitionSpec()
    if len(names) != len(shape):
        raise ValueError(f"logical axes {names} do not match an array of shape {shape}")
    used: set[str] = set()
    spec: list[Any] = []
    for name, size in zip(names, shape, strict=True):
        axes = tuple(a for a in _mesh_axes(name, rules) if mesh.shape[a] > 1 and a not in used)
        if not axes or size % math.prod(mesh.shape[a] for a in axes):
            spec.append(None)
            continue
        used.update(axes)
        spec.append(axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*spec)


def param_shardings(tree: Any, mesh: Mesh, rules: Rules = TRAINING_RULES) -> Any:
    """Shardings for every array (or shape struct) of a parameter pytree, or of one that mirrors
    it such as optimizer state, from its variables' logical axes and `rules`; each variable's
    place holds a variable of the same kind with its `NamedSharding` as the value."""

    def sharding(leaf: Any) -> Any:
        if not isinstance(leaf, nnx.Variable):
            return NamedSharding(mesh, PartitionSpec())
        shape = tuple(np.shape(leaf.get_value()))
        return leaf.replace(NamedSharding(mesh, _partition_spec(axes_of(leaf), shape, mesh, rules)))

    return jax.tree.map(sharding, tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def is_abstract(tree: Any) -> bool:
    """Whether `tree` holds shapes only (`jax.ShapeDtypeStruct` leaves, as `jax.eval_shape` and
    `nnx.eval_shape` give): a role built to be compiled, never run (`jrl.compile`)."""
    leaves = jax.tree.leaves(tree)
    return bool(leaves) and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)


def place(tree: Any, shardings: Any) -> Any:
    """`tree` laid out by `shardings` (a matching tree): `jax.device_put` for arrays; shapes
    only (`is_abstract`) become structs that carry their sharding, ready for `.lower()`."""
    if not is_abstract(tree):
        return jax.device_put(tree, shardings)

    def struct(x: jax.ShapeDtypeStruct, sharding: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    return jax.tree.map(struct, tree, shardings)


def shard_params(tree: Any, mesh: Mesh, rules: Rules = TRAINING_RULES) -> tuple[Any, Any]:
    """`tree` placed by `param_shardings` (`place`: arrays or shapes); returns (placed,
    shardings)."""
    shardings = param_shardings(tree, mesh, rules)
    return place(tree, shardings), shardings
