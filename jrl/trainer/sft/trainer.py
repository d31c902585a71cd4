"""The SFT loop (verl's SFT trainer): one optimizer step per batch of ``data.train_batch_size``
rows, gradients accumulated over micro-batches of ``data.micro_batch_size_per_gpu`` rows per
device.

Steps are 1-based. The learning rate follows ``optim.lr_scheduler`` (one scheduler step per
training step), gradients are clipped to ``optim.clip_grad`` and a step with a non-finite gradient
norm is skipped. Validation (``val/loss``, the token-mean cross-entropy of the validation files)
runs every ``trainer.test_freq`` steps and a checkpoint is written every ``trainer.save_freq``
steps; both also happen after the last step. Metrics: ``train/loss``, ``train/lr(1e-3)`` (the
learning rate times 1000), ``train/grad_norm``, ``train/time(s)``, ``val/loss``.

The loss is normalised by the trained tokens of the whole batch on every device (verl's
``data.balance_dp_token=True``), whatever the key's value, so splitting into micro-batches or
devices never changes the gradient. Checkpoints hold the trained model as the ``actor`` role of
`jrl.trainer.io.checkpoint` (``python -m jrl.merge`` reads them like an RL actor).
"""

from __future__ import annotations

import dataclasses
import functools
import time
import warnings
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from flax import nnx

from jrl.batch import Batch
from jrl.config.loading import yaml_of
from jrl.data.loader import DataLoader
from jrl.data.sft_dataset import create_sft_dataset
from jrl.data.tokenizer import tokenizer_of
from jrl.models import LoRAParam
from jrl.optim.optimizers import make_sft_optimizer
from jrl.optim.schedule import Schedule
from jrl.optim.settings import SFTOptimizerSettings
from jrl.parallel import batch_sharding, gather_batch, make_mesh, on_mesh
from jrl.parallel.devices import check_device
from jrl.runspec.models import ModelSettings
from jrl.runspec.sft import SFTModelSpec
from jrl.runspec.spec import SFTRunSpec, resolve_sft_run
from jrl.trainer.io.checkpoint import CheckpointManager, RoleSnapshot
from jrl.trainer.loop.fit import Cadence, StepOutput, epochs_of, fit
from jrl.trainer.loop.resume import resume
from jrl.trainer.roles.specs import ForwardSpec, check_heads, load_model
from jrl.trainer.sft.loss import SFTLoss, row_nll, sft_tensors
from jrl.trainer.update.batching import forward_pass
from jrl.trainer.update.learner import Learner, UpdatePlan
from jrl.trainer.update.packing import packing_plan

ROLE = "actor"


def warn_offload(asked: tuple[str, ...]) -> None:
    """``cpu_offload`` / ``offload_params`` (the `asked` keys of ``model.fsdp_config``) are
    accepted; parameters and optimizer state stay in device memory (FSDP-sharded), which a
    warning says."""
    if asked:
        warnings.warn(
            f"model.fsdp_config.{' and .'.join(asked)}: parameters and optimizer state stay in "
            f"device memory ({jax.default_backend()}), sharded over the devices; enable "
            "model.enable_gradient_checkpointing to save activation memory instead",
            stacklevel=2,
        )


@dataclasses.dataclass(frozen=True)
class SFTSpec:
    """SFT's settings on the mesh: the model, the update (one optimizer step per batch,
    micro-batches of rows per device, packed with ``use_remove_padding``), the loss, the
    optimizer and its learning-rate schedule."""

    model: ModelSettings
    plan: UpdatePlan
    loss: SFTLoss
    optimizer: SFTOptimizerSettings
    schedule: Schedule

    @classmethod
    def of(cls, model: SFTModelSpec, mesh: Any, total_steps: int) -> SFTSpec:
        """The spec of SFT's `model` on `mesh`, over `total_steps` training steps."""
        split = ForwardSpec.of(model.split, mesh)
        optimizer = model.optimizer
        plan = UpdatePlan(
            grad_clip=optimizer.clip_grad,
            micro_rows=split.rows,
            packing=packing_plan(split.rows, mesh, split.remove_padding),
        )
        return cls(
            model=model.model,
            plan=plan,
            loss=SFTLoss("auto" if model.fused_loss else "naive"),
            optimizer=optimizer,
            schedule=Schedule.from_settings(optimizer, total_steps),
        )


class SFTTrainer:
    """Builds the model, data and optimizer from an `SFTRunSpec` (`from_config`: from a checked
    SFT config); supplies the fit loop with one optimizer step per batch."""

    name = "SFT"

    @classmethod
    def from_config(cls, config: Any) -> SFTTrainer:
        """The trainer of a checked SFT config."""
        return cls(cls.resolve(config))

    @staticmethod
    def resolve(config: Any) -> SFTRunSpec:
        """The SFTRunSpec of a checked SFT config, its model saved as this trainer's role."""
        return resolve_sft_run(config, ROLE)

    def __init__(self, run: SFTRunSpec):
        self.created_at = time.perf_counter()
        check_device(run.mesh.device)
        self.run = run
        warn_offload(run.model.host_offload)
        self.mesh = make_mesh(run.mesh.devices, sequence_parallel=run.mesh.sequence_parallel)
        data, files = run.data, run.data.files
        self.tokenizer = tokenizer_of(data.tokenizer)
        self.train_dataset = create_sft_dataset(
            files.train_files, self.tokenizer, data.rows, files.train_max_samples
        )
        self.val_dataset = create_sft_dataset(
            files.val_files,
            self.tokenizer,
            data.rows,
            files.val_max_samples,
            config_key="data.val_files",
        )
        self.train_loader = DataLoader(
            self.train_dataset,
            files.train_batch_size,
            shuffle=True,
            seed=data.seed,
            sampler="distributed",
        )
        self.cadence = Cadence.of(run.cadence, len(self.train_loader), after_last=True)
        # verl's SFT schedule spans the epochs, whatever total_training_steps stops at
        self.spec = SFTSpec.of(
            run.model, self.mesh, len(self.train_loader) * run.cadence.total_epochs
        )
        model = load_model(self.spec.model, self.mesh)
        check_heads(model, self.mesh, "")
        trainable = nnx.Param if self.spec.model.lora is None else LoRAParam
        optimizer = make_sft_optimizer(self.spec.optimizer)
        self.learner = Learner.create(model, optimizer, self.mesh, trainable)
        self.vocab_size = int(model.config.vocab_size)
        self.val_generations: list[dict[str, Any]] = []
        rows = batch_sharding(self.mesh, 1)
        # Traced under the mesh (`on_mesh`), as the update is: sequences split over it.
        self._val_forward = on_mesh(
            jax.jit(
                self._val_fn,
                static_argnums=2,
                in_shardings=(self.learner.param_shardings, rows),
                out_shardings=rows,
            ),
            self.mesh,
        )
        self.checkpoints = CheckpointManager(
            run.checkpoint.local_dir,
            max_to_keep=run.checkpoint.retention,
            remote_dir=run.checkpoint.remote_dir,
            tokenizer=self.tokenizer,
        )

    def _val_fn(self, params: Any, tensors: dict[str, jax.Array], packing: Any) -> jax.Array:
        model = nnx.merge(self.learner.graphdef, params)
        return row_nll(model, tensors, self.spec.loss.impl, packing)

    # -- steps ----------------------------------------------------------------------------------
    def train_step(
        self, batch: Batch, step: int, epoch: int, timing: dict[str, float]
    ) -> StepOutput:
        """One optimizer step on a batch of rows. ``train/lr(1e-3)`` is the rate after the step,
        as verl logs it (its scheduler steps first)."""
        start = time.perf_counter()
        lr = self.spec.schedule(step - 1)
        tensors = sft_tensors(gather_batch(batch))
        history = self.learner.train(self.spec.loss, tensors, self.spec.plan, lr=lr)
        metrics = {
            "train/loss": history["loss"][0],
            "train/lr(1e-3)": self.spec.schedule(step) * 1e3,
            "train/grad_norm": history["grad_norm"][0],
            "train/skipped": history["skipped"][0],
            "train/time(s)": time.perf_counter() - start,
        }
        return StepOutput(metrics)

    def step_metrics(
        self, output: StepOutput, step: int, epoch: int, timing: dict[str, float]
    ) -> dict[str, float]:
        """None beyond the step's own (verl's SFT trainer logs no timing breakdown)."""
        return {}

    def validate(self, step: int) -> dict[str, float]:
        """``val/loss``: the cross-entropy of every trained token of the validation files."""
        loader = DataLoader(
            self.val_dataset, len(self.val_dataset), shuffle=False, seed=0, drop_last=False
        )
        tensors = sft_tensors(gather_batch(next(iter(loader.epoch(0)))))
        nll = forward_pass(
            functools.partial(self._val_forward, self.learner.params),
            tensors,
            self.mesh,
            rows=self.spec.plan.micro_rows,
            remove_padding=self.spec.plan.packing is not None,
        )
        tokens = float(tensors["response_mask"].sum())
        return {"val/loss": float(np.sum(nll)) / max(tokens, 1.0)}

    # -- checkpoints ----------------------------------------------------------------------------
    def save_checkpoint(self, step: int) -> None:
        """Starts writing ``global_step_<step>/actor`` in the background."""
        extra = {"global_step": step, "lr_step": step, "data_loader": self.train_loader.get_state()}
        snapshot = RoleSnapshot(
            self.learner,
            list(self.run.checkpoint.roles[ROLE].save_contents),
            extra,
            lora=self.spec.model.lora,
            base_model=self.spec.model.path,
        )
        self.checkpoints.save(step, {ROLE: snapshot})

    def resume(self) -> int:
        """Restores the checkpoint that ``trainer.resume_mode`` selects; returns its step."""
        checkpoint = self.run.checkpoint
        items = checkpoint.roles[ROLE].load_contents
        step, folder, _ = resume(checkpoint, {ROLE: (self.learner, items)}, self.train_loader)
        if folder is not None:
            print(f"jrl: resumed from {folder} at global step {step}", flush=True)
        return step

    # -- the loop -------------------------------------------------------------------------------
    def batches(self) -> Iterator[tuple[int, Batch]]:
        """(epoch, batch) from the data loader's position to the end of ``total_epochs`` epochs
        (the loop stops earlier at ``total_training_steps`` when set: verl's SFT loop ends at
        whichever comes first)."""
        return epochs_of(self.train_loader, self.run.cadence.total_epochs)

    def fit(self) -> dict[str, float]:
        """Train for the configured steps; returns the last step's metrics."""
        return fit(self, self.run.logging, self.created_at)

    def describe(self) -> str:
        """The resolved configuration, as printed at start-up."""
        return yaml_of(self.run.logging.tree)
