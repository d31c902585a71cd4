"""The PPO-family training loop in verl's step order.

generate -> reward -> old log-prob -> ref log-prob -> values -> advantages -> critic update ->
actor update (after ``critic_warmup``) -> validation (``test_freq``) -> metrics. Steps are 1-based;
validation before training is logged at step 0.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from jrl import algos
from jrl.batch import Batch
from jrl.config import n_gpus, to_yaml, uses_critic, uses_reference
from jrl.data.loader import DataLoader
from jrl.data.rl_dataset import create_rl_dataset
from jrl.data.tokenizer import load_tokenizer
from jrl.parallel import (
    any_process,
    barrier,
    batch_axes,
    gather_batch,
    host_batch,
    is_primary,
    make_mesh,
    score_per_process,
)
from jrl.parallel.devices import check_device
from jrl.reward.manager import load_reward_manager
from jrl.rollout import SamplingParams, log_prob_mismatch_metrics
from jrl.trainer.io.checkpoint import (
    CheckpointManager,
    RoleSnapshot,
    find_resume_dir,
    restore_role,
    step_of,
)
from jrl.trainer.io.metrics import (
    data_metrics,
    memory_metrics,
    mfu_metrics,
    throughput_metrics,
    timer,
)
from jrl.trainer.io.tracking import Tracking
from jrl.trainer.loop.stopping import StopRequest, check_losses_finite
from jrl.trainer.ppo.validation import select_val_generations, validation_metrics
from jrl.trainer.roles.critic import Critic
from jrl.trainer.roles.policy import Policy, build_rollout, lora_settings
from jrl.trainer.roles.reward_model import RewardModelScorer
from jrl.trainer.update.balance import balance_batch


def retention(trainer: Any) -> dict[str, int | None]:
    """Checkpoints to keep per role: ``max_actor_ckpt_to_keep`` / ``max_critic_ckpt_to_keep``
    (None: all), or 1 each with the deprecated ``remove_previous_ckpt_in_save``."""
    if trainer.remove_previous_ckpt_in_save:
        warnings.warn(
            "trainer.remove_previous_ckpt_in_save is deprecated; set "
            "trainer.max_actor_ckpt_to_keep=1 and trainer.max_critic_ckpt_to_keep=1 instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return {"actor": 1, "critic": 1}
    return {"actor": trainer.max_actor_ckpt_to_keep, "critic": trainer.max_critic_ckpt_to_keep}


def unsupported_keys(config: Any) -> list[str]:
    """Keys whose non-default values this version does not implement yet."""
    checks = {
        "actor_rollout_ref.model.lora_adapter_path": bool(
            config.actor_rollout_ref.model.get("lora_adapter_path")
        ),
        "critic.model.lora_rank": uses_critic(config) and config.critic.model.lora_rank > 0,
    }
    return [key for key, used in checks.items() if used]


class PPOTrainer:
    """Builds every role from the config and runs verl's fit loop."""

    def __init__(self, config: Any):
        self.created_at = time.perf_counter()
        check_device(config)
        missing = unsupported_keys(config)
        if missing:
            raise NotImplementedError(
                "these settings are not supported yet: " + ", ".join(missing) + "; reset them to "
                "their defaults"
            )
        self.config = config
        arr = config.actor_rollout_ref
        self.n_gpus = n_gpus(config)
        self.mesh = make_mesh(
            self.n_gpus,
            fsdp_size=arr.actor.fsdp_config.fsdp_size,
            sequence_parallel=arr.actor.ulysses_sequence_parallel_size,
        )
        self.use_critic = uses_critic(config)
        self.use_reference = uses_reference(config)
        tokenizer_key = "tokenizer_path" if arr.model.get("tokenizer_path") else "path"
        try:
            self.tokenizer = load_tokenizer(
                arr.model[tokenizer_key],
                trust_remote_code=arr.model.trust_remote_code,
                custom_chat_template=arr.model.get("custom_chat_template"),
            )
        except (FileNotFoundError, OSError) as err:
            raise FileNotFoundError(f"actor_rollout_ref.model.{tokenizer_key}: {err}") from err
        data = config.data
        self.train_dataset = create_rl_dataset(
            data.train_files, self.tokenizer, data, max_samples=data.train_max_samples
        )
        self.val_dataset = create_rl_dataset(
            data.val_files,
            self.tokenizer,
            data,
            max_samples=data.val_max_samples,
            config_key="data.val_files",
        )
        self.seed = int(data.seed if data.seed is not None else 0)
        self.train_loader = DataLoader(
            self.train_dataset, data.train_batch_size, shuffle=data.shuffle, seed=self.seed
        )
        self.total_training_steps = int(
            config.trainer.total_training_steps
            or len(self.train_loader) * config.trainer.total_epochs
        )
        self.actor = Policy.actor(config, self.mesh, self.total_training_steps)
        self.ref = Policy.reference(config, self.mesh, self.actor) if self.use_reference else None
        self.critic = (
            Critic(config, self.mesh, self.total_training_steps) if self.use_critic else None
        )
        self.rollout = build_rollout(config, self.actor, self.tokenizer)
        self.model_configs = {"actor": self.actor.state.model().config}
        if self.critic is not None:
            self.model_configs["critic"] = self.critic.state.model().config
        eos = self.rollout.eos_token_ids
        response_length = config.data.max_response_length
        self.sampling = SamplingParams.from_rollout_config(
            arr.rollout,
            response_length=response_length,
            eos_token_ids=eos,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        self.val_sampling = SamplingParams.from_rollout_config(
            arr.rollout,
            response_length=response_length,
            eos_token_ids=eos,
            pad_token_id=self.tokenizer.pad_token_id,
            validate=True,
        )
        self.reward_model = (
            RewardModelScorer(config, self.mesh, self.tokenizer)
            if config.reward_model.enable
            else None
        )
        self.reward_fn = load_reward_manager(config, self.tokenizer, num_examine=0)
        self.val_reward_fn = load_reward_manager(config, self.tokenizer, num_examine=1)
        self.kl_ctrl = (
            algos.get_kl_controller(config.algorithm.kl_ctrl)
            if config.algorithm.use_kl_in_reward
            else None
        )
        self.rng = jax.random.key(self.seed)
        self.val_generations: list[dict[str, Any]] = []
        self.checkpoints = CheckpointManager(
            config.trainer.default_local_dir,
            max_to_keep=retention(config.trainer),
            remote_dir=config.trainer.get("default_hdfs_dir"),
            tokenizer=self.tokenizer,
        )

    # -- one training step ------------------------------------------------------------------
    def generate(self, prompts: Batch, step: int) -> Batch:
        """Rollout `n` responses per prompt (interleaved), with a key derived from the step."""
        key = jax.random.fold_in(jax.random.fold_in(self.rng, 0), step)
        return self.rollout.generate(prompts, self.sampling, key)

    def compute_advantage(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """In-reward KL (or a copy of the scores), then the configured advantage estimator."""
        algo = self.config.algorithm
        t = batch.tensors
        metrics: dict[str, float] = {}
        if self.kl_ctrl is not None:
            rewards, metrics = algos.apply_kl_penalty(
                t["token_level_scores"],
                t["old_log_probs"],
                t["ref_log_prob"],
                t["response_mask"],
                self.kl_ctrl,
                kl_penalty=algo.kl_penalty,
            )
        else:
            rewards = t["token_level_scores"]
        advantages, returns = algos.compute_advantage(
            algo.adv_estimator,
            token_level_rewards=rewards,
            response_mask=t["response_mask"],
            config=algo,
            index=batch.meta["uid"],
            values=t.get("values"),
            reward_baselines=t.get("reward_baselines"),
            gamma=algo.gamma,
            lam=algo.lam,
            norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
        )
        new = {
            "token_level_rewards": np.asarray(rewards),
            "advantages": np.asarray(advantages),
            "returns": np.asarray(returns),
        }
        return batch.union(Batch(new)), {k: float(v) for k, v in metrics.items()}

    def make_experience(
        self, prompts: Batch, step: int, metrics: dict[str, float], timing: dict[str, float]
    ) -> Batch:
        """Generate, score, and add old/ref log-probs, values and advantages (steps 1-8 of verl)."""
        config = self.config
        prompts = gather_batch(prompts)
        uids = np.array([f"{step}-{i}" for i in range(len(prompts))], dtype=object)
        prompts = prompts.union(Batch(meta={"uid": uids}))
        with timer("gen", timing):
            batch = host_batch(self.generate(prompts, step))
        metrics.update(getattr(self.rollout, "last_stats", {}))
        if config.algorithm.adv_estimator == "remax":
            with timer("gen_max", timing):
                baselines = self.greedy_baselines(prompts)
                batch = batch.union(Batch({"reward_baselines": baselines}))
        if config.trainer.balance_batch:
            dp_size = int(np.prod([self.mesh.shape[axis] for axis in batch_axes()]))
            batch, balance = balance_batch(batch, dp_size)
            metrics.update(balance)
        with timer("reward", timing):
            if self.reward_model is not None:
                batch = batch.union(Batch({"rm_scores": self.reward_model.rm_scores(batch)}))
            reward = score_per_process(self.reward_fn, batch)
            batch = batch.union(Batch({"token_level_scores": reward["reward_tensor"]}))
        with timer("old_log_prob", timing):
            old_log_probs, entropy = self.actor.compute_log_prob(batch, calculate_entropy=True)
            batch = batch.union(Batch({"old_log_probs": old_log_probs}))
            if "rollout_log_probs" in batch.tensors:
                metrics.update(
                    log_prob_mismatch_metrics(
                        batch.tensors["rollout_log_probs"],
                        np.asarray(old_log_probs),
                        batch.tensors["response_mask"],
                    )
                )
            metrics["actor/entropy"] = float(
                algos.agg_loss(
                    entropy,
                    batch.tensors["response_mask"],
                    config.actor_rollout_ref.actor.loss_agg_mode,
                )
            )
        if self.ref is not None:
            with timer("ref", timing):
                ref_log_prob, _ = self.ref.compute_log_prob(batch)
                batch = batch.union(Batch({"ref_log_prob": ref_log_prob}))
        if self.critic is not None:
            with timer("values", timing):
                batch = batch.union(Batch({"values": self.critic.compute_values(batch)}))
        with timer("adv", timing):
            batch, kl_metrics = self.compute_advantage(batch)
            metrics.update(kl_metrics)
            batch, is_metrics = self.rollout_correction(batch)
            metrics.update(is_metrics)
        return batch

    def greedy_baselines(self, prompts: Batch) -> np.ndarray:
        """ReMax's baseline: the score of one greedy answer per prompt, repeated for its n rows."""
        greedy = dataclasses.replace(self.sampling, do_sample=False, n=1)
        batch = host_batch(self.rollout.generate(prompts, greedy, self.rng))
        scores = score_per_process(self.reward_fn, batch)["reward_tensor"].sum(-1)
        return np.repeat(scores, self.sampling.n)

    def rollout_correction(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Rollout importance sampling (``algorithm.rollout_is*``): mismatch metrics, and with
        ``rollout_is`` the per-token weights that the policy loss multiplies by. Mask mode and the
        veto zero the weights of rejected tokens/rows (verl 0.6); response_mask is unchanged."""
        t = batch.tensors
        weights, kept, metrics = algos.rollout_importance_sampling(
            self.config.algorithm,
            t["old_log_probs"],
            t.get("rollout_log_probs"),
            t["response_mask"],
        )
        if weights is None:
            return batch, metrics
        weights = np.asarray(weights, np.float32) * np.asarray(kept, np.float32)
        return batch.union(Batch({"rollout_is_weights": weights})), metrics

    def train_step(self, prompts: Batch, step: int, epoch: int) -> dict[str, float]:
        """One PPO step on a batch of prompts; returns its metrics."""
        config = self.config
        metrics: dict[str, float] = {}
        timing: dict[str, float] = {}
        with timer("step", timing):
            batch = self.make_experience(prompts, step, metrics, timing)
            if self.critic is not None:
                with timer("update_critic", timing):
                    metrics.update(self.critic.update(batch, step))
            if config.trainer.critic_warmup <= step:
                with timer("update_actor", timing):
                    metrics.update(self.actor.update(batch, step))
                with timer("update_weights", timing):
                    self.rollout.update_weights(self.actor.state.params)
            check_losses_finite(metrics, step, self.checkpoints.latest)
            last_step = step >= self.total_training_steps
            freq = config.trainer.test_freq
            if freq > 0 and (last_step or step % freq == 0):
                with timer("testing", timing):
                    metrics.update(self.validate(step))
            if self.saves_at(step):
                with timer("save_checkpoint", timing):
                    self.save_checkpoint(step)
        metrics.update(data_metrics(batch, self.use_critic))
        metrics.update({f"timing_s/{k}": v for k, v in timing.items()})
        metrics.update(throughput_metrics(batch, timing, self.n_gpus))
        metrics.update(self.mfu(batch, timing))
        metrics.update(memory_metrics())
        metrics.update({"training/global_step": step, "training/epoch": epoch})
        return metrics

    def mfu(self, batch: Batch, timing: dict[str, float]) -> dict[str, float]:
        """``perf/mfu/actor`` (and ``/critic``) of this step's updates (none on CPU)."""
        seqlens = np.asarray(batch.tensors["attention_mask"]).sum(-1)
        out: dict[str, float] = {}
        sections = {"actor": self.config.actor_rollout_ref.actor, "critic": self.config.critic}
        for role, model_config in self.model_configs.items():
            seconds = timing.get(f"update_{role}")
            if seconds:
                out.update(
                    mfu_metrics(
                        model_config,
                        seqlens,
                        seconds,
                        epochs=sections[role].ppo_epochs,
                        world_size=self.n_gpus,
                        role=role,
                    )
                )
        return out

    def validate(self, step: int) -> dict[str, float]:
        """Greedy (val_kwargs) generation on the validation set, scored per data source, with
        verl's ``val-core``/``val-aux`` metrics; keeps ``log_val_generations`` samples in
        `val_generations`."""
        loader = DataLoader(
            self.val_dataset,
            len(self.val_dataset),
            shuffle=self.config.data.validation_shuffle,
            seed=self.seed,
            drop_last=False,
        )
        prompts = gather_batch(next(iter(loader.epoch(0))))
        styles = {(info or {}).get("style") for info in prompts.meta.get("reward_model", [])}
        if self.reward_model is not None and "model" in styles:
            return {}  # as verl: validation scores rule-based rows only
        uids = np.array([f"val-{i}" for i in range(len(prompts))], dtype=object)
        prompts = prompts.union(Batch(meta={"uid": uids}))
        key = jax.random.fold_in(self.rng, 1)
        batch = host_batch(self.rollout.generate(prompts, self.val_sampling, key))
        reward = score_per_process(self.val_reward_fn, batch)
        scores = reward["reward_tensor"].sum(-1)
        infos = {**reward["reward_extra_info"], "reward": scores.tolist()}
        sources = batch.meta.get("data_source", np.full(len(batch), "unknown", dtype=object))
        count = int(self.config.trainer.log_val_generations)
        if count:
            decode = functools.partial(self.tokenizer.batch_decode, skip_special_tokens=True)
            self.val_generations = select_val_generations(
                decode(batch.tensors["prompts"]),
                decode(batch.tensors["responses"]),
                scores.tolist(),
                step,
                count,
            )
        return validation_metrics(sources, batch.meta["uid"], infos)

    # -- checkpoints ------------------------------------------------------------------------------
    def saves_at(self, step: int) -> bool:
        """verl's rule: ``save_freq`` > 0 and the step is a multiple of it or the last one."""
        freq = self.config.trainer.save_freq
        return freq > 0 and (step >= self.total_training_steps or step % freq == 0)

    def save_checkpoint(self, step: int) -> None:
        """Starts writing ``global_step_<step>`` (actor, critic) in the background."""
        arr = self.config.actor_rollout_ref
        actor_extra = {
            "global_step": step,
            "lr_step": step,
            "rng_key": np.asarray(jax.random.key_data(self.rng)).tolist(),
            "data_loader": self.train_loader.get_state(),
            "kl_coef": None if self.kl_ctrl is None else self.kl_ctrl.value,
        }
        roles = {
            "actor": RoleSnapshot(
                self.actor.state,
                list(arr.actor.checkpoint.save_contents),
                actor_extra,
                lora=lora_settings(arr.model),
            )
        }
        if self.critic is not None:
            roles["critic"] = RoleSnapshot(
                self.critic.state,
                list(self.config.critic.checkpoint.save_contents),
                {"global_step": step, "lr_step": step},
                kind="value",
            )
        self.checkpoints.save(step, roles)

    def load_checkpoint(self) -> int:
        """Restores the checkpoint that ``trainer.resume_mode`` selects; returns its global step
        (0 when training starts from scratch)."""
        config = self.config
        roles = ["actor"] + (["critic"] if self.critic is not None else [])
        folder = find_resume_dir(config.trainer, roles)
        if folder is None:
            return 0
        step = step_of(folder)
        arr = config.actor_rollout_ref
        actor_items = arr.actor.checkpoint.load_contents
        extra = restore_role(folder / "actor", self.actor.state, actor_items)
        if self.critic is not None:
            critic_items = config.critic.checkpoint.load_contents
            restore_role(folder / "critic", self.critic.state, critic_items)
        if extra:
            if extra.get("global_step") != step:
                raise ValueError(
                    f"{folder}/actor/extra records global step {extra.get('global_step')}, not "
                    f"{step}; the folder was renamed or mixed with another checkpoint"
                )
            self.rng = jax.random.wrap_key_data(jnp.asarray(extra["rng_key"], jnp.uint32))
            self.train_loader.set_state(extra["data_loader"])
            if self.kl_ctrl is not None and extra.get("kl_coef") is not None:
                self.kl_ctrl.value = float(extra["kl_coef"])
        else:  # one batch per step: the position follows from the step
            batches = len(self.train_loader)
            self.train_loader.set_state({"epoch": step // batches, "position": step % batches})
        if self.ref is not None and lora_settings(arr.model) is not None:
            self.ref = Policy.reference(config, self.mesh, self.actor)
        self.rollout.update_weights(self.actor.state.params)
        if config.trainer.del_local_ckpt_after_load:
            barrier("jrl.restored")
            if is_primary():
                shutil.rmtree(folder)
        print(f"jrl: resumed from {folder} at global step {step}", flush=True)
        return step

    # -- the loop -------------------------------------------------------------------------------
    def batches(self) -> Iterator[tuple[int, Batch]]:
        """(epoch, prompts) for the rest of training, from the data loader's position."""
        first_epoch = self.train_loader.get_state()["epoch"]
        for epoch in range(first_epoch, int(self.config.trainer.total_epochs) or 1):
            for prompts in self.train_loader.epoch(epoch):
                yield epoch, prompts

    def stop_after(self, step: int, reason: str) -> None:
        """Ends a run early: makes sure `step` is checkpointed and the save is complete."""
        if not self.saves_at(step):
            self.save_checkpoint(step)
        self.checkpoints.wait()
        print(
            f"jrl: stopped after step {step} on {reason}; checkpoint: {self.checkpoints.latest()}",
            flush=True,
        )

    def fit(self) -> dict[str, float]:
        """Train for `total_training_steps`; returns the last step's metrics."""
        trainer = self.config.trainer
        run_dir = Path(trainer.default_local_dir)
        tracking = Tracking(
            trainer.logger,
            project=trainer.project_name,
            experiment=trainer.experiment_name,
            run_dir=run_dir,
            config=self.config.to_dict(),
        )
        last: dict[str, float] = {}
        try:
            start = self.load_checkpoint()
            if trainer.val_before_train:
                last = self.validate(start)
                self.log(tracking, last, start)
                if trainer.val_only:
                    return last
            step = start + 1
            if step > self.total_training_steps:
                return last
            progress = tqdm(
                total=self.total_training_steps,
                initial=start,
                desc="Training Progress",
                unit="step",
            )
            with StopRequest() as stop:
                for epoch, prompts in self.batches():
                    last = self.train_step(prompts, step, epoch)
                    self.log(tracking, last, step)
                    progress.update(1)
                    if step == start + 1:
                        elapsed = time.perf_counter() - self.created_at
                        print(f"jrl: time to first step: {elapsed:.1f}s", flush=True)
                    if step >= self.total_training_steps:
                        break
                    if any_process(stop.requested):
                        self.stop_after(step, stop.signal_name or "a signal to another process")
                        break
                    step += 1
            progress.close()
            return last
        finally:
            tracking.close()
            self.checkpoints.close()

    def log(self, tracking: Tracking, metrics: dict[str, float], step: int) -> None:
        """One step's metrics, and the validation samples kept since the last call."""
        tracking.log(metrics, step=step)
        tracking.log_generations(self.val_generations, step)
        self.val_generations = []

    def describe(self) -> str:
        """The resolved configuration, as printed at start-up."""
        return to_yaml(self.config)
