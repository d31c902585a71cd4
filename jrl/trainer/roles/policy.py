"""The policy roles: the trained actor and the frozen reference, plus the rollout that reads the
actor's parameters.

With LoRA (``model.lora_rank`` > 0) the actor trains only its adapters, and the reference is the
actor's frozen base without them (the same arrays, no second copy).

Each role runs on a mesh whose ``sequence`` axis has its ``ulysses_sequence_parallel_size``
devices (sequence parallelism; verl's data-parallel size is then devices // that size, which sets
the micro-batch rows and multiplies the token budgets). ``fsdp_config.param_offload`` /
``optimizer_offload`` keep the actor's states, and the reference's ``param_offload`` its
parameters, in host memory between uses (`jrl.parallel.Offload`).

Log-probs and entropy of response token t come from the logits at position ``-R-1+t`` divided by
the rollout temperature, here and in the sampler alike. ``model.use_fused_kernels`` picks how
(`logprob_impl`): off, the logits are materialised (verl without fused kernels); on, they are
never materialised whole (`jrl_kernels.logprob_entropy`). Entropy is computed only where a metric
(the actor's ``actor/entropy``) or the loss (``entropy_coeff`` != 0) needs it.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jrl import algos
from jrl.batch import Batch
from jrl.models import CausalLM, LoRAParam, apply_lora, from_pretrained
from jrl.models.decoder import set_memory_options
from jrl.models.layers import check_sequence_heads
from jrl.models.lora import remove_adapters
from jrl.parallel import (
    ON_DEVICE,
    Offload,
    batch_sharding,
    data_parallel_size,
    on_mesh,
    param_shardings,
    role_mesh,
    sequence_parallel_size,
    shard_params,
)
from jrl.rollout import EngineLimits, make_rollout
from jrl.trainer.roles.log_probs import logprob_impl, response_log_probs
from jrl.trainer.update.batching import forward_pass
from jrl.trainer.update.dynamic_batching import TokenBudget
from jrl.trainer.update.learner import TrainState
from jrl.trainer.update.optim import lr_multiplier, make_optimizer
from jrl.trainer.update.packing import packing_plan

DTYPES = {
    "float32": jnp.float32,
    "fp32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "bf16": jnp.bfloat16,
}
FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")


def compute_dtype(name: str) -> Any:
    """A jnp dtype from a config string such as 'bfloat16' or 'fp32'."""
    try:
        return DTYPES[str(name)]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None


def shuffle_seed(section: Any, step: int) -> tuple[int, int] | None:
    """Seed of the per-epoch mini-batch shuffle when ``shuffle`` is on: (data_loader_seed, step)."""
    if not section.get("shuffle"):
        return None
    seed = section.get("data_loader_seed")
    return (0 if seed is None else int(seed), int(step))


def micro_rows_per_device(section: Any, per_gpu_key: str, global_key: str, world: int) -> int:
    """verl's micro-batch size per device: `*_per_gpu`, else the deprecated global key // world."""
    per_gpu = section.get(per_gpu_key)
    if per_gpu:
        return int(per_gpu)
    return max(1, int(section[global_key]) // world)


def token_budget(
    section: Any,
    prefix: str,
    flag_key: str,
    limit_key: str,
    packed: bool,
    sequence_parallel: int = 1,
) -> TokenBudget | None:
    """The token budget of one batch shard when the role section at `prefix` has its `flag_key`
    (``use_dynamic_bsz`` or ``log_prob_use_dynamic_bsz``) on, else None: the per-device
    `limit_key` times the `sequence_parallel` devices that share the shard's sequences (verl)."""
    if not section.get(flag_key):
        return None
    return TokenBudget(int(section[limit_key]) * sequence_parallel, f"{prefix}.{limit_key}", packed)


def forward_split(
    section: Any,
    prefix: str,
    world: int,
    packed: bool,
    *,
    flag_key: str,
    limit_key: str,
    micro_key: str,
    sequence_parallel: int = 1,
) -> tuple[int | None, TokenBudget | None]:
    """How a forward-only pass splits its rows: ``(None, budget)`` with dynamic batch sizes,
    else ``(rows per chunk, None)`` from `micro_key` (``*_per_gpu``, or the deprecated global
    key); `world` is the data-parallel size."""
    budget = token_budget(section, prefix, flag_key, limit_key, packed, sequence_parallel)
    if budget is not None:
        return None, budget
    return world * micro_rows_per_device(section, f"{micro_key}_per_gpu", micro_key, world), None


def update_split(section: Any, prefix: str, world: int, mesh: Mesh, packed: bool) -> dict[str, Any]:
    """`TrainState.train` keyword arguments for the micro-batches of a trained role: a token
    budget (``ppo_max_token_len_per_gpu``) with ``use_dynamic_bsz``, else rows per micro-batch
    (``ppo_micro_batch_size_per_gpu`` per data-parallel rank; `world` of them) and their
    packing plan."""
    budget = token_budget(
        section,
        prefix,
        "use_dynamic_bsz",
        "ppo_max_token_len_per_gpu",
        packed,
        sequence_parallel_size(mesh),
    )
    if budget is not None:
        return {"token_budget": budget}
    rows = world * micro_rows_per_device(
        section, "ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size", world
    )
    return {"micro_rows": rows, "packing": packing_plan(rows, mesh, packed)}


def actor_loss(
    model,
    micro,
    norm,
    *,
    cfg,
    temperature: float,
    on_policy: bool,
    impl: str = "naive",
    packing=None,
):
    """Actor objective of one micro-batch, already divided by the mini-batch normaliser; log-probs
    by the kernel implementation `impl` (entropy only with ``entropy_coeff`` != 0)."""
    log_prob, entropy = response_log_probs(
        model, micro, temperature, packing, impl=impl, calculate_entropy=cfg.entropy_coeff != 0
    )
    mask = micro["response_mask"]
    mode = cfg.loss_agg_mode
    old = jax.lax.stop_gradient(log_prob) if on_policy else micro["old_log_probs"]
    terms_fn = algos.get_policy_loss_terms_fn(cfg.policy_loss.get("loss_mode", "vanilla"))
    terms = terms_fn(
        old,
        log_prob,
        micro["advantages"],
        mask,
        cfg,
        rollout_is_weights=micro.get("rollout_is_weights"),
    )
    mode = terms.loss_agg_mode or mode
    pg_loss = (
        algos.agg_loss_terms(terms.loss_mat, mask, mode, cfg.loss_scale_factor)[0] / norm[mode]
    )
    loss = pg_loss
    metrics = {"actor/pg_loss": pg_loss}
    for name, mat in terms.metrics.items():
        metrics[name] = jnp.sum(mat * mask) / norm["tokens"]
    if cfg.entropy_coeff != 0:
        ent = algos.agg_loss_terms(entropy, mask, cfg.loss_agg_mode, cfg.loss_scale_factor)[0]
        loss = loss - cfg.entropy_coeff * ent / norm[cfg.loss_agg_mode]
    if cfg.use_kl_loss:
        kld = algos.kl_penalty(log_prob, micro["ref_log_prob"], cfg.kl_loss_type)
        kl_loss = algos.agg_loss_terms(kld, mask, cfg.loss_agg_mode, cfg.loss_scale_factor)[0]
        kl_loss = kl_loss / norm[cfg.loss_agg_mode]
        loss = loss + cfg.kl_loss_coef * kl_loss
        metrics["actor/kl_loss"] = kl_loss
    return loss, metrics


class Policy:
    """A causal LM on the mesh that computes response log-probs; the actor also trains."""

    def __init__(
        self,
        graphdef: Any,
        params: Any,
        param_shardings: Any,
        mesh: Mesh,
        *,
        temperature: float,
        forward_rows: int | None,
        state: TrainState | None = None,
        remove_padding: bool = False,
        forward_budget: TokenBudget | None = None,
        offload: Offload = ON_DEVICE,
        logprob_impl: str = "naive",
    ):
        self.graphdef = graphdef
        self._frozen_params = None if state is not None else offload.store(params, param_shardings)
        self.param_shardings = param_shardings
        self.mesh = mesh
        self.temperature = float(temperature)
        self.forward_rows = forward_rows
        self.state = state
        self.remove_padding = remove_padding
        self.forward_budget = forward_budget
        self.logprob_impl = logprob_impl
        rows = batch_sharding(mesh, 1)  # rows split, for tensors of any rank
        forward = jax.jit(
            self._forward_fn,
            static_argnums=(2, 3),
            in_shardings=(param_shardings, rows),
            out_shardings=rows,
        )
        self._forward = on_mesh(forward, mesh)

    @property
    def params(self) -> Any:
        """The current parameters in device memory (the actor's latest, or the frozen
        reference's, moved from host memory for the call when offloaded)."""
        if self.state is not None:
            return self.state.params
        return jax.device_put(self._frozen_params, self.param_shardings)

    @classmethod
    def actor(cls, config: Any, mesh: Mesh, total_training_steps: int) -> Policy:
        """The trained policy with AdamW and verl's mini/micro-batch update."""
        arr = config.actor_rollout_ref
        fsdp = arr.actor.fsdp_config
        mesh = sequence_mesh_of(arr.actor, "actor_rollout_ref.actor", mesh, fsdp)
        model = load_model(arr.model, fsdp, mesh)
        check_heads(model, mesh, "actor_rollout_ref.actor")
        lora = lora_settings(arr.model)
        if lora is not None:
            seed = config.data.get("seed")
            try:
                apply_lora(model, seed=int(seed if seed is not None else 0), **lora)
            except ValueError as err:
                raise ValueError(f"actor_rollout_ref.model: {err}") from err
        remove_padding = bool(arr.model.use_remove_padding)
        rows, budget = _log_prob_split(config, "rollout", remove_padding, mesh)
        trainable = nnx.Param if lora is None else LoRAParam
        state = TrainState.create(
            model,
            make_optimizer(arr.actor.optim),
            mesh,
            trainable,
            **offloads(fsdp, "actor_rollout_ref.actor.fsdp_config", mesh),
        )
        policy = cls(
            state.graphdef,
            None,
            state.param_shardings,
            mesh,
            temperature=arr.rollout.temperature,
            forward_rows=rows,
            state=state,
            remove_padding=remove_padding,
            forward_budget=budget,
            logprob_impl=logprob_impl(arr, "actor"),
        )
        policy.config = config
        policy.total_training_steps = total_training_steps
        return policy

    @classmethod
    def reference(cls, config: Any, mesh: Mesh, actor: Policy | None = None) -> Policy:
        """The frozen reference policy (the initial actor weights).

        With LoRA it is `actor`'s base model with the adapters off: its parameters are the very
        arrays the actor keeps frozen (so the actor's ``param_offload`` governs them, and the
        actor's mesh is used). Without LoRA the weights are loaded again, onto a mesh with the
        reference's sequence-parallel size, and ``ref.fsdp_config.param_offload`` keeps them in
        host memory between log-prob passes.
        """
        arr = config.actor_rollout_ref
        remove_padding = bool(arr.model.use_remove_padding)
        fsdp = arr.ref.get("fsdp_config") or arr.actor.fsdp_config
        offload = ON_DEVICE
        if lora_settings(arr.model) is None:
            mesh = sequence_mesh_of(arr.ref, "actor_rollout_ref.ref", mesh, fsdp)
            model = load_model(arr.model, fsdp, mesh)
            check_heads(model, mesh, "actor_rollout_ref.ref")
            graphdef, params = nnx.split(model)
            params, shardings = shard_params(params, mesh)
            key = "actor_rollout_ref.ref.fsdp_config.param_offload"
            enabled = bool(fsdp.get("param_offload", False))
            offload = Offload.configure(enabled, key, mesh.local_devices)
        elif actor is None:
            raise ValueError(
                "with actor_rollout_ref.model.lora_rank > 0 the reference is the actor's base "
                "model: pass the actor to Policy.reference"
            )
        else:
            mesh = actor.mesh
            if arr.ref.ulysses_sequence_parallel_size != sequence_parallel_size(mesh):
                raise ValueError(
                    "with actor_rollout_ref.model.lora_rank > 0 the reference shares the actor's "
                    "weights and mesh: set actor_rollout_ref.ref.ulysses_sequence_parallel_size "
                    f"to the actor's ({sequence_parallel_size(mesh)})"
                )
            graphdef, params = nnx.split(remove_adapters(nnx.merge(actor.graphdef, actor.params)))
            shardings = param_shardings(params, mesh)
        rows, budget = _log_prob_split(config, "ref", remove_padding, mesh)
        return cls(
            graphdef,
            params,
            shardings,
            mesh,
            temperature=arr.rollout.temperature,
            forward_rows=rows,
            remove_padding=remove_padding,
            forward_budget=budget,
            offload=offload,
            logprob_impl=logprob_impl(arr, "ref"),
        )

    def _forward_fn(self, params, tensors, packing, calculate_entropy):
        model = nnx.merge(self.graphdef, params)
        return response_log_probs(
            model,
            tensors,
            self.temperature,
            packing,
            impl=self.logprob_impl,
            calculate_entropy=calculate_entropy,
        )

    def compute_log_prob(
        self, batch: Batch, calculate_entropy: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Log-probs [B, R] of the batch's responses (and entropy, only computed when asked)."""
        tensors = {k: np.asarray(batch.tensors[k]) for k in FORWARD_KEYS}
        forward = functools.partial(self._forward, self.params)
        log_prob, entropy = forward_pass(
            lambda micro, layout: forward(micro, layout, calculate_entropy),
            tensors,
            self.mesh,
            rows=self.forward_rows,
            remove_padding=self.remove_padding,
            budget=self.forward_budget,
        )
        return log_prob, entropy

    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """verl's update_policy: ppo_epochs x mini-batches, accumulating over micro-batches."""
        config = self.config
        actor = config.actor_rollout_ref.actor
        n = config.actor_rollout_ref.rollout.n
        mini_rows = actor.ppo_mini_batch_size * n
        keys = [*FORWARD_KEYS, "response_mask", "old_log_probs", "advantages"]
        if actor.use_kl_loss:
            keys.append("ref_log_prob")
        if "rollout_is_weights" in batch:
            keys.append("rollout_is_weights")
        tensors = {k: np.asarray(batch.tensors[k]) for k in keys}
        on_policy = len(batch) == mini_rows and actor.ppo_epochs == 1
        lr = actor.optim.lr * lr_multiplier(actor.optim, step - 1, self.total_training_steps)
        loss_fn = functools.partial(
            actor_loss,
            cfg=actor,
            temperature=self.temperature,
            on_policy=on_policy,
            impl=self.logprob_impl,
        )
        history = self.state.train(
            loss_fn,
            tensors,
            variant=on_policy,
            grad_clip=actor.grad_clip,
            mini_rows=mini_rows,
            epochs=actor.ppo_epochs,
            lr=lr,
            loss_scale_factor=actor.loss_scale_factor,
            shuffle_seed=shuffle_seed(actor, step),
            **update_split(
                actor,
                "actor_rollout_ref.actor",
                data_parallel_size(self.mesh),
                self.mesh,
                self.remove_padding,
            ),
        )
        out = {k: float(np.mean(v)) for k, v in history.items() if k.startswith("actor/")}
        out["actor/pg_loss"] = float(np.sum(history["actor/pg_loss"]))
        if "actor/kl_loss" in history:
            out["actor/kl_loss"] = float(np.sum(history["actor/kl_loss"]))
            out["actor/kl_coef"] = float(actor.kl_loss_coef)
        out["actor/grad_norm"] = float(np.mean(history["grad_norm"]))
        out["actor/lr"] = float(lr)
        out["actor/skipped_steps"] = float(np.sum(history["skipped"]))
        return out


def _log_prob_split(
    config: Any, role: str, packed: bool, mesh: Mesh
) -> tuple[int | None, TokenBudget | None]:
    """`forward_split` of the log-prob pass of ``actor_rollout_ref.{role}`` (rollout or ref) on
    the role's `mesh`."""
    return forward_split(
        config.actor_rollout_ref[role],
        f"actor_rollout_ref.{role}",
        data_parallel_size(mesh),
        packed,
        flag_key="log_prob_use_dynamic_bsz",
        limit_key="log_prob_max_token_len_per_gpu",
        micro_key="log_prob_micro_batch_size",
        sequence_parallel=sequence_parallel_size(mesh),
    )


def sequence_mesh_of(section: Any, prefix: str, mesh: Mesh, fsdp_cfg: Any) -> Mesh:
    """The mesh of the role section at `prefix`: `mesh`'s devices with the section's
    ``ulysses_sequence_parallel_size`` on the `sequence` axis."""
    size = int(section.get("ulysses_sequence_parallel_size") or 1)
    key = f"{prefix}.ulysses_sequence_parallel_size"
    return role_mesh(mesh, size, fsdp_cfg.get("fsdp_size", -1), key)


def offloads(fsdp_cfg: Any, prefix: str, mesh: Mesh) -> dict[str, Offload]:
    """`TrainState.create`'s ``param_offload`` and ``optimizer_offload`` from the
    ``fsdp_config`` section at `prefix`."""
    return {
        name: Offload.configure(
            bool(fsdp_cfg.get(name, False)), f"{prefix}.{name}", mesh.local_devices
        )
        for name in ("param_offload", "optimizer_offload")
    }


def check_heads(model: Any, mesh: Mesh, prefix: str) -> None:
    """Fails early unless sequence parallelism on `mesh` can split `model`'s attention heads."""
    c = model.config
    key = f"{prefix}.ulysses_sequence_parallel_size"
    check_sequence_heads(c.num_heads, c.num_kv_heads, sequence_parallel_size(mesh), key)


def load_model(model_cfg: Any, fsdp_cfg: Any, mesh: Mesh, kind: str = "causal_lm") -> Any:
    """The model of a ``*.model`` config section, streamed straight onto the mesh (FSDP layout),
    computing in ``fsdp_config.dtype`` over ``fsdp_config.model_dtype`` parameters, with the
    section's gradient checkpointing and activation offload."""
    model = from_pretrained(
        model_cfg.path,
        kind=kind,
        dtype=compute_dtype(fsdp_cfg.get("dtype", "bfloat16")),
        param_dtype=compute_dtype(fsdp_cfg.get("model_dtype", "fp32")),
        mesh=mesh,
        trust_remote_code=bool(model_cfg.get("trust_remote_code", False)),
        external_lib=model_cfg.get("external_lib"),
        override_config=_plain(model_cfg.get("override_config")),
    )
    set_memory_options(model, **memory_options(model_cfg))
    return model


def memory_options(model_cfg: Any) -> dict[str, Any]:
    """`set_memory_options` arguments of a ``*.model`` section: full remat of every decoder layer
    when ``enable_gradient_checkpointing``, host offload of what it keeps when
    ``enable_activation_offload``."""
    remat = bool(model_cfg.get("enable_gradient_checkpointing", False))
    offload = bool(model_cfg.get("enable_activation_offload", False))
    if offload and not remat:
        raise ValueError(
            "model.enable_activation_offload=True needs model.enable_gradient_checkpointing=True "
            "in the same section (actor_rollout_ref.model or critic.model): only the layers' "
            "rematerialised inputs are offloaded"
        )
    return {"remat_policy": "full" if remat else "none", "activation_offload": offload}


def lora_settings(model_cfg: Any) -> dict[str, Any] | None:
    """`apply_lora` keyword arguments (rank, alpha, target_modules, exclude_modules) from a
    ``*.model`` config section; None when ``lora_rank`` is 0."""
    rank = int(model_cfg.get("lora_rank") or 0)
    if rank <= 0:
        return None
    targets = model_cfg.get("target_modules") or "all-linear"
    return dict(
        rank=rank,
        alpha=float(model_cfg.get("lora_alpha") or 0),
        target_modules=targets if isinstance(targets, str) else list(targets),
        exclude_modules=model_cfg.get("exclude_modules"),
    )


def _plain(section: Any) -> dict[str, Any]:
    """A config section (or None) as a plain dict."""
    if section is None:
        return {}
    return section.to_dict() if hasattr(section, "to_dict") else dict(section)


def build_rollout(config: Any, actor: Policy, tokenizer: Any):
    """The rollout engine named by ``rollout.name``, reading the actor's parameters (LoRA
    adapters included, applied unmerged)."""
    rollout_cfg = config.actor_rollout_ref.rollout
    actor_model = nnx.merge(actor.graphdef, actor.params)
    dtype = compute_dtype(rollout_cfg.dtype)
    lora = lora_settings(config.actor_rollout_ref.model)

    def abstract_model() -> CausalLM:
        model = CausalLM(actor_model.config, dtype=dtype, param_dtype=jnp.float32, rngs=nnx.Rngs(0))
        return model if lora is None else apply_lora(model, **lora)

    rollout_model = nnx.eval_shape(abstract_model)
    graphdef, _ = nnx.split(rollout_model)
    model = nnx.merge(graphdef, actor.params)
    eos = {tokenizer.eos_token_id} | set(_as_list(actor_model.config.eos_token_id))
    return make_rollout(
        rollout_cfg.name,
        model,
        response_length=config.data.max_response_length,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=sorted(i for i in eos if i is not None),
        mesh=actor.mesh,
        tensor_parallel_size=int(rollout_cfg.tensor_model_parallel_size),
        limits=EngineLimits.from_rollout_config(rollout_cfg),
        rollout_cfg=rollout_cfg,
        model_path=config.actor_rollout_ref.model.path,
        trust_remote_code=bool(config.actor_rollout_ref.model.get("trust_remote_code", False)),
    )


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]
