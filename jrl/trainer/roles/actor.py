"""The actor: the trained policy, its loss and verl's mini/micro-batch update.

With LoRA (``model.lora_rank`` > 0) the actor trains only its adapters. It runs on a mesh whose
``sequence`` axis has ``actor.ulysses_sequence_parallel_size`` devices, and
``actor.fsdp_config.param_offload`` / ``optimizer_offload`` keep its states in host memory between
uses (`jrl.parallel.Offload`). ``model.use_fused_kernels`` picks the log-prob kernel
(`jrl.runspec.roles.log_prob_impl`); entropy is computed only for the ``actor/entropy`` metric
and, with ``entropy_coeff`` != 0, the loss.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jrl import algos
from jrl.algos.rollout_correction import METRIC_PREFIX
from jrl.algos.settings import KLLoss, PolicyLossSettings
from jrl.batch import Batch
from jrl.models.moe import ROUTED_EXPERTS, load_balancing_loss
from jrl.runspec.algorithm import AlgorithmSpec
from jrl.runspec.models import ModelSettings
from jrl.runspec.roles import ActorSettings
from jrl.trainer.roles import log_probs
from jrl.trainer.roles.log_probs import FORWARD_KEYS, LogProbForward, ResponseScores
from jrl.trainer.roles.specs import ForwardSpec, TrainSpec, load_learner, role_mesh_of
from jrl.trainer.update.learner import Learner


@dataclasses.dataclass(frozen=True)
class ActorLoss:
    """The actor objective of one micro-batch, already divided by the mini-batch normaliser:
    the policy loss of ``policy_loss.loss_mode`` (aggregated by its own mode or
    `loss_agg_mode`), minus ``entropy_coeff`` x entropy, plus ``kl_loss_coef`` x the KL loss to
    the reference (`kl_loss`, None without it); a mixture of experts logs its load-balancing
    loss (``actor/router_aux_loss``: each micro-batch's weighted by its share of the response
    tokens) and adds ``router_aux_loss_coef`` x it where config.json's
    ``output_router_logits`` says so, as transformers does. Log-probs at `temperature` by the
    kernel `impl`; `on_policy` (one epoch over one mini-batch) takes the old log-probs as the
    current ones without gradient.

    Frozen and hashable: it is the key of the learner's compiled update, so every option here
    that changes selects its own program."""

    temperature: float
    impl: str
    loss_agg_mode: str
    policy_loss: PolicyLossSettings
    entropy_coeff: float
    kl_loss: KLLoss | None
    on_policy: bool = False

    @classmethod
    def resolve(cls, algorithm: AlgorithmSpec, temperature: float, impl: str) -> ActorLoss:
        """The actor's objective of the run's `algorithm` (in bypass mode the policy loss is
        `jrl.algos.bypass_loss`'s)."""
        return cls(
            temperature=float(temperature),
            impl=impl,
            loss_agg_mode=algorithm.loss_agg_mode,
            policy_loss=algorithm.policy_loss,
            entropy_coeff=algorithm.entropy_coeff,
            kl_loss=algorithm.kl_loss,
        )

    def __call__(self, model, micro, norm, packing=None):
        log_prob, entropy = log_probs.response_log_probs(
            model,
            micro,
            self.temperature,
            packing,
            impl=self.impl,
            calculate_entropy=self.entropy_coeff != 0,
        )
        mask = micro["response_mask"]
        old = jax.lax.stop_gradient(log_prob) if self.on_policy else micro["old_log_probs"]
        terms = algos.policy_loss_terms(
            self.policy_loss,
            old,
            log_prob,
            micro["advantages"],
            mask,
            rollout_is_weights=micro.get("rollout_is_weights"),
        )
        mode = terms.loss_agg_mode or self.loss_agg_mode
        agg = algos.agg_loss_terms
        factor = self.policy_loss.loss_scale_factor
        pg_mask = mask if terms.loss_mask is None else terms.loss_mask
        pg_loss = agg(terms.loss_mat, pg_mask, mode, factor)[0] / norm[mode]
        loss = pg_loss
        metrics = {"actor/pg_loss": pg_loss}
        for name, mat in terms.metrics.items():
            metrics[name] = jnp.sum(mat * mask) / norm["tokens"]
        own = self.loss_agg_mode
        if self.entropy_coeff != 0:
            ent = agg(entropy, mask, own, factor)[0]
            loss = loss - self.entropy_coeff * ent / norm[own]
        if self.kl_loss is not None:
            kld = algos.kl_penalty(log_prob, micro["ref_log_prob"], self.kl_loss.kl_loss_type)
            kl_loss = agg(kld, mask, own, factor)[0] / norm[own]
            loss = loss + self.kl_loss.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss
        aux = load_balancing_loss(model)
        if aux is not None:  # a mixture of experts: its micro-batches' loads, token-weighted
            aux = aux * jnp.sum(mask) / norm["tokens"]
            metrics["actor/router_aux_loss"] = aux
            experts = model.config.experts
            if experts.output_router_logits:
                loss = loss + experts.router_aux_loss_coef * aux
        return loss, metrics


@dataclasses.dataclass(frozen=True)
class ActorSpec:
    """The actor's settings on its mesh: its model, how its log-prob pass and its update split a
    batch, its loss and learning-rate schedule, and its router replay mode
    (`jrl.runspec.router_replay`)."""

    model: ModelSettings
    forward: ForwardSpec
    train: TrainSpec
    loss: ActorLoss
    router_replay: str = "disabled"

    @classmethod
    def of(
        cls,
        settings: ActorSettings,
        algorithm: AlgorithmSpec,
        mesh: Mesh,
        total_training_steps: int,
    ) -> ActorSpec:
        """The spec of the actor's `settings` on its `mesh`, minimising the objective of the
        run's `algorithm`."""
        return cls(
            model=settings.model,
            forward=ForwardSpec.of(settings.log_probs, mesh),
            train=TrainSpec.of(settings.update, mesh, total_training_steps),
            loss=ActorLoss.resolve(algorithm, settings.temperature, settings.log_prob_impl),
            router_replay=settings.router_replay,
        )


class Actor:
    """The trained policy on its mesh: log-probs of a batch's responses and verl's update."""

    def __init__(self, spec: ActorSpec, mesh: Mesh, learner: Learner):
        self.spec = spec
        self.mesh = mesh
        self.learner = learner
        self.log_probs = LogProbForward(
            learner.graphdef, learner.param_shardings, mesh, spec.forward, spec.loss
        )

    @classmethod
    def create(
        cls,
        settings: ActorSettings,
        algorithm: AlgorithmSpec,
        mesh: Mesh,
        total_training_steps: int,
        *,
        abstract: bool = False,
    ) -> Actor:
        """The actor of `settings` on `mesh`'s devices, minimising the objective of the run's
        `algorithm` with its optimizer (shapes only with `abstract`, to compile its programs:
        `jrl.plan`)."""
        mesh = role_mesh_of(settings.mesh, mesh)
        spec = ActorSpec.of(settings, algorithm, mesh, total_training_steps)
        learner = load_learner(
            spec.model,
            spec.train.optimizer,
            mesh,
            settings.offload,
            settings.mesh.key,
            spec.model.trainable,
            abstract,
        )
        return cls(spec, mesh, learner)

    @property
    def params(self) -> Any:
        """The current parameters, in device memory."""
        return self.learner.params

    def compute_log_prob(
        self, batch: Batch, calculate_entropy: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Log-probs [B, R] of the batch's responses (and entropy, only computed when asked)."""
        return self.log_probs(self.params, batch, calculate_entropy)

    def old_log_probs(self, batch: Batch) -> ResponseScores:
        """The old-log-prob pass: log-probs and entropy [B, R], and where the batch carries the
        rollout's routes or the mode is R2 the experts each token used (R3 replays the
        rollout's routes; R2 records the ones the update replays)."""
        mode, recorded = self.spec.router_replay, ROUTED_EXPERTS in batch.tensors
        return self.log_probs.scores(
            self.params,
            batch,
            calculate_entropy=True,
            replay=mode == "R3" and recorded,
            record_routes=mode == "R2" or recorded,
        )

    def update_tensors(self, tensors: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The batch tensors the update reads (the reference's log-probs with the KL loss,
        importance weights when the batch has them, the routes it replays under R2 / R3)."""
        keys = [*FORWARD_KEYS, "response_mask", "old_log_probs", "advantages"]
        if self.spec.loss.kl_loss is not None:
            keys.append("ref_log_prob")
        if "rollout_is_weights" in tensors:
            keys.append("rollout_is_weights")
        if self.spec.router_replay != "disabled" and ROUTED_EXPERTS in tensors:
            keys.append(ROUTED_EXPERTS)
        return {k: np.asarray(tensors[k]) for k in keys}

    def update_loss(self, rows: int) -> ActorLoss:
        """The loss of an update over `rows` rows: on-policy (the old log-probs are the current
        ones) when that is one mini-batch for one epoch."""
        plan = self.spec.train.plan
        on_policy = rows == plan.mini_rows and plan.epochs == 1
        return dataclasses.replace(self.spec.loss, on_policy=on_policy)

    def update(self, batch: Batch, step: int, lr_step: int) -> dict[str, float]:
        """verl's update_policy: ppo_epochs x mini-batches, accumulating over micro-batches, at
        the learning rate of schedule index `lr_step` (the actor's updates before this one)."""
        spec = self.spec
        tensors = self.update_tensors(batch.tensors)
        lr = spec.train.schedule(lr_step)
        history = self.learner.train(
            self.update_loss(len(batch)),
            tensors,
            spec.train.plan,
            lr=lr,
            shuffle_seed=spec.train.shuffle_seed(step),
        )
        reported = ("actor/", METRIC_PREFIX)  # the bypass loss's rollout-correction metrics too
        out = {k: float(np.mean(v)) for k, v in history.items() if k.startswith(reported)}
        out["actor/pg_loss"] = float(np.sum(history["actor/pg_loss"]))
        if "actor/kl_loss" in history:
            out["actor/kl_loss"] = float(np.sum(history["actor/kl_loss"]))
            out["actor/kl_coef"] = float(spec.loss.kl_loss.kl_loss_coef)
        out["actor/grad_norm"] = float(np.mean(history["grad_norm"]))
        out["actor/lr"] = float(lr)
        out["actor/skipped_steps"] = float(np.sum(history["skipped"]))
        return out
