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

import functools
import itertools
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from jrl.batch import Batch
from jrl.config import to_yaml
from jrl.data.loader import DataLoader
from jrl.data.sft_dataset import create_sft_dataset
from jrl.data.tokenizer import load_tokenizer
from jrl.models import LoRAParam, apply_lora, from_pretrained
from jrl.models.decoder import set_memory_options
from jrl.parallel import batch_sharding, make_mesh
from jrl.parallel.devices import check_device
from jrl.trainer.io.checkpoint import (
    CheckpointManager,
    RoleSnapshot,
    find_resume_dir,
    restore_role,
    step_of,
)
from jrl.trainer.io.tracking import Tracking
from jrl.trainer.loop.stopping import StopRequest, check_losses_finite
from jrl.trainer.roles.policy import compute_dtype, lora_settings, memory_options
from jrl.trainer.sft.loss import row_nll, sft_loss, sft_tensors
from jrl.trainer.update.batching import forward_pass
from jrl.trainer.update.learner import TrainState
from jrl.trainer.update.optim import make_sft_optimizer, sft_lr
from jrl.trainer.update.packing import packing_plan

ROLE = "actor"
STRATEGIES = ("fsdp", "fsdp2")


def warn_offload(fsdp_cfg: Any) -> None:
    """``cpu_offload`` / ``offload_params`` are accepted; parameters and optimizer state stay in
    device memory (FSDP-sharded), which a warning says."""
    asked = [k for k in ("cpu_offload", "offload_params") if fsdp_cfg.get(k)]
    if asked:
        warnings.warn(
            f"model.fsdp_config.{' and .'.join(asked)}: parameters and optimizer state stay in "
            f"device memory ({jax.default_backend()}), sharded over the devices; enable "
            "model.enable_gradient_checkpointing to save activation memory instead",
            stacklevel=2,
        )


def load_sft_model(config: Any, mesh: Any) -> tuple[Any, Any]:
    """The model of ``model.partial_pretrain`` on the mesh (``fsdp_config.model_dtype`` parameters,
    ``fsdp_config.dtype`` compute, gradient checkpointing, LoRA) and the filter of its trained
    parameters."""
    model_cfg = config.model
    fsdp = model_cfg.fsdp_config
    model = from_pretrained(
        model_cfg.partial_pretrain,
        dtype=compute_dtype(fsdp.dtype),
        param_dtype=compute_dtype(fsdp.model_dtype),
        mesh=mesh,
        trust_remote_code=bool(model_cfg.trust_remote_code),
        external_lib=model_cfg.external_lib,
    )
    set_memory_options(model, **memory_options(model_cfg))
    lora = lora_settings(model_cfg)
    if lora is None:
        return model, nnx.Param
    try:
        apply_lora(model, seed=int(config.trainer.seed), **lora)
    except ValueError as err:
        raise ValueError(f"model: {err}") from err
    return model, LoRAParam


class SFTTrainer:
    """Builds the model, data and optimizer from an SFT config and runs the fit loop."""

    def __init__(self, config: Any):
        self.created_at = time.perf_counter()
        check_device(config)
        if config.ulysses_sequence_parallel_size > 1:
            raise NotImplementedError(
                "ulysses_sequence_parallel_size > 1 is not supported yet; set it to 1"
            )
        if config.model.strategy not in STRATEGIES:
            raise ValueError(
                f"model.strategy={config.model.strategy!r} is not supported; use fsdp or fsdp2"
            )
        warn_offload(config.model.fsdp_config)
        self.config = config
        data, trainer = config.data, config.trainer
        self.world = trainer.nnodes * trainer.n_gpus_per_node
        self.mesh = make_mesh(self.world)
        try:
            self.tokenizer = load_tokenizer(
                config.model.partial_pretrain,
                trust_remote_code=config.model.trust_remote_code,
                custom_chat_template=data.chat_template,
            )
        except (FileNotFoundError, OSError) as err:
            raise FileNotFoundError(f"model.partial_pretrain: {err}") from err
        self.train_dataset = create_sft_dataset(
            data.train_files, self.tokenizer, data, data.train_max_samples
        )
        self.val_dataset = create_sft_dataset(
            data.val_files,
            self.tokenizer,
            data,
            data.val_max_samples,
            config_key="data.val_files",
        )
        self.train_loader = DataLoader(
            self.train_dataset, data.train_batch_size, shuffle=True, seed=int(trainer.seed)
        )
        self.total_steps = int(
            trainer.total_training_steps or len(self.train_loader) * trainer.total_epochs
        )
        micro = data.micro_batch_size_per_gpu or data.micro_batch_size // self.world
        self.micro_rows = self.world * micro
        model, trainable = load_sft_model(config, self.mesh)
        self.state = TrainState.create(
            model, make_sft_optimizer(config.optim), self.mesh, trainable
        )
        self.impl = "auto" if config.model.use_liger else "naive"
        self.packed = bool(config.use_remove_padding)
        rows = batch_sharding(self.mesh, 1)
        self._val_forward = jax.jit(
            self._val_fn,
            static_argnums=2,
            in_shardings=(self.state.param_shardings, rows),
            out_shardings=rows,
        )
        self.checkpoints = CheckpointManager(
            trainer.default_local_dir,
            max_to_keep={ROLE: trainer.max_ckpt_to_keep},
            remote_dir=trainer.default_hdfs_dir,
            tokenizer=self.tokenizer,
        )

    def _val_fn(self, params: Any, tensors: dict[str, jax.Array], packing: Any) -> jax.Array:
        model = nnx.merge(self.state.graphdef, params)
        return row_nll(model, tensors, self.impl, packing)

    # -- steps ----------------------------------------------------------------------------------
    def train_step(self, batch: Batch, step: int) -> dict[str, float]:
        """One optimizer step on a batch of rows; returns its metrics."""
        start = time.perf_counter()
        lr = sft_lr(self.config.optim, step - 1, self.total_steps)
        history = self.state.train(
            functools.partial(sft_loss, impl=self.impl),
            sft_tensors(batch),
            variant="sft",
            grad_clip=float(self.config.optim.clip_grad),
            mini_rows=len(batch),
            epochs=1,
            lr=lr,
            micro_rows=self.micro_rows,
            packing=packing_plan(self.micro_rows, self.mesh, self.packed),
        )
        return {
            "train/loss": history["loss"][0],
            "train/lr(1e-3)": lr * 1e3,
            "train/grad_norm": history["grad_norm"][0],
            "train/skipped": history["skipped"][0],
            "train/time(s)": time.perf_counter() - start,
        }

    def validate(self) -> dict[str, float]:
        """``val/loss``: the cross-entropy of every trained token of the validation files."""
        loader = DataLoader(
            self.val_dataset, len(self.val_dataset), shuffle=False, seed=0, drop_last=False
        )
        tensors = sft_tensors(next(iter(loader.epoch(0))))
        nll = forward_pass(
            functools.partial(self._val_forward, self.state.params),
            tensors,
            self.mesh,
            rows=self.micro_rows,
            remove_padding=self.packed,
        )
        tokens = float(tensors["response_mask"].sum())
        return {"val/loss": float(np.sum(nll)) / max(tokens, 1.0)}

    # -- checkpoints ----------------------------------------------------------------------------
    def saves_at(self, step: int) -> bool:
        """verl's SFT rule: every ``save_freq`` steps (when > 0) and after the last step."""
        freq = self.config.trainer.save_freq
        return step >= self.total_steps or (freq > 0 and step % freq == 0)

    def validates_at(self, step: int) -> bool:
        """Every ``test_freq`` steps (when > 0) and after the last step."""
        freq = self.config.trainer.test_freq
        return step >= self.total_steps or (freq > 0 and step % freq == 0)

    def save_checkpoint(self, step: int) -> None:
        """Starts writing ``global_step_<step>/actor`` in the background."""
        extra = {"global_step": step, "lr_step": step, "data_loader": self.train_loader.get_state()}
        snapshot = RoleSnapshot(
            self.state,
            list(self.config.trainer.checkpoint.save_contents),
            extra,
            lora=lora_settings(self.config.model),
        )
        self.checkpoints.save(step, {ROLE: snapshot})

    def load_checkpoint(self) -> int:
        """Restores the checkpoint that ``trainer.resume_mode`` selects; returns its step."""
        folder = find_resume_dir(self.config.trainer, [ROLE])
        if folder is None:
            return 0
        step = step_of(folder)
        items = self.config.trainer.checkpoint.load_contents
        extra = restore_role(folder / ROLE, self.state, items)
        if extra:
            self.train_loader.set_state(extra["data_loader"])
        else:  # one batch per step: the position follows from the step
            batches = len(self.train_loader)
            self.train_loader.set_state({"epoch": step // batches, "position": step % batches})
        print(f"jrl: resumed from {folder} at global step {step}", flush=True)
        return step

    # -- the loop -------------------------------------------------------------------------------
    def batches(self) -> Iterator[Batch]:
        """Batches from the data loader's position on, epoch after epoch (the loop stops at the
        last step: ``total_training_steps`` when set, else ``total_epochs`` epochs)."""
        for epoch in itertools.count(self.train_loader.get_state()["epoch"]):
            yield from self.train_loader.epoch(epoch)

    def fit(self) -> dict[str, float]:
        """Train for the configured steps; returns the last step's metrics."""
        trainer = self.config.trainer
        tracking = Tracking(
            trainer.logger,
            project=trainer.project_name,
            experiment=trainer.experiment_name,
            run_dir=Path(trainer.default_local_dir),
            config=self.config.to_dict(),
        )
        last: dict[str, float] = {}
        try:
            step = self.load_checkpoint()
            if step >= self.total_steps:
                return last
            progress = tqdm(total=self.total_steps, initial=step, desc="SFT", unit="step")
            with StopRequest() as stop:
                for batch in self.batches():
                    step += 1
                    last = self.train_step(batch, step)
                    check_losses_finite(last, step, self.checkpoints.latest)
                    if self.validates_at(step):
                        last.update(self.validate())
                    if self.saves_at(step):
                        self.save_checkpoint(step)
                    tracking.log(last, step=step)
                    progress.update(1)
                    if step == 1 or step == self.total_steps:
                        elapsed = time.perf_counter() - self.created_at
                        print(f"jrl: step {step} done after {elapsed:.1f}s", flush=True)
                    if step >= self.total_steps:
                        break
                    if stop.requested:
                        if not self.saves_at(step):
                            self.save_checkpoint(step)
                        print(
                            f"jrl: stopped after step {step} on {stop.signal_name}; checkpoint: "
                            f"{self.checkpoints.latest()}",
                            flush=True,
                        )
                        break
            progress.close()
            return last
        finally:
            tracking.close()
            self.checkpoints.close()

    def describe(self) -> str:
        """The resolved configuration, as printed at start-up."""
        return to_yaml(self.config)
